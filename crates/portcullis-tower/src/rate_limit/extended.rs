//! Idempotency keys and priority classes in the rate-limit layer: the
//! builder methods ([`RateLimitLayerBuilder::idempotency_key`],
//! [`RateLimitLayerBuilder::priority`]), the [`CheckOptions`] they give a
//! request, and its check through [`Store::check_with`] (one call: the
//! record, the class reserves and the check together).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use portcullis_core::{
    BoxCheckFuture, CheckOptions, Policy, Store, StoreError, Verdict, MAX_IDEMPOTENCY_WINDOW,
};

use super::layer::RateLimitLayerBuilder;
use crate::key::{KeyBuf, KeyExtractor};

/// What a layer adds to each check: an idempotency key extractor with its
/// window, and a priority class selector.
#[derive(Default)]
pub(crate) struct Extended {
    idempotency: Option<(Box<dyn KeyExtractor>, Duration)>,
    priority: Option<Box<dyn KeyExtractor>>,
}

/// A request's options, and whether its check was a replay (set by the
/// check's future, read when the verdict arrives).
#[derive(Debug)]
pub(crate) struct Extra {
    options: CheckOptions,
    replayed: Arc<AtomicBool>,
}

impl Extra {
    /// Whether the verdict replays an earlier request with the same
    /// idempotency key (nothing was charged, nor is after the response).
    pub(crate) fn is_replay(&self) -> bool {
        self.replayed.load(Ordering::Relaxed)
    }
}

impl Extended {
    /// Whether the layer adds anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.idempotency.is_none() && self.priority.is_none()
    }

    /// The options of this request; `None` when it carries neither an
    /// idempotency key nor a class (a plain check).
    pub(crate) fn extra(&self, parts: &Parts) -> Option<Box<Extra>> {
        let mut options = CheckOptions::new();
        if let Some((extractor, window)) = &self.idempotency {
            let mut key = KeyBuf::new();
            if extractor.extract_into(parts, &mut key) && !key.as_str().is_empty() {
                options = options.idempotency_key(key.as_str(), *window);
            }
        }
        if let Some(selector) = &self.priority {
            let mut class = KeyBuf::new();
            if selector.extract_into(parts, &mut class) && !class.as_str().is_empty() {
                options = options.class(class.as_str());
            }
        }
        (!options.is_empty()).then(|| {
            Box::new(Extra {
                options,
                replayed: Arc::new(AtomicBool::new(false)),
            })
        })
    }
}

/// A check with options: answered now when the store answers at once
/// (its future is ready at the first poll), else the future to wait for,
/// already started (never dropped and sent again: that would charge twice).
pub(crate) enum Asked {
    Now(Result<Verdict, StoreError>),
    Later(BoxCheckFuture),
}

/// Sends the check with `extra`'s options; the future records a replay in
/// `extra`.
pub(crate) fn ask<St: Store>(
    store: &St,
    key: &str,
    policies: &[Policy],
    cost: u64,
    extra: &Extra,
) -> Asked {
    let replayed = Arc::clone(&extra.replayed);
    let checked = store.check_with(key, policies, cost, &extra.options);
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
    /// Makes retries free: a request whose `key` extractor yields an
    /// **idempotency key** (a header such as `Idempotency-Key`:
    /// [`Header`](crate::Header) of `idempotency-key`) is charged once
    /// per key, subject and policies within `window`. A repeat within the
    /// window is answered as the first request was (admitted, or denied
    /// with the same headers), and charges nothing; with
    /// [`charge_from_response`](Self::charge_from_response) it is not
    /// charged after its response either. The record lives beside the
    /// subject's state and is read and written in the same atomic call as
    /// the check (in Redis: `<prefix>:{<subject>}:#<sha256>`, same hash
    /// slot, expiring with the window). The key is hashed before it is
    /// stored. Requests without a key are checked as usual.
    ///
    /// Memory stays bounded: records expire with their window, and a
    /// `MemoryStore` holds at most its `max_keys` of them (a flood of fresh
    /// keys evicts the records nearest their end, or with
    /// `WhenFull::Deny` is refused); a Redis at `maxmemory` with
    /// `noeviction` denies a request whose record it cannot store, while a
    /// repeat of a stored key still replays. The layer's deny cache and
    /// its fallback limiter do not apply to requests with a key or a class.
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
    /// let pay = || Request::builder()
    ///     .header("x-account", "acme")
    ///     .header("idempotency-key", "pay-7f3a")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(service.clone().oneshot(pay()).await?.status(), 200);
    /// // The retry is answered as the first attempt, not charged again.
    /// assert_eq!(service.clone().oneshot(pay()).await?.status(), 200);
    /// # Ok(()) }
    /// ```
    ///
    /// A window of zero or above 30 days fails at [`build`](Self::build)
    /// with [`ConfigError::IdempotencyWindow`](crate::ConfigError::IdempotencyWindow).
    pub fn idempotency_key<I: KeyExtractor>(mut self, key: I, window: Duration) -> Self {
        self.extended_mut().idempotency = Some((Box::new(key), window));
        self
    }

    /// Chooses each request's **priority class** with `selector` (any key
    /// extractor: a header, a route, a closure), for policies that define
    /// classes ([`PolicyBuilder::class`](portcullis_core::PolicyBuilder::class)):
    /// a class is admitted only while its reserve of the shared allowance
    /// remains after its charge, and its denial's `Retry-After` says when
    /// that class may go again. Exact and atomic in memory and Redis. A
    /// request without a class gets no reserve; a class a policy does not
    /// define is answered `429` without `Retry-After` (a request error).
    ///
    /// ```
    /// use http::Request;
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::{Global, Header, RateLimitLayer};
    /// use tower::{service_fn, Layer, ServiceExt};
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
    ///     .priority(Header::new(http::HeaderName::from_static("x-priority")))
    ///     .build()?;
    /// let service = layer.layer(service_fn(|_req: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// let call = |class: &str| Request::builder().header("x-priority", class).body(()).unwrap();
    /// let mut statuses = Vec::new();
    /// for class in ["batch", "batch", "batch", "critical", "critical", "critical"] {
    ///     statuses.push(service.clone().oneshot(call(class)).await?.status().as_u16());
    /// }
    /// // Batch stops while half remains; critical takes the rest.
    /// assert_eq!(statuses, [200, 200, 429, 200, 200, 429]);
    /// # Ok(()) }
    /// ```
    pub fn priority<P: KeyExtractor>(mut self, selector: P) -> Self {
        self.extended_mut().priority = Some(Box::new(selector));
        self
    }
}

/// Checks the layer's idempotency window at build time.
pub(crate) fn validate(extended: &Extended) -> Result<(), crate::ConfigError> {
    match &extended.idempotency {
        Some((_, window)) if window.is_zero() || *window > MAX_IDEMPOTENCY_WINDOW => {
            Err(crate::ConfigError::IdempotencyWindow { window: *window })
        }
        _ => Ok(()),
    }
}
