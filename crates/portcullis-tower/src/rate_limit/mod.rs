//! Rate limits: [`RateLimitLayer`] (a cost per request against a
//! [`Store`](portcullis_core::Store), per key), its builder, service,
//! [`ResponseFuture`] and [`ResponseBody`], charging after the response
//! ([`Charge`]) and per-request policies ([`PlanResolver`]). The layer,
//! service and builder are also at the crate root; the crate docs describe
//! how to use them. Like [`concurrency`](crate::concurrency), this module
//! names its future and body `ResponseFuture` and `ResponseBody`.
//!
//! Inside: the checker state its services share (`checker.rs`) and what it
//! does when the store fails (`failure.rs`), the deny cache, the keep-body
//! variant. Modules both layers use (response
//! building, headers, circuit breaker, metrics, configuration,
//! [`RateLimitInfo`](crate::RateLimitInfo)) live at the crate root.

mod body;
mod charge;
mod checker;
mod deny_cache;
mod failure;
mod future;
mod keep_body;
mod layer;
mod options;
mod resolve;
mod service;
mod tier;

pub use body::ResponseBody;
pub use charge::Charge;
pub use future::ResponseFuture;
pub use keep_body::{KeepBody, KeepBodyFuture, KeepBodyLayer};
pub use layer::{
    RateLimitLayer, RateLimitLayerBuilder, DEFAULT_BREAKER_PAUSE, DEFAULT_BREAKER_THRESHOLD,
    DEFAULT_CHECK_TIMEOUT, DEFAULT_DENY_CACHE_CAPACITY,
};
pub use resolve::{
    LookupKey, Plan, PlanResolver, PlanResolverBuilder, ResolverFailure, DEFAULT_ERROR_TTL,
    DEFAULT_MAX_LOOKUPS, DEFAULT_PLAN_CAPACITY, DEFAULT_PLAN_TTL, DEFAULT_RESOLVE_TIMEOUT,
    DEFAULT_UNKNOWN_TTL,
};
pub use service::RateLimit;
pub(crate) use tier::Tier;
