//! Token reservations (issue 36): the stores (`reservations.rs`: memory
//! and Redis decide alike, concurrent reservations, independent
//! instances on one Redis, retried settles, expiry) and the tower layer
//! (`layer.rs`). Needs the servers `cargo xtask test` starts; `cargo xtask
//! test` runs it on both call paths (Redis Functions, and `EVALSHA` with
//! `PORTCULLIS_REDIS_CALL_PATH=evalsha`).
//!
//! One test binary, each module a suite (tests named `<module>::<test>`).

#[path = "../redis_common/mod.rs"]
mod redis_common;

mod layer;
mod processes;
mod reservations;
mod stores;
