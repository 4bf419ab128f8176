//! Per-request policies from data: an async [`PlanResolver`] behind a
//! bounded cache (capacity a hard bound, loading entries included; a
//! bound on lookups in flight; eviction of negative entries first, then
//! the least recently used) with single-flight, and the layer's side of
//! live [`Limits`](portcullis_core::Limits). The checker asks [`Live`]
//! for a request's tier. Each file imports only the files below it:
//!
//! - `live.rs`: [`Live`], what a layer whose policies come from data holds:
//!   the compiled set in force, swapped by the writer, and the tier a
//!   request gets (override, plan, chosen tier, defaults);
//! - `resolver.rs`: [`PlanResolver`] and its builder, with their defaults;
//! - `cache.rs`: the resolver's sharded cache and the lookups it runs;
//! - `compiled.rs`: a [`LimitSet`](portcullis_core::LimitSet) compiled
//!   into tiers, and the tier a cached answer gives under it;
//! - `plan.rs`: what a lookup answers ([`Plan`]), is given ([`LookupKey`]),
//!   and does on failure ([`ResolverFailure`]), and the internal forms
//!   of an answer (`Cached`, `Picked`, `Lookup`).

mod cache;
mod compiled;
mod live;
mod plan;
mod resolver;

pub(crate) use live::Live;
pub(crate) use plan::{Cached, Lookup, Picked};
pub use plan::{LookupKey, Plan, ResolverFailure};
pub use resolver::{PlanResolver, PlanResolverBuilder, DEFAULT_ERROR_TTL, DEFAULT_PLAN_TTL};
