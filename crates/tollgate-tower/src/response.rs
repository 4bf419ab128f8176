//! Responses the layer writes itself: limited (429 or gRPC 8), store down
//! (503 or gRPC 14), missing key, and cost too high.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::headers::RateLimitHeaders;
use crate::RateLimitInfo;

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// A closure building the response to a limited request.
pub(crate) type LimitedFn = Arc<dyn Fn(&RateLimitInfo) -> Response<Bytes> + Send + Sync>;

/// The body of limited HTTP responses.
#[derive(Clone, Default)]
pub(crate) enum LimitedBody {
    #[default]
    PlainText,
    ProblemJson,
    Custom(LimitedFn),
}

impl std::fmt::Debug for LimitedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PlainText => f.write_str("PlainText"),
            Self::ProblemJson => f.write_str("ProblemJson"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// The content type of a gRPC request (`application/grpc`, `application/grpc+proto`, ...), if it is one.
pub(crate) fn grpc_content_type(headers: &http::HeaderMap) -> Option<HeaderValue> {
    let value = headers.get(CONTENT_TYPE)?;
    value
        .as_bytes()
        .get(..16)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"application/grpc"))
        .then(|| value.clone())
}

/// The gRPC code for an HTTP status the layer answers with.
fn grpc_code(status: StatusCode) -> u16 {
    match status.as_u16() {
        400 => 3,  // INVALID_ARGUMENT
        401 => 16, // UNAUTHENTICATED
        403 => 7,  // PERMISSION_DENIED
        404 => 5,  // NOT_FOUND
        429 => 8,  // RESOURCE_EXHAUSTED
        500 => 13, // INTERNAL
        501 => 12, // UNIMPLEMENTED
        503 => 14, // UNAVAILABLE
        504 => 4,  // DEADLINE_EXCEEDED
        _ => 2,    // UNKNOWN
    }
}

/// Percent-encodes a `grpc-message` as the gRPC spec asks.
fn grpc_message(message: &str) -> HeaderValue {
    let mut out = String::with_capacity(message.len());
    for byte in message.trim_end().bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    // Only visible ASCII remains, which is always a valid header value.
    HeaderValue::from_str(&out).unwrap_or(HeaderValue::from_static("rate limited"))
}

/// A trailers-only gRPC response: HTTP 200 with the status in the headers.
fn grpc(content_type: HeaderValue, status: StatusCode, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type);
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(grpc_code(status)));
    headers.insert(GRPC_MESSAGE.clone(), grpc_message(message));
    response
}

fn text(status: StatusCode, message: impl Into<Bytes>) -> Response<Bytes> {
    let mut response = Response::new(message.into());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// An HTTP or gRPC response with `status` and `message`.
pub(crate) fn plain(
    grpc_type: Option<HeaderValue>,
    status: StatusCode,
    message: &str,
) -> Response<Bytes> {
    match grpc_type {
        Some(content_type) => grpc(content_type, status, message),
        None => text(status, Bytes::copy_from_slice(message.as_bytes())),
    }
}

fn limited_message(info: &RateLimitInfo) -> String {
    let mut message = format!(
        "Too many requests: rate limit \"{}\" exceeded",
        info.binding_policy()
    );
    if let Some(secs) = info.retry_after_secs() {
        let unit = if secs == 1 { "second" } else { "seconds" };
        let _ = write!(message, "; retry in {secs} {unit}");
    }
    message.push_str(".\n");
    message
}

/// The response to a limited request, with its headers.
pub(crate) fn limited(
    body: &LimitedBody,
    grpc_type: Option<HeaderValue>,
    info: &RateLimitInfo,
    headers: RateLimitHeaders,
) -> Response<Bytes> {
    let mut response = match (grpc_type, body) {
        (Some(content_type), _) => {
            let mut response = grpc(
                content_type,
                StatusCode::TOO_MANY_REQUESTS,
                &limited_message(info),
            );
            if let Some(retry) = info.retry_after() {
                let millis = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX);
                response
                    .headers_mut()
                    .insert(GRPC_RETRY_PUSHBACK_MS.clone(), HeaderValue::from(millis));
            }
            response
        }
        (None, LimitedBody::PlainText) => {
            text(StatusCode::TOO_MANY_REQUESTS, limited_message(info))
        }
        (None, LimitedBody::ProblemJson) => {
            let mut response = Response::new(Bytes::from(problem_json(info)));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
            response
        }
        (None, LimitedBody::Custom(build)) => build(info),
    };
    headers.apply(response.headers_mut());
    response
}

/// An RFC 9457 problem document. Policy names are ASCII letters, digits,
/// `_`, `-` and `.`, so they need no JSON escaping.
fn problem_json(info: &RateLimitInfo) -> String {
    let policy = info.binding_policy();
    let mut json =
        String::from(r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"#);
    let detail = limited_message(info);
    let _ = write!(
        json,
        "\"{}\",\"policy\":\"{policy}\"",
        detail.trim_end().replace('"', "\\\"")
    );
    if let Some(secs) = info.retry_after_secs() {
        let _ = write!(json, ",\"retry_after\":{secs}");
    }
    json.push('}');
    json
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tollgate_core::{Decision, Policy, Verdict};

    fn info() -> RateLimitInfo {
        let policy = Policy::per_second(1).name("api").build().unwrap();
        let verdict = Verdict::from_iter([Decision::denied(
            1,
            0,
            Duration::from_millis(1500),
            Duration::from_secs(2),
        )]);
        RateLimitInfo::new("k", "default", vec![policy].into(), verdict, false)
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_message("50% off\n"), "50%25 off");
        assert_eq!(grpc_message("caf\u{e9}"), "caf%C3%A9");
    }

    #[test]
    fn grpc_detection() {
        let mut headers = http::HeaderMap::new();
        assert!(grpc_content_type(&headers).is_none());
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(grpc_content_type(&headers).is_some());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(grpc_content_type(&headers).is_none());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/gr"));
        assert!(grpc_content_type(&headers).is_none());
    }

    #[test]
    fn problem_json_is_json() {
        let json = problem_json(&info());
        assert_eq!(
            json,
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Too many requests: rate limit \"api\" exceeded; retry in 2 seconds.","policy":"api","retry_after":2}"#
        );
    }

    #[test]
    fn grpc_limited_response() {
        let response = limited(
            &LimitedBody::PlainText,
            Some(HeaderValue::from_static("application/grpc")),
            &info(),
            RateLimitHeaders::default(),
        );
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[&GRPC_STATUS], "8");
        assert_eq!(response.headers()[&GRPC_RETRY_PUSHBACK_MS], "1500");
        assert!(response.body().is_empty());
    }
}
