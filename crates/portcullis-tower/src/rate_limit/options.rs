//! A request's check options in the rate-limit layer (idempotency keys and
//! priority classes): the builder methods
//! ([`RateLimitLayerBuilder::idempotency_key`],
//! [`RateLimitLayerBuilder::priority`]), where a layer takes them from
//! ([`OptionSources`]), the [`CheckOptions`] they give one request
//! ([`RequestOptions`]), and its check through [`Store::check_with`] (one
//! call: the record, the class reserves and the check together).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use portcullis_core::{
    BoxCheckFuture, CheckOptions, Policy, Store, StoreError, Verdict, DEFAULT_FREE_REPLAYS,
    MAX_IDEMPOTENCY_WINDOW,
};

use super::layer::RateLimitLayerBuilder;
use crate::key::{KeyBuf, KeyExtractor};

/// What a layer adds to each check: an idempotency key extractor with its
/// window, the free replays of a record and what else binds it to its
/// request, and a priority class selector.
pub(crate) struct OptionSources {
    idempotency: Option<(Box<dyn KeyExtractor>, Duration)>,
    fingerprint: Option<Box<dyn KeyExtractor>>,
    free_replays: u32,
    priority: Option<Box<dyn KeyExtractor>>,
}

impl Default for OptionSources {
    fn default() -> Self {
        Self {
            idempotency: None,
            fingerprint: None,
            free_replays: DEFAULT_FREE_REPLAYS,
            priority: None,
        }
    }
}

/// A request's options, and whether its check was a replay (set by the
/// check's future, read when the verdict arrives).
#[derive(Debug)]
pub(crate) struct RequestOptions {
    options: CheckOptions,
    replayed: Arc<AtomicBool>,
}

impl RequestOptions {
    /// The options of a request checked as its policies' default class
    /// (no idempotency key, no class of its own).
    pub(crate) fn default_class() -> Box<Self> {
        Box::new(Self {
            options: CheckOptions::new(),
            replayed: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Whether the verdict replays an earlier request with the same
    /// idempotency key (nothing was charged, nor is after the response).
    pub(crate) fn is_replay(&self) -> bool {
        self.replayed.load(Ordering::Relaxed)
    }
}

impl OptionSources {
    /// Whether the layer adds anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.idempotency.is_none() && self.priority.is_none()
    }

    /// The options of this request; `None` when it carries neither an
    /// idempotency key nor a class (a plain check).
    pub(crate) fn for_request(&self, parts: &Parts) -> Option<Box<RequestOptions>> {
        let mut options = CheckOptions::new();
        if let Some((extractor, window)) = &self.idempotency {
            let mut key = KeyBuf::new();
            if extractor.extract_into(parts, &mut key) && !key.as_str().is_empty() {
                options = options
                    .idempotency_key(key.as_str(), *window)
                    .free_replays(self.free_replays)
                    .fingerprint(self.fingerprint(parts));
            }
        }
        if let Some(selector) = &self.priority {
            let mut class = KeyBuf::new();
            if selector.extract_into(parts, &mut class) && !class.as_str().is_empty() {
                options = options.class(class.as_str());
            }
        }
        (!options.is_empty()).then(|| {
            Box::new(RequestOptions {
                options,
                replayed: Arc::new(AtomicBool::new(false)),
            })
        })
    }
}

impl OptionSources {
    /// What binds a record to its request: the method, the path with its
    /// query, and the configured fingerprint extractor's value (a body
    /// digest header, say), each length-prefixed so no two requests read
    /// alike, hashed (so a long URL is never too long a fingerprint). The
    /// cost is added by the store.
    fn fingerprint(&self, parts: &Parts) -> String {
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let mut extra = KeyBuf::new();
        let has_extra = self
            .fingerprint
            .as_ref()
            .is_some_and(|extractor| extractor.extract_into(parts, &mut extra));
        let mut fingerprint = Vec::with_capacity(path.len() + extra.as_str().len() + 32);
        for part in [
            parts.method.as_str(),
            path,
            if has_extra { extra.as_str() } else { "" },
        ] {
            fingerprint.extend_from_slice(&(part.len() as u64).to_be_bytes());
            fingerprint.extend_from_slice(part.as_bytes());
        }
        fingerprint.push(u8::from(has_extra));
        portcullis_core::subject::hash_subject(&fingerprint)
    }
}

/// A check with options: answered now when the store answers at once
/// (its future is ready at the first poll), else the future to wait for,
/// already started (never dropped and sent again: that would charge twice).
pub(crate) enum Asked {
    Now(Result<Verdict, StoreError>),
    Later(BoxCheckFuture),
}

/// Sends the check with `request`'s options; the future records a replay
/// in `request`.
pub(crate) fn ask<St: Store>(
    store: &St,
    key: &str,
    policies: &[Policy],
    cost: u64,
    request: &RequestOptions,
) -> Asked {
    let replayed = Arc::clone(&request.replayed);
    let checked = store.check_with(key, policies, cost, &request.options);
    let mut future: BoxCheckFuture = Box::pin(async move {
        let checked = checked.await?;
        replayed.store(checked.is_replay(), Ordering::Relaxed);
        Ok(checked.into_verdict())
    });
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(result) => Asked::Now(result),
        Poll::Pending => Asked::Later(future),
    }
}

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
    /// use std::time::Duration;
    /// use http::Request;
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::{Header, RateLimitLayer};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_minute(1).name("payments").build()?)
    ///     .key(Header::new(http::HeaderName::from_static("x-account")))
    ///     .idempotency_key(Header::new(http::HeaderName::from_static("idempotency-key")), Duration::from_secs(600))
    ///     .build()?;
    /// let service = layer.layer(service_fn(|_req: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
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
        self.options_mut().idempotency = Some((Box::new(key), window));
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
    /// use http::HeaderName;
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
        self.options_mut().free_replays = free_replays;
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
    /// use http::HeaderName;
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
        self.options_mut().fingerprint = Some(Box::new(fingerprint));
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
    /// use std::fmt;
    /// use http::Request;
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
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
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
        self.options_mut().priority = Some(Box::new(selector));
        self
    }
}

/// Checks the layer's idempotency window at build time.
pub(crate) fn validate(sources: &OptionSources) -> Result<(), crate::ConfigError> {
    match &sources.idempotency {
        Some((_, window)) if window.is_zero() || *window > MAX_IDEMPOTENCY_WINDOW => {
            Err(crate::ConfigError::IdempotencyWindow { window: *window })
        }
        _ => Ok(()),
    }
}
