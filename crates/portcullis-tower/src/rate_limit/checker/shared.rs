//! [`Checker`], the state the services of one layer share: its store, key
//! extractor, tiers and settings, circuit breaker, deny cache and logs;
//! built once by the layer's builder, read by every request. Its methods
//! are in the sibling files, by step.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::breaker::{Breaker, UndecidedLog};
use crate::config::{FailurePolicy, HeaderMode, MissingKey, Mode};
use crate::key::RequestHead;
use crate::rate_limit::charge::ChargeFn;
use crate::rate_limit::deny_cache::DenyCache;
use crate::rate_limit::options::OptionSources;
use crate::rate_limit::resolve::Live;
use crate::rate_limit::tier::Tier;
use crate::response::LimitedBody;
use crate::top_denied::TopDenied;

/// Chooses a tier by name from a request and its key.
pub(crate) type TierFn =
    Box<dyn for<'a> Fn(&'a RequestHead<'a>, &'a str) -> Option<&'a str> + Send + Sync>;
/// The cost of a request.
pub(crate) type CostFn = Box<dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync>;

/// The state the services of one layer share: its store, key extractor,
/// tiers and settings, circuit breaker and deny cache. Its methods are the
/// steps of a request (`start`, `on_result`, ... in the sibling files).
/// Charging after the response (`post_charge.rs`) reads its store,
/// timeout, breaker and failure policy.
pub(crate) struct Checker<St, K> {
    pub(crate) store: Arc<St>,
    pub(crate) key: K,
    /// Tier 0 holds the default policies (with live limits: those when
    /// the layer was built).
    pub(crate) tiers: Box<[Arc<Tier>]>,
    /// Policies from data (`limits`, `resolve_plan`), when configured.
    pub(crate) live: Option<Live>,
    pub(crate) select_tier: Option<TierFn>,
    pub(crate) cost: Option<CostFn>,
    pub(crate) mode: Mode,
    pub(crate) failure: FailurePolicy,
    pub(crate) timeout: Duration,
    pub(crate) breaker: Breaker,
    pub(crate) deny_cache: Option<DenyCache>,
    pub(crate) missing_key: MissingKey,
    pub(crate) header_mode: HeaderMode,
    pub(crate) legacy_headers: bool,
    pub(crate) info_in_extensions: bool,
    pub(crate) body: LimitedBody,
    /// Requests let through undecided, logged at most once per second.
    pub(crate) undecided: UndecidedLog,
    /// Store errors, logged at most once per second.
    pub(crate) errors: UndecidedLog,
    /// Requests the store refused to check as sent, and requests without
    /// a key that were rejected: each logged at most once per second.
    pub(crate) refused: UndecidedLog,
    pub(crate) rejected: UndecidedLog,
    /// The status of a new subject the store has no room for.
    pub(crate) no_room_status: StatusCode,
    /// The table of the most denied subjects, when the app keeps one:
    /// fed by `limited`, the one place a policy's denial is answered.
    pub(crate) top_denied: Option<TopDenied>,
    /// Charging after the response: the cost of a response head.
    pub(crate) charge: Option<ChargeFn>,
    /// Idempotency keys and priority classes, when configured
    /// (`rate_limit/options.rs`).
    pub(crate) options: Option<OptionSources>,
    /// Whether a request needs nothing but its key (chosen at `build()`):
    /// no tier selector, no cost function, no charge
    /// after the response, no options, no
    /// [`RateLimitInfo`](crate::RateLimitInfo) in the extensions, not a dry
    /// run. The service then takes `start_straight`.
    pub(crate) straight: bool,
}

impl<St, K> fmt::Debug for Checker<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("store", &std::any::type_name::<St>())
            .field("key", &std::any::type_name::<K>())
            .field("tiers", &self.tiers)
            .field("mode", &self.mode)
            .field("failure", &self.failure)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache.is_some())
            .field("missing_key", &self.missing_key)
            .field("header_mode", &self.header_mode)
            .field("legacy_headers", &self.legacy_headers)
            .field("info_in_extensions", &self.info_in_extensions)
            .field("body", &self.body)
            .field("no_room_status", &self.no_room_status)
            .field("top_denied", &self.top_denied.is_some())
            .finish_non_exhaustive()
    }
}

impl<St, K> Checker<St, K> {
    /// The tier for this request: the one the selector names, else the
    /// default.
    pub(crate) fn tier_index(&self, request: &RequestHead<'_>, key: &str) -> usize {
        let Some(select) = &self.select_tier else {
            return 0;
        };
        select(request, key)
            .and_then(|name| self.tiers.iter().skip(1).position(|t| &*t.name == name))
            .map_or(0, |i| i + 1)
    }

    pub(crate) fn cost(&self, request: &RequestHead<'_>) -> u64 {
        self.cost.as_ref().map_or(1, |cost| cost(request))
    }
}
