//! [`ConcurrencyLimitLayer`] and its builder (the state its services share
//! is `gate.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{ConcurrencyPolicy, LeaseStore};

use super::gate::Gate;
use super::service::ConcurrencyLimit;
use crate::breaker::{Breaker, UndecidedLog};
use crate::config::{
    ConfigError, MissingKey, DEFAULT_BREAKER_PAUSE, DEFAULT_BREAKER_THRESHOLD,
    DEFAULT_CHECK_TIMEOUT,
};
use crate::key::{KeyExtractor, PeerIp};
use crate::observe::ConcurrencyLabels;

shared_layer! {
/// A tower `Layer` that allows each key (tenant, user, IP…) at
/// most [`ConcurrencyPolicy::limit`] requests in flight at once, answering
/// the others `429 Too Many Requests` (gRPC `RESOURCE_EXHAUSTED`).
///
/// Each admitted request holds a lease from a [`LeaseStore`] (the
/// in-process [`MemoryStore`](portcullis_core::MemoryStore), or a
/// `RedisStore` shared by every instance) until its response body has been
/// sent, has failed or is dropped, or the request is cancelled; a long
/// request renews its lease every third of the TTL; a crashed instance's
/// leases expire after the TTL. See the [crate docs](crate#concurrency-limits).
///
/// A denied request gets `429` with `Retry-After` (when the earliest live
/// lease expires unless renewed) and no `RateLimit` fields, which describe
/// rates; stacked under a [`RateLimitLayer`](crate::RateLimitLayer), the
/// outer layer adds its own. Requests without a key follow
/// [`MissingKey`]; a failing store follows the failure policy, except a
/// store with no room for a new subject, which denies. As in the rate
/// layer, repeated store-wide failures open a circuit breaker
/// ([`ConcurrencyLimitLayerBuilder::circuit_breaker`]) and store failures
/// are logged at `warn` at most once a second.
///
/// Clones share one configuration and store.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::post, Router};
/// use portcullis::{ConcurrencyPolicy, MemoryStore};
/// use portcullis::tower::{ConcurrencyLimitLayer, Header};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let exports = ConcurrencyLimitLayer::builder(MemoryStore::new())
///     .policy(
///         ConcurrencyPolicy::max_in_flight(2)
///             .lease_ttl(Duration::from_secs(30))
///             .name("exports")
///             .build()?,
///     )
///     .key(Header::new(axum::http::HeaderName::from_static("x-tenant")))
///     .build()?;
/// let app: Router = Router::new()
///     .route("/exports", post(|| async { "done" }))
///     .layer(exports);
/// # let _ = app; Ok(()) }
/// ```
    ConcurrencyLimitLayer,
    ConcurrencyLimit,
    Gate
}

impl<St: LeaseStore> ConcurrencyLimitLayer<St, PeerIp> {
    /// Starts configuring a layer over `store`, keyed by peer IP until
    /// [`ConcurrencyLimitLayerBuilder::key`] says otherwise.
    pub fn builder(store: St) -> ConcurrencyLimitLayerBuilder<St, PeerIp> {
        Self::builder_shared(Arc::new(store))
    }

    /// Like [`ConcurrencyLimitLayer::builder`] with a store shared with
    /// other code (a `RateLimitLayer` over the same store, say).
    pub fn builder_shared(store: Arc<St>) -> ConcurrencyLimitLayerBuilder<St, PeerIp> {
        ConcurrencyLimitLayerBuilder {
            store,
            key: PeerIp::new(),
            settings: Settings {
                policy: None,
                missing_key: None,
                failure: ConcurrencyFailure::default(),
                timeout: DEFAULT_CHECK_TIMEOUT,
                breaker: (DEFAULT_BREAKER_THRESHOLD, DEFAULT_BREAKER_PAUSE),
            },
        }
    }
}

impl<St, K> ConcurrencyLimitLayer<St, K> {
    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<St> {
        &self.shared.store
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> &ConcurrencyPolicy {
        &self.shared.policy
    }
}

/// Configures a [`ConcurrencyLimitLayer`]; see
/// [`ConcurrencyLimitLayer::builder`].
///
/// ```
/// use std::time::Duration;
/// use portcullis::{ConcurrencyPolicy, MemoryStore};
/// use portcullis::tower::{ConcurrencyFailure, ConcurrencyLimitLayer, MissingKey, User};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = ConcurrencyLimitLayer::builder(MemoryStore::new())
///     .policy(ConcurrencyPolicy::max_in_flight(20).build()?)
///     .key(User::<String>::new())
///     .on_missing_key(MissingKey::fallback("anonymous"))
///     .on_store_failure(ConcurrencyFailure::FailClosed)
///     .acquire_timeout(Duration::from_millis(100))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[must_use]
pub struct ConcurrencyLimitLayerBuilder<St, K> {
    store: Arc<St>,
    key: K,
    settings: Settings,
}

/// The settings of a [`ConcurrencyLimitLayerBuilder`] that do not depend on
/// its store or key type, so that [`ConcurrencyLimitLayerBuilder::key`]
/// moves them as one value.
struct Settings {
    policy: Option<ConcurrencyPolicy>,
    /// `None`: a 400 naming what the key extractor reads.
    missing_key: Option<MissingKey>,
    failure: ConcurrencyFailure,
    timeout: Duration,
    breaker: (u32, Duration),
}

/// What a [`ConcurrencyLimitLayer`] does with a request when its store fails
/// or does not answer within the acquire timeout
/// ([`ConcurrencyLimitLayerBuilder::on_store_failure`]). A store with no
/// room for a new subject (a full memory store, Redis at `maxmemory`)
/// denies with `429` whichever is chosen.
///
/// Unlike the rate layer's [`FailurePolicy`](crate::FailurePolicy) there is
/// no fallback store: a permit only means something in the store that
/// holds every other instance's permits.
///
/// ```
/// use portcullis::tower::ConcurrencyFailure;
///
/// assert_eq!(ConcurrencyFailure::default(), ConcurrencyFailure::FailOpen);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ConcurrencyFailure {
    /// The request runs without a permit; counted and logged (at most once
    /// a second).
    #[default]
    FailOpen,
    /// The request is answered `503 Service Unavailable` (gRPC
    /// `UNAVAILABLE`).
    FailClosed,
}

impl<St, K> fmt::Debug for ConcurrencyLimitLayerBuilder<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayerBuilder")
            .field("policy", &self.settings.policy)
            .field("missing_key", &self.settings.missing_key)
            .field("failure", &self.settings.failure)
            .field("timeout", &self.settings.timeout)
            .field("breaker", &self.settings.breaker)
            .finish_non_exhaustive()
    }
}

impl<St: LeaseStore, K: KeyExtractor> ConcurrencyLimitLayerBuilder<St, K> {
    /// The concurrency policy (required).
    pub fn policy(mut self, policy: ConcurrencyPolicy) -> Self {
        self.settings.policy = Some(policy);
        self
    }

    /// Who a request counts against (the peer IP by default): any
    /// [`KeyExtractor`], as for `RateLimitLayer`.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> ConcurrencyLimitLayerBuilder<St, K2> {
        ConcurrencyLimitLayerBuilder {
            store: self.store,
            key,
            settings: self.settings,
        }
    }

    /// What to do with a request without a key (default: `400`).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.settings.missing_key = Some(missing_key);
        self
    }

    /// What to do when the store fails or does not answer within the
    /// acquire timeout: [`ConcurrencyFailure::FailOpen`] (the default: the
    /// request runs without a permit, logged) or
    /// [`ConcurrencyFailure::FailClosed`] (`503`). A store with no room for
    /// a new subject (a full memory store) denies with `429` whichever is
    /// chosen.
    pub fn on_store_failure(mut self, failure: ConcurrencyFailure) -> Self {
        self.settings.failure = failure;
        self
    }

    /// The longest an acquire may take; beyond it the failure policy
    /// applies, and the lease, which may have been granted, is released.
    /// Default: 500 ms, as for
    /// [`RateLimitLayerBuilder::check_timeout`](crate::RateLimitLayerBuilder::check_timeout).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// After `failures` consecutive store-wide failures (unreachable,
    /// timed out: [`StoreError::is_store_wide`](portcullis_core::StoreError::is_store_wide)),
    /// skip the store for `pause`, applying the failure policy at once,
    /// then let one request probe it. Default 5 failures and 1 second, as
    /// for [`RateLimitLayerBuilder::circuit_breaker`](crate::RateLimitLayerBuilder::circuit_breaker);
    /// 0 failures disables the breaker.
    pub fn circuit_breaker(mut self, failures: u32, pause: Duration) -> Self {
        self.settings.breaker = (failures, pause);
        self
    }

    /// Builds the layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoConcurrencyPolicy`] without a policy,
    /// [`ConfigError::ZeroTimeout`] for a zero timeout. (A store without
    /// leases is refused by the compiler: the layer needs a
    /// [`LeaseStore`], such as `MemoryStore`,
    /// `RedisStore` or a `BoxLeaseStore`.)
    pub fn build(self) -> Result<ConcurrencyLimitLayer<St, K>, ConfigError> {
        let policy = self
            .settings
            .policy
            .ok_or(ConfigError::NoConcurrencyPolicy)?;
        if self.settings.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        let fail_closed = self.settings.failure == ConcurrencyFailure::FailClosed;
        #[cfg(feature = "metrics")]
        crate::observe::describe_metrics();
        let missing_key = self.settings.missing_key.unwrap_or_else(|| {
            MissingKey::reject(
                http::StatusCode::BAD_REQUEST,
                crate::response::missing_key_message(&self.key),
            )
        });
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(Gate {
                store: self.store,
                metrics: ConcurrencyLabels::of(policy.name()),
                policy,
                key: self.key,
                missing_key,
                fail_closed,
                timeout: self.settings.timeout,
                breaker: Breaker::new(self.settings.breaker.0, self.settings.breaker.1),
                errors: UndecidedLog::new(),
                undecided: UndecidedLog::new(),
                rejected: UndecidedLog::new(),
            }),
        })
    }
}
