//! The builder's setters for what a limited request gets: the mode
//! (enforce, dry run, shape), which responses carry the rate-limit
//! fields, the request's [`RateLimitInfo`], and the body of a limited
//! response.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use portcullis_core::Store;

use super::RateLimitLayerBuilder;
use crate::config::{HeaderMode, Mode};
use crate::info::RateLimitInfo;
use crate::key::KeyExtractor;
use crate::response::LimitedBody;
use crate::top_denied::TopDenied;

impl<St: Store, K: KeyExtractor> RateLimitLayerBuilder<St, K> {
    /// Counts every request a policy denies in `table` (a clone shared
    /// with the app), by subject as the store keys it and the denying
    /// policy, including denials from the deny cache: serve
    /// [`TopDenied::to_json`] on an admin endpoint to see who is refused
    /// most. The table's size is fixed whatever clients send; admitted
    /// requests never touch it. See [`TopDenied`].
    pub fn top_denied(mut self, table: TopDenied) -> Self {
        self.settings.top_denied = Some(table);
        self
    }

    /// Sets the mode (default [`Mode::Enforce`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// Shorthand for [`Mode::DryRun`].
    pub fn dry_run(self) -> Self {
        self.mode(Mode::DryRun)
    }

    /// Shorthand for [`Mode::Shape`] with `max_wait`.
    pub fn shape(self, max_wait: Duration) -> Self {
        self.mode(Mode::Shape { max_wait })
    }

    /// Sets which responses carry the `RateLimit` and `RateLimit-Policy`
    /// fields (default: all).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.settings.header_mode = mode;
        self
    }

    /// Also sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds until the quota is full again, or until
    /// retry when limited) for the binding policy.
    pub fn legacy_headers(mut self, enabled: bool) -> Self {
        self.settings.legacy_headers = enabled;
        self
    }

    /// Puts a [`RateLimitInfo`] (key, tier, policies, verdict) in the
    /// extensions of every admitted request, for handlers that show the
    /// remaining quota (off by default: it costs an allocation per request;
    /// in [`Mode::DryRun`] the info is always there).
    pub fn info_in_extensions(mut self, enabled: bool) -> Self {
        self.settings.info_in_extensions = enabled;
        self
    }

    /// Answers limited HTTP requests with an RFC 9457
    /// `application/problem+json` document instead of plain text.
    pub fn problem_json(mut self) -> Self {
        self.settings.body = LimitedBody::ProblemJson;
        self
    }

    /// Builds the response to limited HTTP requests (not gRPC ones, which
    /// always get status 8). The layer then adds its rate-limit fields: it
    /// appends its members to `RateLimit` / `RateLimit-Policy` lists the
    /// response already has, keeps the larger `Retry-After`, and adds the
    /// legacy `X-RateLimit-*` headers unless they are there.
    ///
    /// ```
    /// use axum::http::{Response, StatusCode};
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_second(5).build()?)
    ///     .on_limited(|info| {
    ///         Response::builder()
    ///             .status(StatusCode::SERVICE_UNAVAILABLE)
    ///             .body(format!("busy, come back in {}s", info.retry_after_secs().unwrap_or(1)))
    ///             .unwrap_or_default()
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn on_limited<F, B>(mut self, build: F) -> Self
    where
        F: Fn(&RateLimitInfo) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.settings.body = LimitedBody::Custom(Arc::new(move |info| build(info).map(Into::into)));
        self
    }
}
