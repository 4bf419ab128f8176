//! The layer end to end over Axum, Hyper and Tonic, its metrics, and live
//! limits.
//!
//! One test binary (each module is one suite of its own, its tests
//! named `<module>::<test>`), so the stack is compiled and linked
//! once for all of them.

#[path = "../limits_common/mod.rs"]
mod limits_common;

mod limits_live;
mod testing_kit;
mod tower_axum_e2e;
mod tower_hyper_e2e;
mod tower_metrics;
mod tower_tonic_e2e;
