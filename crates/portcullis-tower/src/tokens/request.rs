//! What a request reserves: [`Estimate`] (a fixed number, a header, or a
//! bounded read of a JSON body's `max_tokens`), the estimate read from a
//! request, and [`TokenRequestBody`], the body the inner service gets
//! back intact. A leaf.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{HeaderName, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::Value;

/// The largest request body [`Estimate::json_max_tokens`] reads by default:
/// 1 MiB.
pub const MAX_ESTIMATE_BODY: usize = 1024 * 1024;

#[derive(Debug, Clone)]
enum Source {
    Fixed,
    Header(HeaderName),
    Json,
}

/// Where a request's token estimate comes from: what
/// [`TokenBudgetLayer`](crate::TokenBudgetLayer) reserves at admission.
///
/// Every value here comes from the client, which the budget is meant to
/// hold: a missing value reserves the default, and a value that is not a
/// whole number of tokens, or one larger than the budget can ever hold,
/// is answered `400` before anything is reserved. A low estimate buys
/// nothing: the response's usage is charged at settlement (up to the
/// budget's overage cap), and an upstream told `max_tokens` produces no
/// more.
///
/// ```
/// use axum::http::HeaderName;
/// use portcullis::tower::Estimate;
///
/// // OpenAI-style bodies: max_tokens plus a quarter of the body's bytes.
/// let json = Estimate::json_max_tokens().max_body(256 * 1024).or_default(1_024);
/// // A header the gateway's own client sets; 512 when absent.
/// let header = Estimate::header(HeaderName::from_static("x-token-estimate")).or_default(512);
/// // The same for every request of the route.
/// let fixed = Estimate::fixed(2_000);
/// # let _ = (json, header, fixed);
/// ```
#[derive(Debug, Clone)]
pub struct Estimate {
    source: Source,
    default: u64,
    max_body: usize,
}

impl Estimate {
    /// Every request reserves `tokens`.
    #[must_use]
    pub fn fixed(tokens: u64) -> Self {
        Self {
            source: Source::Fixed,
            default: tokens,
            max_body: 0,
        }
    }

    /// The request header `name`, a whole number of tokens (default when
    /// absent: 1 024, see [`Estimate::or_default`]).
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self {
            source: Source::Header(name),
            default: 1_024,
            max_body: 0,
        }
    }

    /// An OpenAI-style JSON body: its `max_tokens` or
    /// `max_completion_tokens` (the larger, when both are sent) times its
    /// `n` choices (1 when absent), plus the prompt, counted as a quarter
    /// of the body's bytes rounded up; the default (1 024, see
    /// [`Estimate::or_default`]) stands for a missing `max_tokens` (or
    /// an empty body). The
    /// body is read whole, at most [`Estimate::max_body`] bytes (a larger
    /// one is answered `413`), and handed to the inner service intact.
    #[must_use]
    pub fn json_max_tokens() -> Self {
        Self {
            source: Source::Json,
            default: 1_024,
            max_body: MAX_ESTIMATE_BODY,
        }
    }

    /// The estimate of a request that carries none.
    #[must_use]
    pub fn or_default(mut self, tokens: u64) -> Self {
        self.default = tokens;
        self
    }

    /// The largest body [`Estimate::json_max_tokens`] reads (default
    /// [`MAX_ESTIMATE_BODY`]).
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Whether the body must be read first.
    pub(crate) fn reads_body(&self) -> bool {
        matches!(self.source, Source::Json)
    }

    /// The largest body read.
    pub(crate) fn body_limit(&self) -> usize {
        self.max_body
    }

    /// The estimate from the request head (and the body, when read).
    pub(crate) fn of(&self, parts: &Parts, body: Option<&[u8]>) -> Result<u64, Rejection> {
        match &self.source {
            Source::Fixed => Ok(self.default),
            Source::Header(name) => match parts.headers.get(name) {
                None => Ok(self.default),
                Some(value) => value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        Rejection::bad(format!(
                            "the {name} header must be a whole number of tokens"
                        ))
                    }),
            },
            Source::Json => {
                let body = body.unwrap_or_default();
                if body.iter().all(u8::is_ascii_whitespace) {
                    // No body: nothing asked for, the default.
                    return Ok(self.default);
                }
                let value: Value = serde_json::from_slice(body)
                    .map_err(|_| Rejection::bad("the request body is not JSON".to_owned()))?;
                // Both fields, when both are sent: the larger counts (an
                // upstream may honour either).
                let mut max_tokens = None;
                for name in ["max_tokens", "max_completion_tokens"] {
                    match value.get(name) {
                        None | Some(Value::Null) => {}
                        Some(n) => {
                            let n = n.as_u64().ok_or_else(|| {
                                Rejection::bad(format!(
                                    "{name} must be a whole number of tokens, 0 or more"
                                ))
                            })?;
                            max_tokens = Some(max_tokens.map_or(n, |m: u64| m.max(n)));
                        }
                    }
                }
                let max_tokens = max_tokens.unwrap_or(self.default);
                // `n` choices each up to `max_tokens`: a client asking for
                // fifty answers is estimated at fifty.
                let choices = match value.get("n") {
                    None | Some(Value::Null) => 1,
                    Some(n) => n.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                        Rejection::bad("n must be a whole number of choices, 1 or more".to_owned())
                    })?,
                };
                let prompt = u64::try_from(body.len().div_ceil(4)).unwrap_or(u64::MAX);
                Ok(max_tokens.saturating_mul(choices).saturating_add(prompt))
            }
        }
    }
}

/// A request answered before the inner service: its status and message.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl Rejection {
    pub(crate) fn bad(message: String) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
}

/// Reads `body` whole, refusing more than `limit` bytes (`413`) and a
/// body that fails (`400`).
pub(crate) async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, Rejection>
where
    B: Body<Data = Bytes>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large(limit));
    }
    let mut body = std::pin::pin!(body);
    let mut buf = BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let Ok(frame) = frame else {
            return Err(Rejection::bad(
                "the request body could not be read".to_owned(),
            ));
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large(limit));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn too_large(limit: usize) -> Rejection {
    Rejection {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!(
            "the request body is larger than {limit} bytes, the most the token budget reads to find max_tokens; send a smaller one"
        ),
    }
}

pin_project! {
    /// The request body the inner service of
    /// [`TokenBudgetLayer`](crate::TokenBudgetLayer) gets: the request's
    /// own body, or the bytes the layer read to find `max_tokens`, intact.
    ///
    /// ```
    /// // Also add: cargo add tower --features util && cargo add http-body-util
    /// use std::convert::Infallible;
    /// use axum::body::Bytes;
    /// use axum::http::{Request, Response};
    /// use http_body_util::{BodyExt, Full};
    /// use portcullis::{MemoryStore, Policy, TokenBudget};
    /// use portcullis::tower::{Estimate, Global, TokenBudgetLayer, TokenRequestBody};
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let budget = TokenBudget::tokens(Policy::per_hour(10_000).build()?).build()?;
    /// let layer = TokenBudgetLayer::builder(MemoryStore::new(), budget, Global)
    ///     .estimate(Estimate::json_max_tokens())
    ///     .build();
    /// // The upstream reads the body the layer read first, byte for byte.
    /// let echo = tower::service_fn(|request: Request<TokenRequestBody<Full<Bytes>>>| async {
    ///     let body = request.into_body().collect().await.map_err(|e| match e {})?.to_bytes();
    ///     Ok::<_, Infallible>(Response::new(Full::new(body)))
    /// });
    /// let sent = r#"{"max_tokens":100,"messages":[]}"#;
    /// let request = Request::new(Full::new(Bytes::from(sent)));
    /// let response = layer.layer(echo).oneshot(request).await?;
    /// assert_eq!(response.into_body().collect().await?.to_bytes(), sent);
    /// # Ok(()) }
    /// ```
    pub struct TokenRequestBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Read { data: Option<Bytes> },
        Inner { #[pin] body: B },
    }
}

impl<B> TokenRequestBody<B> {
    pub(crate) fn read(data: Bytes) -> Self {
        Self {
            kind: Kind::Read {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }
}

impl<B> fmt::Debug for TokenRequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenRequestBody")
            .field("read", &matches!(self.kind, Kind::Read { .. }))
            .finish()
    }
}

impl<B: Body<Data = Bytes>> Body for TokenRequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Read { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Read { data } => data.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Read { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
        }
    }
}
