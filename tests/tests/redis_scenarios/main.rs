//! Redis scenarios on the Functions path (local budgets also on the
//! `EVALSHA` path, each test choosing its path itself): local budgets, the
//! client clock, timeouts and error chains, start-up, production settings,
//! Sentinel, an unreachable server, and the reliability scenarios (faults,
//! a Cluster under failover).
//!
//! One test binary (each module is one suite of its own, its tests
//! named `<module>::<test>`), so the stack is compiled and linked
//! once for all of them.

#[path = "../budget_common/mod.rs"]
mod budget_common;
#[path = "../redis_common/mod.rs"]
mod redis_common;

mod redis_budget;
mod redis_budget_evalsha;
mod redis_budget_reset;
mod redis_client_clock;
mod redis_coalesce_timeout;
mod redis_error_chain;
mod redis_full_start;
mod redis_limits;
mod redis_production;
mod redis_sentinel;
mod redis_unreachable;
mod reliability_cluster;
mod reliability_faults;
