//! The Redis suites that `cargo xtask test` runs on both call paths:
//! Redis Functions (the default), then again on the `EVALSHA` fallback
//! (`PORTCULLIS_REDIS_CALL_PATH=evalsha`, `cargo test --test redis_paths`).
//!
//! One test binary (each module is one suite of its own, its tests
//! named `<module>::<test>`), so the stack is compiled and linked
//! once for all of them.

#[path = "../redis_common/mod.rs"]
mod redis_common;

mod charge_after_response;
mod concurrency_limit;
mod redis_bad_input;
mod redis_compat;
mod redis_concurrency;
mod redis_differential;
mod redis_magnitudes;
mod redis_options;
mod redis_policy_change;
mod redis_restart;
mod redis_ttl;
