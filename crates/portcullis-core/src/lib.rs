//! Exact rate-limiting algorithms and the `Store` trait behind portcullis.
//!
//! Depend on the `portcullis` facade, not on this crate: the facade
//! re-exports what applications and store implementors use (the latter in
//! `portcullis::store`), and its docs are the reference. Items marked
//! `#[doc(hidden)]` here are shared with the sibling crates only and
//! change without notice.
//!
//! ```
//! use portcullis::{MemoryStore, Policy, Store};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let per_second = Policy::per_second(10).name("per-second").build()?;
//! let per_day = Policy::per_day(1_000).name("per-day").build()?;
//! let policies = [per_second, per_day];
//!
//! let verdict = store.check("user:42", &policies, 1).await?;
//! assert!(verdict.is_allowed());
//! assert_eq!(verdict.decisions()[0].remaining(), 9);
//! assert_eq!(verdict.decisions()[1].remaining(), 999);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Algorithms
//!
//! | algorithm | state per key | pick it when |
//! |---|---|---|
//! | [`Algorithm::Gcra`] (default) | one timestamp | a smooth rate with a burst; cheapest; redis-cell compatible |
//! | [`Algorithm::TokenBucket`] | tokens + time | you think in tokens refilled over time |
//! | [`Algorithm::LeakyBucket`] meter | level + time | a bucket that rejects when full |
//! | [`Algorithm::LeakyBucket`] queue | one timestamp | smoothing: admit and delay to a steady rate |
//! | [`Algorithm::FixedWindow`] | counter | "N per calendar minute/day", quotas that reset at a known time |
//! | [`Algorithm::SlidingWindow`] | two counters | window semantics without the boundary burst |
//! | [`Algorithm::SlidingLog`] | one entry per permit | exact rolling window, small limits (≤ 10 000) |
//!
//! Besides rates, a [`ConcurrencyPolicy`] limits a subject to N permits in
//! flight, each a lease that expires unless renewed; [`MemoryStore`] and
//! `portcullis-redis`'s
//! `RedisStore` hold leases through the [`LeaseStore`] trait.

// Never a panic on a caller's input or a server's reply: no `unwrap`,
// `expect`, `panic!` or `unreachable!` outside tests (clippy, which
// `cargo xtask test` runs with `-D warnings`).
#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]
// docs.rs shows which feature each item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The modules, top-down: each uses only the ones below it (a module's
// submodules are part of it). The stores (`memory`, and `boxed`: any store
// behind one type) above the `Store` trait (`store`), `limits_file` (limits
// read from TOML) and `limits` (limits as data), `reserve` (token
// reservations: budgets, the `ReservationStore` trait), above `options` (what a
// check may carry), above `validate` (the request checks every store
// applies), above `algorithms` (the pure functions), above `concurrency`
// (concurrency policies, the `LeaseStore` trait), above the leaves
// (`policy`, `decision`, `error`, `clock`, `subject`). `testing` (the
// test kit's failing store) wraps any store, above them all.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

mod boxed;
mod memory;

#[cfg(feature = "config")]
mod limits_file;
mod store;

mod limits;
mod options;
mod reserve;

mod validate;

// The algorithms as pure functions, which the Redis store re-runs for its
// replies: shared with the sibling crates, not part of the API.
#[doc(hidden)]
pub mod algorithms;

mod concurrency;

mod clock;
mod decision;
mod error;
mod policy;
pub mod subject;

pub use boxed::{
    BoxAcquireFuture, BoxCheckFuture, BoxLeaseStore, BoxReleaseFuture, BoxRenewFuture,
    BoxResetFuture, BoxStore,
};
pub use clock::{Clock, FastClock, ManualClock, MonotonicClock, SystemClock};
pub use concurrency::{
    ConcurrencyPolicy, ConcurrencyPolicyBuilder, ConcurrencyPolicyError, Lease, LeaseDecision,
    LeaseId, LeaseStore, MAX_IN_FLIGHT, MAX_LEASE_TTL, MIN_LEASE_TTL,
};
pub use decision::{Decision, Verdict};
pub use error::{ErrorScope, StoreError};
pub use limits::{
    LimitSet, LimitSetBuilder, Limits, LimitsError, LimitsSubscription, Override, PolicySource,
    Selected,
};
// Defaults the sibling crates share; documented on the setters, not API.
#[doc(hidden)]
pub use limits::DEFAULT_TIER;
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub use limits_file::{LimitsFile, LimitsFileError, Reload, Watcher};
#[doc(hidden)]
pub use memory::DEFAULT_MAX_KEYS;
pub use memory::{MemoryStore, MemoryStoreBuilder, WhenFull};
#[doc(hidden)]
pub use options::DEFAULT_FREE_REPLAYS;
pub use options::{
    CheckOptions, CheckPlan, Checked, Record, MAX_FINGERPRINT_LEN, MAX_IDEMPOTENCY_KEY_LEN,
    MAX_IDEMPOTENCY_WINDOW,
};
pub use policy::{
    Algorithm, LeakyMode, Policy, PolicyBuilder, PolicyError, MAX_MAGNITUDE, MAX_POLICY_NAME_LEN,
    SLIDING_LOG_MAX_LIMIT,
};
pub use reserve::{
    validate_reserve, validate_settle, Refusal, ReservationId, ReservationStore, Reserved,
    SettleOutcome, Settlement, TokenBudget, TokenBudgetBuilder, TokenBudgetError,
};
pub use store::Store;
pub use validate::{validate_charge, validate_check, validate_subjects};
