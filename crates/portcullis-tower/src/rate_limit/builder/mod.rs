//! [`RateLimitLayerBuilder`]: its settings and their defaults, the ways to
//! start one ([`RateLimitLayer::new`], [`RateLimitLayer::builder`],
//! [`RateLimitLayer::builder_shared`]), and [`build`](RateLimitLayerBuilder::build),
//! which validates the settings, compiles the [`Tier`]s and makes the
//! [`Checker`] the layer's services share. The setters live by concern in
//! the submodules:
//!
//! - `policies.rs`: what a request is checked against and by which key
//!   (policies, tiers, live limits, plans, the key, requests without one);
//! - `cost.rs`: what a request costs, before or after its response;
//! - `options.rs`: idempotency keys and priority classes;
//! - `limited.rs`: what a limited request gets (mode, headers, body);
//! - `failure.rs`: what happens when the store fails or is full.

mod cost;
mod failure;
mod limited;
mod options;
mod policies;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use portcullis_core::{validate_charge, Clock, LimitSet, Limits, Policy, Store};

use super::charge::ChargeFn;
use super::checker::{Checker, CostFn, TierFn};
use super::deny_cache::{DenyCache, LayerClock};
use super::layer::RateLimitLayer;
use super::options::OptionSources;
use super::resolve::{Live, PlanResolver};
use super::tier::Tier;
use crate::breaker::{Breaker, UndecidedLog};
use crate::config::{
    ConfigError, FailurePolicy, HeaderMode, MissingKey, Mode, DEFAULT_BREAKER_PAUSE,
    DEFAULT_BREAKER_THRESHOLD, DEFAULT_CHECK_TIMEOUT,
};
use crate::key::{KeyExtractor, PeerIp};
use crate::response::LimitedBody;

/// Default capacity of the local deny cache (subjects). Not API (the value
/// is documented on [`deny_cache`](RateLimitLayerBuilder::deny_cache));
/// public, hidden, for the workspace's abuse test.
#[doc(hidden)]
pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 65_536;

impl<St: Store> RateLimitLayer<St, PeerIp> {
    /// Limits every peer IP address to `policy`, with all other settings at
    /// their defaults. The peer address must be in the request extensions:
    /// serve Axum with `into_make_service_with_connect_info::<SocketAddr>()`
    /// (without it every request is answered `400`; see [`PeerIp`]).
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Policy::per_second(5).build().unwrap());
    /// # let _ = layer;
    /// ```
    pub fn new(store: St, policy: Policy) -> Self {
        // One policy is always a valid tier.
        Self::builder(store).into_layer(vec![Tier::from_valid(
            portcullis_core::DEFAULT_TIER,
            vec![policy],
        )])
    }

    /// Starts configuring a layer over `store`, keyed by peer IP until
    /// [`RateLimitLayerBuilder::key`] says otherwise.
    pub fn builder(store: St) -> RateLimitLayerBuilder<St, PeerIp> {
        Self::builder_shared(Arc::new(store))
    }

    /// Like [`RateLimitLayer::builder`] with a store shared with other code
    /// (for example another layer, or an admin endpoint that resets keys).
    pub fn builder_shared(store: Arc<St>) -> RateLimitLayerBuilder<St, PeerIp> {
        RateLimitLayerBuilder {
            store,
            key: PeerIp::new(),
            settings: Settings {
                policies: Vec::new(),
                tiers: Vec::new(),
                select_tier: None,
                cost: None,
                mode: Mode::default(),
                failure: FailurePolicy::default(),
                timeout: DEFAULT_CHECK_TIMEOUT,
                breaker: (DEFAULT_BREAKER_THRESHOLD, DEFAULT_BREAKER_PAUSE),
                deny_cache: Some(DEFAULT_DENY_CACHE_CAPACITY),
                clock: None,
                missing_key: None,
                header_mode: HeaderMode::default(),
                legacy_headers: false,
                info_in_extensions: false,
                body: LimitedBody::default(),
                no_room_status: StatusCode::TOO_MANY_REQUESTS,
                charge: None,
                limits: None,
                plans: None,
                options: OptionSources::default(),
                top_denied: None,
            },
        }
    }
}

/// Configures a [`RateLimitLayer`]; finish with
/// [`RateLimitLayerBuilder::build`].
///
/// ```
/// use std::time::Duration;
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{ApiKey, PeerIp, KeyExtractor, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_second(5).name("burst").build()?)
///     .policy(Policy::per_hour(1_000).name("hourly").build()?)
///     .key(ApiKey::new().or(PeerIp::new()))
///     .cost(|request| if request.method() == axum::http::Method::POST { 2 } else { 1 })
///     .shape(Duration::from_millis(200))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[must_use = "a builder does nothing until .build() is called"]
pub struct RateLimitLayerBuilder<St, K> {
    store: Arc<St>,
    key: K,
    settings: Settings,
}

/// The settings of a [`RateLimitLayerBuilder`] that do not depend on its
/// store or key type, so that [`RateLimitLayerBuilder::key`] moves them as
/// one value.
struct Settings {
    policies: Vec<Policy>,
    tiers: Vec<(String, Vec<Policy>)>,
    select_tier: Option<TierFn>,
    cost: Option<CostFn>,
    mode: Mode,
    failure: FailurePolicy,
    timeout: Duration,
    breaker: (u32, Duration),
    deny_cache: Option<usize>,
    /// The deny cache's clock; `None`: tokio's.
    clock: Option<Arc<dyn Clock>>,
    /// `None`: a 400 naming what the key extractor reads.
    missing_key: Option<MissingKey>,
    header_mode: HeaderMode,
    legacy_headers: bool,
    info_in_extensions: bool,
    body: LimitedBody,
    no_room_status: StatusCode,
    charge: Option<ChargeFn>,
    limits: Option<Limits>,
    plans: Option<PlanResolver>,
    /// Idempotency keys and priority classes (`rate_limit/options.rs`).
    options: OptionSources,
    top_denied: Option<crate::top_denied::TopDenied>,
}

impl<St, K> fmt::Debug for RateLimitLayerBuilder<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("policies", &self.settings.policies)
            .field("tiers", &self.settings.tiers)
            .field("mode", &self.settings.mode)
            .field("failure", &self.settings.failure)
            .field("timeout", &self.settings.timeout)
            .finish_non_exhaustive()
    }
}

impl<St: Store, K: KeyExtractor> RateLimitLayerBuilder<St, K> {
    /// Validates the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`]: [`NoPolicies`](ConfigError::NoPolicies) when
    /// there is no default policy, [`EmptyTier`](ConfigError::EmptyTier) or
    /// [`DuplicateTier`](ConfigError::DuplicateTier) for a tier that is
    /// empty or defined twice, [`InvalidPolicies`](ConfigError::InvalidPolicies)
    /// when two policies of one tier share a name,
    /// [`ZeroTimeout`](ConfigError::ZeroTimeout) for a zero check timeout,
    /// [`PoliciesWithLimits`](ConfigError::PoliciesWithLimits) for policies
    /// or tiers given beside a live [`limits`](Self::limits) handle,
    /// [`IdempotencyWindow`](ConfigError::IdempotencyWindow) for an
    /// [`idempotency_key`](Self::idempotency_key) window of zero or above
    /// 30 days, and [`ChargeAfterResponse`](ConfigError::ChargeAfterResponse)
    /// when [`charge_from_response`](Self::charge_from_response) is
    /// combined with [`cost`](Self::cost) or a tier has a policy whose
    /// algorithm cannot be charged after the response (only GCRA and token
    /// bucket can).
    pub fn build(mut self) -> Result<RateLimitLayer<St, K>, ConfigError> {
        if self.settings.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        super::options::validate(&self.settings.options)?;
        if let Some(limits) = &self.settings.limits {
            if !self.settings.policies.is_empty() || !self.settings.tiers.is_empty() {
                return Err(ConfigError::PoliciesWithLimits);
            }
            // The defaults in force, for `policies()` and the checks below.
            self.settings.policies = limits.load().defaults().to_vec();
        }
        let mut tiers = vec![Tier::new(
            portcullis_core::DEFAULT_TIER,
            std::mem::take(&mut self.settings.policies),
        )?];
        for (name, policies) in std::mem::take(&mut self.settings.tiers) {
            if tiers.iter().any(|t| *t.name == *name) {
                return Err(ConfigError::DuplicateTier { tier: name });
            }
            tiers.push(Tier::new(&name, policies)?);
        }
        // A resolver without a handle: the static tiers as fixed limits.
        if self.settings.limits.is_none() && self.settings.plans.is_some() {
            let mut set = LimitSet::builder().policies(tiers[0].policies.iter().cloned());
            for tier in &tiers[1..] {
                set = set.tier(&*tier.name, tier.policies.iter().cloned());
            }
            let set = set
                .build()
                .map_err(|source| ConfigError::Limits { source })?;
            self.settings.limits = Some(Limits::new(set));
        }
        if let Some(limits) = &self.settings.limits {
            let set = limits.load();
            let sets = set
                .tiers()
                .map(|(name, policies)| (name.to_owned(), policies.clone()));
            for (name, policies) in sets.chain(set.overrides().filter_map(|(subject, o)| match o {
                portcullis_core::Override::Policies(p) => Some((subject.to_owned(), p.clone())),
                _ => None,
            })) {
                if self.settings.charge.is_some() {
                    validate_charge(&policies).map_err(|source| {
                        ConfigError::ChargeAfterResponse {
                            tier: Some(name),
                            source: Some(source),
                        }
                    })?;
                }
            }
        }
        if self.settings.charge.is_some() {
            if self.settings.cost.is_some() {
                return Err(ConfigError::ChargeAfterResponse {
                    tier: None,
                    source: None,
                });
            }
            for tier in &tiers {
                validate_charge(&tier.policies).map_err(|source| {
                    ConfigError::ChargeAfterResponse {
                        tier: Some(tier.name.to_string()),
                        source: Some(source),
                    }
                })?;
            }
        }
        Ok(self.into_layer(tiers))
    }

    /// The layer, from a validated configuration and its tiers (the default
    /// tier first); `settings.policies` and `settings.tiers` are not read.
    /// Every way of making a layer ends here, so each describes the metrics.
    fn into_layer(self, tiers: Vec<Tier>) -> RateLimitLayer<St, K> {
        #[cfg(feature = "metrics")]
        crate::observe::describe_metrics();
        let live = self
            .settings
            .limits
            .map(|limits| Live::new(limits, self.settings.plans));
        let tiers: Box<[Arc<Tier>]> = tiers
            .into_iter()
            .enumerate()
            .map(|(slot, mut tier)| {
                tier.slot = slot;
                Arc::new(tier)
            })
            .collect();
        // A held denial is one class's, or one idempotency key's: with
        // either, every check goes to the store.
        let deny_cache = self
            .settings
            .deny_cache
            .filter(|_| self.settings.options.is_empty())
            .map(|capacity| {
                let clock = match self.settings.clock {
                    Some(clock) => LayerClock::Given(clock),
                    None => LayerClock::Tokio(tokio::time::Instant::now()),
                };
                DenyCache::new(tiers.len(), capacity, clock)
            });
        let options = (!self.settings.options.is_empty()).then_some(self.settings.options);
        let missing_key = self.settings.missing_key.unwrap_or_else(|| {
            MissingKey::reject(
                http::StatusCode::BAD_REQUEST,
                crate::response::missing_key_message(&self.key),
            )
        });
        let straight = self.settings.select_tier.is_none()
            && self.settings.cost.is_none()
            && self.settings.charge.is_none()
            && options.is_none()
            && !self.settings.info_in_extensions
            && self.settings.mode != Mode::DryRun;
        RateLimitLayer {
            shared: Arc::new(Checker {
                store: self.store,
                key: self.key,
                tiers,
                live,
                select_tier: self.settings.select_tier,
                cost: self.settings.cost,
                mode: self.settings.mode,
                failure: self.settings.failure,
                timeout: self.settings.timeout,
                breaker: Breaker::new(self.settings.breaker.0, self.settings.breaker.1),
                deny_cache,
                missing_key,
                header_mode: self.settings.header_mode,
                legacy_headers: self.settings.legacy_headers,
                info_in_extensions: self.settings.info_in_extensions,
                body: self.settings.body,
                undecided: UndecidedLog::new(),
                errors: UndecidedLog::new(),
                refused: UndecidedLog::new(),
                rejected: UndecidedLog::new(),
                no_room_status: self.settings.no_room_status,
                top_denied: self.settings.top_denied,
                charge: self.settings.charge,
                options,
                straight,
            }),
        }
    }
}
