//! The builder's setters for a request's check options: idempotency keys
//! (with their free replays and fingerprint) and priority classes. What
//! they give each request, and its check, is `rate_limit/options.rs`.

use std::time::Duration;

use portcullis_core::Store;

use super::RateLimitLayerBuilder;
use crate::key::KeyExtractor;

impl<St: Store, K: KeyExtractor> RateLimitLayerBuilder<St, K> {
    /// Makes a request's retries free: a request whose `key` extractor
    /// yields an **idempotency key** (a header such as `Idempotency-Key`:
    /// [`Header`](crate::Header) of `idempotency-key`) and is **admitted**
    /// is recorded for `window`; a retry of the *same request* within the
    /// window is answered as the first was and charges nothing, at most
    /// [`idempotency_free_replays`](Self::idempotency_free_replays) times
    /// (2 by default); past that a retry is charged as a new request. With
    /// [`charge_from_response`](Self::charge_from_response) a free retry is
    /// not charged after its response either.
    ///
    /// **What a client can do with the key** (it is chosen by the client
    /// the limit holds):
    ///
    /// - *Reuse one key for other requests*: the record is bound to the
    ///   request (its method, path and query, cost, and what
    ///   [`idempotency_fingerprint`](Self::idempotency_fingerprint) adds),
    ///   so another request under a used key is a new request, charged.
    /// - *Retry forever*: each admitted charge buys at most
    ///   `1 + free replays` answers that reach your service, so per window
    ///   a subject gets at most `(1 + free replays) × limit` through; with
    ///   0 free replays, exactly the limit.
    /// - *Lock itself out*: a denial records nothing, so a retry after its
    ///   `Retry-After` is checked afresh.
    /// - *Grow state or evict others*: records are written only for
    ///   admitted requests, live beside their subject's state (in Redis:
    ///   `<prefix>:{<subject>}:#<sha256>`, same hash slot, expiring with the
    ///   window) and, in a `MemoryStore`, count in its `memory_bytes`, at
    ///   most 64 per subject (a subject's new record replaces its own
    ///   oldest) and the store's `max_keys` in all (beyond, no record is
    ///   kept: the retry is charged again, never more admitted).
    ///
    /// The key is hashed before it is stored. Requests without a key are
    /// checked as usual. The layer's deny cache is off for a layer with
    /// idempotency keys or classes; its fallback store, while the main
    /// store is down, checks with the key and class too (its records are
    /// its own).
    ///
    /// ```
    /// // Also add: cargo add tower --features util
    /// use std::time::Duration;
    /// use axum::http::Request;
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::{Header, RateLimitLayer};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_minute(1).name("payments").build()?)
    ///     .key(Header::new(axum::http::HeaderName::from_static("x-account")))
    ///     .idempotency_key(Header::new(axum::http::HeaderName::from_static("idempotency-key")), Duration::from_secs(600))
    ///     .build()?;
    /// let service = layer.layer(service_fn(|_req: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(axum::http::Response::new(String::new()))
    /// }));
    /// let call = |path: &str| Request::post(path)
    ///     .header("x-account", "acme")
    ///     .header("idempotency-key", "pay-7f3a")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(service.clone().oneshot(call("/pay")).await?.status(), 200);
    /// // The retry is answered as the first attempt, not charged again.
    /// assert_eq!(service.clone().oneshot(call("/pay")).await?.status(), 200);
    /// // The same key on another request is a new request: the limit holds.
    /// assert_eq!(service.clone().oneshot(call("/refund")).await?.status(), 429);
    /// # Ok(()) }
    /// ```
    ///
    /// A window of zero or above 30 days fails at [`build`](Self::build)
    /// with [`ConfigError::IdempotencyWindow`](crate::ConfigError::IdempotencyWindow).
    pub fn idempotency_key<I: KeyExtractor>(mut self, key: I, window: Duration) -> Self {
        self.settings.options.idempotency = Some((Box::new(key), window));
        self
    }

    /// How many retries of an admitted request one idempotency record
    /// answers without charging: 2 by default, the retries the common HTTP
    /// API client libraries make. The retry after them is charged as a new
    /// request. 0 charges every retry. Per window a subject gets at most
    /// `(1 + free_replays) × limit` requests through.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::http::HeaderName;
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::{Header, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_minute(10).build()?)
    ///     .idempotency_key(Header::new(HeaderName::from_static("idempotency-key")), Duration::from_secs(600))
    ///     .idempotency_free_replays(1)
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn idempotency_free_replays(mut self, free_replays: u32) -> Self {
        self.settings.options.free_replays = free_replays;
        self
    }

    /// Adds `fingerprint`'s value (for example a `Content-Digest` header
    /// the client or an earlier layer sets) to what binds an idempotency
    /// record to its request, beside the method, path and cost: a retry
    /// with another body is then a new request, charged. A request
    /// without the value is fingerprinted without it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::http::HeaderName;
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::{Header, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_minute(10).build()?)
    ///     .idempotency_key(Header::new(HeaderName::from_static("idempotency-key")), Duration::from_secs(600))
    ///     .idempotency_fingerprint(Header::new(HeaderName::from_static("content-digest")))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn idempotency_fingerprint<F: KeyExtractor>(mut self, fingerprint: F) -> Self {
        self.settings.options.fingerprint = Some(Box::new(fingerprint));
        self
    }

    /// Chooses each request's **priority class** with `selector` (any key
    /// extractor), for policies that define classes
    /// ([`PolicyBuilder::class`](portcullis_core::PolicyBuilder::class)):
    /// a class is admitted only while its reserve of the shared allowance
    /// remains after its charge, and its denial's `Retry-After` says when
    /// that class may go again. Exact and atomic in memory and Redis.
    ///
    /// **A class is a privilege: grant it, never let a client claim it.**
    /// Take it from what your application trusts — an extension your
    /// authentication layer inserts ([`User`](crate::User) reads one), the
    /// route, the customer's plan — not from a header the client sends: a
    /// client that may name its class will name the best one. A request
    /// whose selector yields nothing, or a class a policy does not define,
    /// is checked as that policy's default class, the most reserved unless
    /// the policy names another
    /// ([`PolicyBuilder::default_class`](portcullis_core::PolicyBuilder::default_class)):
    /// sending nothing or nonsense never earns more, and is no error.
    ///
    /// ```
    /// // Also add: cargo add tower --features util
    /// use std::fmt;
    /// use axum::http::Request;
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::{Global, RateLimitLayer, User};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// /// Set by your authentication layer from the caller's credentials.
    /// #[derive(Clone)]
    /// struct Class(&'static str);
    /// impl fmt::Display for Class {
    ///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    ///         f.write_str(self.0)
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = Policy::per_minute(4)
    ///     .name("api")
    ///     .class("critical", 0)
    ///     .class("batch", 50)
    ///     .build()?;
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(policy)
    ///     .key(Global)
    ///     .priority(User::<Class>::new())
    ///     .build()?;
    /// let service = layer.layer(service_fn(|_req: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(axum::http::Response::new(String::new()))
    /// }));
    /// let call = |class: Option<&'static str>| {
    ///     let mut request = Request::builder();
    ///     if let Some(class) = class {
    ///         request = request.extension(Class(class));
    ///     }
    ///     request.body(()).unwrap()
    /// };
    /// let mut statuses = Vec::new();
    /// for class in [None, Some("batch"), Some("batch"), Some("critical"), Some("critical"), Some("critical")] {
    ///     statuses.push(service.clone().oneshot(call(class)).await?.status().as_u16());
    /// }
    /// // No class is the default, "batch" (the most reserved): batch stops
    /// // while half remains; critical takes the rest.
    /// assert_eq!(statuses, [200, 200, 429, 200, 200, 429]);
    /// # Ok(()) }
    /// ```
    pub fn priority<P: KeyExtractor>(mut self, selector: P) -> Self {
        self.settings.options.priority = Some(Box::new(selector));
        self
    }
}
