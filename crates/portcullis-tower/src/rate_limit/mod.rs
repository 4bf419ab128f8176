//! Rate limits: [`RateLimitLayer`] (cost per key against a
//! [`Store`](portcullis_core::Store)), its builder, service and response
//! future, the limiter state its services share, the deny cache, charging
//! after the response, per-request policies ([`PlanResolver`]) and the
//! response body. The crate docs describe it for users.
//!
//! Modules both layers use (response building, headers, circuit breaker,
//! metrics, configuration, [`RateLimitInfo`](crate::RateLimitInfo)) live at
//! the crate root.

mod body;
mod charge;
mod deny_cache;
mod future;
mod keep_body;
mod layer;
mod limiter;
mod resolve;
mod service;

pub use body::RateLimitBody;
pub use charge::Charge;
pub use future::ResponseFuture;
pub use keep_body::{KeepBody, KeepBodyFuture, KeepBodyLayer};
pub(crate) use layer::Tier;
pub use layer::{
    RateLimitLayer, RateLimitLayerBuilder, DEFAULT_BREAKER_PAUSE, DEFAULT_BREAKER_THRESHOLD,
    DEFAULT_CHECK_TIMEOUT, DEFAULT_DENY_CACHE_CAPACITY,
};
pub use resolve::{
    Plan, PlanResolver, PlanResolverBuilder, ResolverFailure, DEFAULT_ERROR_TTL,
    DEFAULT_PLAN_CAPACITY, DEFAULT_PLAN_TTL, DEFAULT_RESOLVE_TIMEOUT, DEFAULT_UNKNOWN_TTL,
};
pub use service::RateLimit;
