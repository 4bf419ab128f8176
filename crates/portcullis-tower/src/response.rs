//! Responses both layers write themselves: limited by a rate (429 or gRPC
//! 8) or by a concurrency limit, store down (503 or gRPC 14), no room for a
//! new subject, missing key, cost too high, and the 500 of a future that
//! lost its request. Headers of limited responses are `headers.rs`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::breaker::UndecidedLog;
use crate::headers::{ceil_secs, RateLimitHeaders};
use crate::info::RateLimitInfo;
use crate::key::KeyExtractor;

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
#[cfg(not(feature = "tonic"))]
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

/// What the gRPC spec percent-encodes in `grpc-message`: bytes outside
/// visible ASCII and space, and `%` itself.
#[cfg(not(feature = "tonic"))]
const GRPC_MESSAGE_SET: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// Percent-encodes a `grpc-message` as the gRPC spec asks.
#[cfg(not(feature = "tonic"))]
fn grpc_message(message: &str) -> HeaderValue {
    let encoded: std::borrow::Cow<'_, str> =
        percent_encoding::utf8_percent_encode(message.trim_end(), GRPC_MESSAGE_SET).into();
    // Only visible ASCII remains, which is always a valid header value.
    HeaderValue::from_str(&encoded).unwrap_or(HeaderValue::from_static("rate limited"))
}

/// A trailers-only gRPC response: HTTP 200 with the status in the headers.
#[cfg(not(feature = "tonic"))]
fn grpc(content_type: HeaderValue, status: StatusCode, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type);
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(grpc_code(status)));
    headers.insert(GRPC_MESSAGE.clone(), grpc_message(message));
    response
}

/// A trailers-only gRPC response: HTTP 200 with the status in the headers,
/// written by `tonic::Status` (which percent-encodes the message).
#[cfg(feature = "tonic")]
fn grpc(content_type: HeaderValue, status: StatusCode, message: &str) -> Response<Bytes> {
    let code = tonic::Code::from_i32(i32::from(grpc_code(status)));
    grpc_status(content_type, &tonic::Status::new(code, message.trim_end()))
}

/// The trailers-only response carrying `status` (code, message, details).
#[cfg(feature = "tonic")]
fn grpc_status(content_type: HeaderValue, status: &tonic::Status) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type);
    if status.add_header(headers).is_err() {
        // Only a message or details that are not valid header values fail
        // (tonic encodes both, so this is not expected): keep the code.
        headers.insert(GRPC_STATUS.clone(), HeaderValue::from(status.code() as i32));
    }
    response
}

/// A limited gRPC request's status: `RESOURCE_EXHAUSTED` with
/// `google.rpc.RetryInfo` (when to retry) and `google.rpc.QuotaFailure`
/// (the binding policy as subject) in `grpc-status-details-bin`.
#[cfg(feature = "tonic")]
fn grpc_limited(content_type: HeaderValue, info: &RateLimitInfo, message: &str) -> Response<Bytes> {
    use tonic_types::{ErrorDetails, StatusExt};
    let mut details = ErrorDetails::with_retry_info(info.retry_after());
    let policy = info.binding_policy();
    let limit = info
        .policies()
        .iter()
        .find(|p| p.name() == policy)
        .map(|p| format!("limit of {} per {:?} exceeded", p.limit(), p.period()));
    details.add_quota_failure_violation(
        policy,
        limit.unwrap_or_else(|| "rate limit exceeded".to_owned()),
    );
    let status = tonic::Status::with_error_details(
        tonic::Code::ResourceExhausted,
        message.trim_end(),
        details,
    );
    grpc_status(content_type, &status)
}

#[cfg(not(feature = "tonic"))]
fn grpc_limited(
    content_type: HeaderValue,
    _info: &RateLimitInfo,
    message: &str,
) -> Response<Bytes> {
    grpc(content_type, StatusCode::TOO_MANY_REQUESTS, message)
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

/// The body of a request the store refused to check as sent
/// ([`ErrorScope::Request`](portcullis_core::ErrorScope::Request)): what
/// the client can act on, never the store's detail (that goes to the log).
pub(crate) fn refused_message(error: &portcullis_core::StoreError) -> &'static str {
    match error {
        portcullis_core::StoreError::CostTooHigh { .. } => {
            "this request costs more than the rate limit ever allows: send a smaller one\n"
        }
        portcullis_core::StoreError::Unsupported {
            operation: "idempotency key",
            ..
        } => "this request's idempotency key cannot be used: send 1 to 1024 bytes\n",
        // (The bound in that text is core's, checked below.)
        _ => "this request could not be checked against the rate limit as sent\n",
    }
}

// `refused_message` names the key length core accepts.
const _: () = assert!(portcullis_core::MAX_IDEMPOTENCY_KEY_LEN == 1024);

/// The default answer of a layer keyed by `key` to a request without a
/// key: what it lacks, in the extractor's words.
pub(crate) fn missing_key_message<K: KeyExtractor + ?Sized>(key: &K) -> String {
    format!(
        "this request carries no {}, which the rate limiter needs to tell callers apart\n",
        key.describe()
    )
}

/// Counts a request without a key that was rejected, and logs at most
/// once per second (with the count since the last line) what the layer
/// answered, what it looks for and, for the operator, why requests may
/// lack it. Both layers call this.
pub(crate) fn log_missing_key<K: KeyExtractor + ?Sized>(
    log: &UndecidedLog,
    key: &K,
    status: StatusCode,
    grpc: bool,
) {
    tracing::debug!(%status, grpc, "no rate-limit key; rejected");
    let Some(count) = log.record() else {
        return;
    };
    let answer = if grpc {
        format!("gRPC status {}", grpc_code(status))
    } else {
        format!("HTTP {status}")
    };
    tracing::warn!(
        count,
        answer,
        expected = %key.describe(),
        hint = key.missing_hint().unwrap_or("make requests carry it, or choose MissingKey::Skip or MissingKey::fallback"),
        "{count} request(s) without a rate-limit key rejected since the last such warning"
    );
}

/// Adds `Retry-After` (whole seconds, rounded up, at least 1) and, for a
/// gRPC request, `grpc-retry-pushback-ms`.
pub(crate) fn set_retry_after(response: &mut Response<Bytes>, retry: Duration, grpc: bool) {
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(retry).max(1)));
    if grpc {
        let millis = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX);
        headers.insert(GRPC_RETRY_PUSHBACK_MS.clone(), HeaderValue::from(millis));
    }
}

/// The `500` of a response future that lost its request (unreachable: a
/// waiting state keeps its request until it forwards it), logged at
/// `error`.
pub(crate) fn internal_error(what: &str) -> Response<Bytes> {
    tracing::error!("{what}; answering 500");
    let mut response = Response::new(Bytes::from_static(b"internal error in the rate limiter\n"));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

/// The `429` (gRPC `RESOURCE_EXHAUSTED`) of a request denied by a
/// concurrency limit, with `Retry-After` when the store knows when a
/// permit comes back.
pub(crate) fn concurrency_limited(
    grpc_type: Option<HeaderValue>,
    policy: &str,
    limit: u64,
    retry_after: Option<Duration>,
) -> Response<Bytes> {
    let mut message =
        format!("Too many requests: concurrency limit \"{policy}\" of {limit} in flight reached");
    if let Some(retry) = retry_after {
        let secs = ceil_secs(retry).max(1);
        let unit = if secs == 1 { "second" } else { "seconds" };
        let _ = write!(
            message,
            "; a permit frees when a running request ends, or in {secs} {unit} unless its lease is renewed"
        );
    }
    message.push_str(".\n");
    let grpc = grpc_type.is_some();
    let mut response = plain(grpc_type, StatusCode::TOO_MANY_REQUESTS, &message);
    if let Some(retry) = retry_after {
        set_retry_after(&mut response, retry, grpc);
    }
    response
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
            let mut response = grpc_limited(content_type, info, &limited_message(info));
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

/// An RFC 9457 problem document for a limited request.
fn problem_json(info: &RateLimitInfo) -> Vec<u8> {
    problem_doc(
        info.binding_policy(),
        limited_message(info).trim_end(),
        info.retry_after_secs(),
    )
}

/// The problem document, written by `serde_json`, so any policy name or
/// message (a `\`, a quote, a control character) is escaped correctly.
fn problem_doc(policy: &str, detail: &str, retry_after: Option<u64>) -> Vec<u8> {
    let mut doc = serde_json::json!({
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": detail,
        "policy": policy,
    });
    if let (Some(secs), Some(map)) = (retry_after, doc.as_object_mut()) {
        map.insert("retry_after".to_owned(), secs.into());
    }
    serde_json::to_vec(&doc).unwrap_or_else(|_| {
        br#"{"type":"about:blank","title":"Too Many Requests","status":429}"#.to_vec()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis_core::{Decision, Policy, Verdict};
    use std::time::Duration;

    fn info() -> RateLimitInfo {
        let policy = Policy::per_second(1).name("api").build().unwrap();
        let verdict = Verdict::from_iter([Decision::denied(
            1,
            0,
            Duration::from_millis(1500),
            Duration::from_secs(2),
        )]);
        RateLimitInfo::new("k", "default", vec![policy].into(), verdict)
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        let message = |text| {
            grpc(
                HeaderValue::from_static("application/grpc"),
                StatusCode::TOO_MANY_REQUESTS,
                text,
            )
            .headers()["grpc-message"]
                .clone()
        };
        // Tonic (feature `tonic`) also encodes spaces; both decode back.
        for (text, encoded) in [
            ("50% off\n", "50%25"),
            ("caf\u{e9}", "caf%C3%A9"),
            ("a\tb", "a%09b"),
        ] {
            let value = message(text);
            assert!(value.to_str().unwrap().starts_with(encoded), "{value:?}");
            assert!(value.as_bytes().iter().all(|b| (0x20..0x7f).contains(b)));
            let decoded = percent_encoding::percent_decode(value.as_bytes())
                .decode_utf8()
                .unwrap();
            assert_eq!(decoded, text.trim_end());
        }
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
        let json: serde_json::Value = serde_json::from_slice(&problem_json(&info())).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "type": "about:blank",
                "title": "Too Many Requests",
                "status": 429,
                "detail": "Too many requests: rate limit \"api\" exceeded; retry in 2 seconds.",
                "policy": "api",
                "retry_after": 2,
            })
        );
    }

    #[test]
    fn problem_json_escapes_backslashes_and_control_characters() {
        // Policy names the core accepts need no escaping; a custom message
        // or a future name rule might, so the writer must not care.
        for text in [
            "a\\b",
            "tab\there",
            "nl\nx",
            "quote\"q",
            "bell\u{7}",
            "\\\"",
        ] {
            let bytes = problem_doc(text, &format!("limit {text} hit"), Some(3));
            let json: serde_json::Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{text:?}: {e}: {}", String::from_utf8_lossy(&bytes)));
            assert_eq!(json["policy"], text);
            assert_eq!(json["detail"], format!("limit {text} hit"));
            assert_eq!(json["retry_after"], 3);
        }
        let json: serde_json::Value = serde_json::from_slice(&problem_doc("p", "d", None)).unwrap();
        assert!(json.get("retry_after").is_none());
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
