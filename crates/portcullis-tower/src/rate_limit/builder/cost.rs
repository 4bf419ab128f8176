//! The builder's setters for what a request costs: a cost known before
//! the request runs ([`cost`](RateLimitLayerBuilder::cost)), or one
//! charged after its response
//! ([`charge_from_response`](RateLimitLayerBuilder::charge_from_response)).

use portcullis_core::Store;

use super::RateLimitLayerBuilder;
use crate::key::{KeyExtractor, RequestHead};

impl<St: Store, K: KeyExtractor> RateLimitLayerBuilder<St, K> {
    /// Sets the cost (permits) of each request (default 1), for example by
    /// the size of a batch. A cost of 0 passes without a check. A cost above
    /// a policy's capacity can never be admitted and is answered with `429`
    /// without `Retry-After`.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    {
        self.settings.cost = Some(Box::new(cost));
        self
    }

    /// Charges each request **after its response**, by the cost `cost`
    /// computes from the response head (a header such as `x-tokens-used`,
    /// or the status: `1` for a failed login, `0` for a successful one),
    /// instead of a cost known before the request runs.
    ///
    /// Before the inner service is called, the layer only *peeks*: a
    /// subject with no permit left gets the usual `429` (or gRPC
    /// `RESOURCE_EXHAUSTED`) without reaching the handler. Once the
    /// response head is ready, the layer charges the cost atomically with
    /// [`Store::charge`] — even past the limit, into a debt paid back by
    /// waiting and capped at one full capacity beyond empty, so one
    /// response locks a subject out for at most the policy's full reset
    /// plus one emission interval (ALGORITHMS.md, "Charging after the
    /// response") — and waits for the charge before returning the response,
    /// so the subject's next request sees it. A handler can change the
    /// amount through the [`Charge`](crate::Charge) handle in the request's
    /// extensions. Rate-limit headers on an admitted response describe the
    /// state after the charge (or the peek, if the charge failed).
    ///
    /// The peek and the charge are two steps: concurrent requests of one
    /// subject may all pass the peek while the first is still running, and
    /// each is then charged in full. That is what the debt is for: however
    /// many there are, the subject's lock-out stays within the bound above.
    /// To also cap how many run at once, stack a concurrency limit.
    ///
    /// The function sees the response *head*: a gRPC status, sent in the
    /// trailers, is not in it (a gRPC handler reports its cost through the
    /// [`Charge`](crate::Charge) handle instead), and the charge is made
    /// before the body is streamed.
    ///
    /// When the charge fails, the response is returned all the same and the
    /// failure logged (at `warn`); a store-wide failure counts toward the
    /// circuit breaker, and with [`FailurePolicy::Fallback`](crate::FailurePolicy::Fallback) a charge the
    /// store failed (rather than refused) goes to the fallback store.
    /// Requests let through undecided ([`FailurePolicy::FailOpen`](crate::FailurePolicy::FailOpen)) and
    /// dry-run denials are not charged.
    ///
    /// Only GCRA (the default) and token-bucket policies can be charged
    /// after the fact, and the store must implement [`Store::charge`]
    /// (`MemoryStore` and `RedisStore` do): [`build`](Self::build) refuses
    /// other algorithms, and this cannot be combined with
    /// [`cost`](Self::cost).
    ///
    /// ```
    /// // Also add: cargo add tower --features util
    /// use std::convert::Infallible;
    /// use std::net::SocketAddr;
    /// use axum::body::Body;
    /// use axum::http::{Request, Response, StatusCode};
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 10 000 tokens per minute, charged by what each response reports.
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_minute(10_000).name("tokens").build()?)
    ///     .charge_from_response(|parts| {
    ///         parts.headers.get("x-tokens-used")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(0)
    ///     })
    ///     .build()?;
    /// let service = layer.layer(service_fn(|_req: Request<()>| async {
    ///     let mut response = Response::new(Body::from("…"));
    ///     response.headers_mut().insert("x-tokens-used", 6_000.into());
    ///     Ok::<_, Infallible>(response)
    /// }));
    /// let peer: SocketAddr = "192.0.2.1:4711".parse()?;
    /// let request = || Request::post("/v1/complete").extension(peer).body(()).unwrap();
    ///
    /// let first = service.clone().oneshot(request()).await?;
    /// assert_eq!(first.status(), StatusCode::OK);
    /// // The headers describe the state after the charge.
    /// assert_eq!(first.headers()["ratelimit"], "\"tokens\";r=4000;t=36");
    /// // 4 000 left: admitted, and charged 6 000 more (2 000 of debt).
    /// let second = service.clone().oneshot(request()).await?;
    /// assert_eq!(second.headers()["ratelimit"], "\"tokens\";r=0;t=13");
    /// let denied = service.oneshot(request()).await?;
    /// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(denied.headers()["retry-after"], "13"); // 2 001 tokens at 6 ms
    /// # Ok(()) }
    /// ```
    pub fn charge_from_response<F>(mut self, cost: F) -> Self
    where
        F: Fn(&http::response::Parts) -> u64 + Send + Sync + 'static,
    {
        self.settings.charge = Some(Box::new(cost));
        self
    }
}
