//! Rate limits: [`RateLimitLayer`] (a cost per request against a
//! [`Store`](portcullis_core::Store), per key), its builder, service,
//! [`ResponseFuture`] and [`ResponseBody`], charging after the response
//! ([`Charge`]) and per-request policies ([`PlanResolver`]). The layer,
//! service and builder are also at the crate root; the crate docs describe
//! how to use them. Like [`concurrency`](crate::concurrency), this module
//! names its future and body `ResponseFuture` and `ResponseBody`.
//!
//! Inside, each file imports only files below it:
//!
//! | file | owns |
//! |---|---|
//! | `builder/` | [`RateLimitLayerBuilder`], its settings and defaults, `build` (setters by concern in its submodules) |
//! | `layer.rs` | [`RateLimitLayer`]: the `Layer`, and what a built layer answers |
//! | `keep_body.rs` | [`KeepBodyLayer`] and its service and future |
//! | `service.rs` | [`RateLimit`], the service: starts the check in `call` |
//! | `future.rs` | [`ResponseFuture`]: drives the check, waits, calls the inner service |
//! | `post_charge.rs` | charging the store after the response |
//! | `checker/` | the state the services share and the decisions of a request |
//! | `options.rs` | idempotency keys and classes: what a request carries, and its check |
//! | `resolve/` | per-request policies from data: [`PlanResolver`], live limits |
//! | `charge.rs` | the [`Charge`] handle a handler adjusts |
//! | `deny_cache.rs` | denials held locally until their retry time |
//! | `tier.rs` | `Tier`: what a request is checked against, compiled once |
//! | `body.rs` | [`ResponseBody`] |
//!
//! Modules both layers use (response building, headers, circuit breaker,
//! metrics, configuration, [`RateLimitInfo`](crate::RateLimitInfo)) live at
//! the crate root, below both.

mod body;
mod builder;
mod charge;
mod checker;
mod deny_cache;
mod future;
mod keep_body;
mod layer;
mod options;
mod post_charge;
mod resolve;
mod service;
mod tier;

pub use crate::config::{DEFAULT_BREAKER_PAUSE, DEFAULT_BREAKER_THRESHOLD, DEFAULT_CHECK_TIMEOUT};
pub use body::ResponseBody;
pub use builder::{RateLimitLayerBuilder, DEFAULT_DENY_CACHE_CAPACITY};
pub use charge::Charge;
pub use future::ResponseFuture;
pub use keep_body::{KeepBody, KeepBodyFuture, KeepBodyLayer};
pub use layer::RateLimitLayer;
pub use resolve::{
    LookupKey, Plan, PlanResolver, PlanResolverBuilder, ResolverFailure, DEFAULT_ERROR_TTL,
    DEFAULT_PLAN_TTL,
};
pub use service::RateLimit;
