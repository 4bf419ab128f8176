//! [`TokenBudgetLayer`] and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use portcullis_core::{ReservationStore, TokenBudget};
use tower_layer::Layer;

use super::request::Estimate;
use super::service::TokenBudgetService;
use super::shared::{Shared, TokenLogs};
use crate::config::DEFAULT_CHECK_TIMEOUT;
use crate::headers::{policy_value, ratelimit_prefixes};
use crate::KeyExtractor;

/// A tower layer for AI gateways: each request reserves its token
/// estimate (with one request of the request policies and, when the
/// budget limits them, a place among the streams in flight) before the
/// upstream is called, and settles the tokens the response reports when
/// its body ends, however long it streams.
///
/// - **Admission.** The [`Estimate`] (a header, a fixed number per route,
///   or `max_tokens` read from a bounded JSON body that the upstream then
///   gets intact) is reserved in one atomic step
///   ([`ReservationStore::reserve`]). A request that does not fit is
///   answered `429` with `Retry-After` (for a place among the streams in
///   flight, at most a second: when a stream ends is not known) and a
///   JSON error naming the budget that refused; an estimate that can never fit, or one that is not a
///   number, `400`; a body past the read limit `413`.
/// - **Settlement.** The usage is read as the response passes, never
///   held back: a response header or trailer
///   ([`usage_header`](TokenBudgetLayerBuilder::usage_header)), the
///   `usage` object of the final OpenAI-style SSE event, or of a JSON
///   body. When the body ends the reservation is settled: the unused part
///   refunded, usage beyond it charged up to the budget's overage cap.
/// - **Disconnects and failures.** A client that goes away mid-stream
///   (the body dropped), an upstream error or a timeout settle with the
///   usage reported so far, else the estimate; an instance that dies
///   leaves its reservation to expire after the budget's TTL. While a
///   request runs (a slow upstream, a long stream), its reservation is
///   renewed every half TTL ([`ReservationStore::renew`]), so it keeps its
///   estimate and its place in flight however long it takes.
/// - **Headers.** Admitted responses carry `RateLimit-Policy` and
///   `RateLimit` for the budget's policies after the reservation; the
///   next response shows the state after this one's settlement.
///
/// Clones share one budget. The key, estimate and usage are read from
/// the request and the upstream's response only: a client's claim of its
/// own usage is never read.
///
/// ```
/// // Also add: cargo add tower --features util && cargo add http-body-util
/// use std::convert::Infallible;
/// use axum::body::Bytes;
/// use axum::http::{HeaderValue, Request, Response, StatusCode};
/// use http_body_util::{BodyExt, Full};
/// use portcullis::{MemoryStore, Policy, TokenBudget};
/// use portcullis::tower::{ApiKey, Estimate, TokenBudgetLayer, TokenRequestBody};
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let budget = TokenBudget::tokens(Policy::per_minute(10_000).name("tokens").build()?)
///     .requests(Policy::per_minute(60).name("requests").build()?)
///     .max_in_flight(2)
///     .build()?;
/// let layer = TokenBudgetLayer::builder(MemoryStore::new(), budget, ApiKey::new())
///     .estimate(Estimate::json_max_tokens())
///     .build();
/// let upstream = tower::service_fn(|_: Request<TokenRequestBody<Full<Bytes>>>| async {
///     let body = r#"{"choices":[],"usage":{"total_tokens":120}}"#;
///     let mut response = Response::new(Full::new(Bytes::from(body)));
///     let json = HeaderValue::from_static("application/json");
///     response.headers_mut().insert("content-type", json);
///     Ok::<_, Infallible>(response)
/// });
/// let service = layer.layer(upstream);
/// let request = Request::post("/v1/chat/completions")
///     .header("x-api-key", "sk-test")
///     .body(Full::new(Bytes::from(r#"{"max_tokens":500,"messages":[]}"#)))?;
/// let response = service.oneshot(request).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// let ratelimit = response.headers()["ratelimit"].to_str()?.to_owned();
/// // 500 and the prompt reserved; reading the body settles 120.
/// assert!(ratelimit.starts_with("\"tokens\";r=94"), "{ratelimit}");
/// response.into_body().collect().await?;
/// # Ok(()) }
/// ```
pub struct TokenBudgetLayer<St> {
    pub(crate) shared: Arc<Shared<St>>,
}

impl<St> Clone for TokenBudgetLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> fmt::Debug for TokenBudgetLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBudgetLayer")
            .field("budget", &self.shared.budget)
            .field("estimate", &self.shared.estimate)
            .field("timeout", &self.shared.timeout)
            .field("fail_open", &self.shared.fail_open)
            .finish_non_exhaustive()
    }
}

impl<St: ReservationStore> TokenBudgetLayer<St> {
    /// A builder reserving against `budget` in `store`, per the key
    /// `key` extracts (an API key, a user, a tenant).
    pub fn builder(
        store: St,
        budget: TokenBudget,
        key: impl KeyExtractor,
    ) -> TokenBudgetLayerBuilder<St> {
        TokenBudgetLayerBuilder {
            store,
            budget,
            key: Box::new(key),
            estimate: Estimate::json_max_tokens(),
            usage_header: None,
            body_usage: true,
            timeout: DEFAULT_CHECK_TIMEOUT,
            fail_open: false,
        }
    }
}

impl<S, St> Layer<S> for TokenBudgetLayer<St> {
    type Service = TokenBudgetService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBudgetService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Builds a [`TokenBudgetLayer`]; see [`TokenBudgetLayer::builder`].
///
/// ```
/// // Also add: cargo add tower --features util && cargo add http-body-util
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use axum::body::Bytes;
/// use axum::http::{HeaderName, Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use portcullis::{MemoryStore, Policy, Store, TokenBudget};
/// use portcullis::tower::{Estimate, Header, TokenBudgetLayer, TokenRequestBody};
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let tokens = Policy::per_hour(1_000).name("tokens").build()?;
/// let budget = TokenBudget::tokens(tokens.clone()).build()?;
/// let tenant = Header::new(HeaderName::from_static("x-tenant"));
/// let layer = TokenBudgetLayer::builder(store.clone(), budget, tenant)
///     .estimate(Estimate::fixed(300))
///     // This upstream reports its usage in a header, not in its body.
///     .usage_header(HeaderName::from_static("x-usage-total-tokens"))
///     .usage_from_body(false)
///     .timeout(Duration::from_millis(250))
///     .fail_open(false)
///     .build();
/// let upstream = tower::service_fn(|_: Request<TokenRequestBody<Full<Bytes>>>| async {
///     let mut response = Response::new(Full::new(Bytes::from("done")));
///     response.headers_mut().insert("x-usage-total-tokens", 40.into());
///     Ok::<_, Infallible>(response)
/// });
/// let request = Request::post("/").header("x-tenant", "acme").body(Full::new(Bytes::new()))?;
/// let response = layer.layer(upstream).oneshot(request).await?;
/// // Reading the body to its end settles: 300 reserved, 40 used.
/// response.into_body().collect().await?;
/// let left = store.peek("acme", &[tokens]).await?.decisions()[0].remaining();
/// assert_eq!(left, 960);
/// # Ok(()) }
/// ```
#[must_use]
pub struct TokenBudgetLayerBuilder<St> {
    store: St,
    budget: TokenBudget,
    key: Box<dyn KeyExtractor>,
    estimate: Estimate,
    usage_header: Option<HeaderName>,
    body_usage: bool,
    timeout: Duration,
    fail_open: bool,
}

impl<St> fmt::Debug for TokenBudgetLayerBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBudgetLayerBuilder")
            .field("budget", &self.budget)
            .field("estimate", &self.estimate)
            .finish_non_exhaustive()
    }
}

impl<St: ReservationStore> TokenBudgetLayerBuilder<St> {
    /// Where the estimate comes from (default
    /// [`Estimate::json_max_tokens`]).
    pub fn estimate(mut self, estimate: Estimate) -> Self {
        self.estimate = estimate;
        self
    }

    /// A response header (or trailer) the upstream reports its total
    /// tokens in, read besides the body's `usage`; the last value seen
    /// counts.
    pub fn usage_header(mut self, name: HeaderName) -> Self {
        self.usage_header = Some(name);
        self
    }

    /// Whether to read the `usage` object of SSE and JSON bodies (default
    /// yes).
    pub fn usage_from_body(mut self, read: bool) -> Self {
        self.body_usage = read;
        self
    }

    /// The most a reserve or a settle waits for the store (default 500
    /// ms; a zero timeout counts as 1 ms). A reserve that timed out is
    /// answered by [`fail_open`](Self::fail_open); a settle is tried
    /// three times, then left to the reservation's TTL.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// When the store fails or times out: let the request through
    /// unreserved (`true`, counted in the log at most once a second) or
    /// answer `503` with `Retry-After: 1` (`false`, the default).
    pub fn fail_open(mut self, open: bool) -> Self {
        self.fail_open = open;
        self
    }

    /// Builds the layer.
    pub fn build(self) -> TokenBudgetLayer<St> {
        let policies = self.budget.policies();
        TokenBudgetLayer {
            shared: Arc::new(Shared {
                policy_header: policy_value(policies),
                prefixes: ratelimit_prefixes(policies),
                store: Arc::new(self.store),
                budget: self.budget,
                key: self.key,
                estimate: self.estimate,
                usage_header: self.usage_header,
                body_usage: self.body_usage,
                timeout: self.timeout,
                fail_open: self.fail_open,
                logs: Arc::new(TokenLogs::new()),
            }),
        }
    }
}
