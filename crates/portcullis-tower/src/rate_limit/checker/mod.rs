//! [`Checker`], the state the services of one rate-limit layer share, and
//! its methods: the decisions of the layer, independent of how the
//! response future is driven. Each file owns one part of a request's way:
//!
//! - `shared.rs`: the [`Checker`] itself (store, key, tiers, settings,
//!   breaker, deny cache, logs) and its `Debug`;
//! - `step.rs`: what the steps pass along: the request's [`Ticket`], the
//!   [`Next`] step, and what to do after a wait ([`Then`]);
//! - `start.rs`: a new request (its key, cost, tier and options), asking
//!   the store, and the step after a plan lookup;
//! - `verdict.rs`: the store's answer (or error, or timeout) turned into
//!   forward, wait or respond, with the response headers;
//! - `failure.rs`: the store failing or skipped (the failure policy), a
//!   store with no room, and the rate-limited logs.
//!
//! The layer, its builder, the service and the futures sit above; the
//! tiers, options, resolver, deny cache and charge handle below.

mod failure;
mod shared;
mod start;
mod step;
mod verdict;

pub(crate) use shared::{Checker, CostFn, TierFn};
pub(crate) use step::{Next, Then, Ticket};
