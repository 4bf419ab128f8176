//! Exact rate limiting for Rust services that run as several instances: one
//! set of algorithms that decides the same in process memory and in Redis
//! (standalone, Cluster, Sentinel, TLS), a tower
//! [`RateLimitLayer`](tower::RateLimitLayer) for
//! Axum, Tonic and Hyper, and keyed concurrency limits.
//!
//! This is the crate to depend on. What it offers is the product; the
//! `portcullis-core`, `portcullis-tower` and `portcullis-redis` crates
//! underneath are its parts, and their paths are not the ones to use.
//!
//! # Start here
//!
//! | you want | use |
//! |---|---|
//! | a limit: "10 per second, bursts of 20" | [`Policy`] (`Policy::per_second(10).burst(20).name("api").build()?`) |
//! | the limit on an Axum / Tonic / Hyper service | [`tower::RateLimitLayer`] |
//! | state in this process | [`MemoryStore`] |
//! | state shared by every instance | `redis::RedisStore` (feature `redis`) |
//! | who is limited | the key extractors: [`tower::PeerIp`], [`tower::ClientIp`] (behind proxies), [`tower::ApiKey`], [`tower::BearerToken`], [`tower::Header`], [`tower::User`], `tower::MatchedRoute` (feature `axum`), [`tower::Global`], or a closure |
//! | a decision without a layer | [`Store::check`], answering a [`Verdict`] of [`Decision`]s |
//!
//! Everything else is a choice on one of these: the table below says
//! where each capability lives.
//!
//! # An Axum server, limited per client IP
//!
//! With `portcullis` (feature `axum`), `axum` and `tokio` (feature `full`)
//! as dependencies:
//!
//! ```no_run
//! use std::net::SocketAddr;
//!
//! use axum::{routing::get, Router};
//! use portcullis::tower::RateLimitLayer;
//! use portcullis::{MemoryStore, Policy};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // 10 requests per second per client IP, in bursts of up to 20.
//!     let policy = Policy::per_second(10).burst(20).name("api").build()?;
//!     let app = Router::new()
//!         .route("/", get(|| async { "hello" }))
//!         .layer(RateLimitLayer::new(MemoryStore::new(), policy));
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // The layer keys by the peer address: serve with connect info.
//!     axum::serve(
//!         listener,
//!         app.into_make_service_with_connect_info::<SocketAddr>(),
//!     )
//!     .await?;
//!     Ok(())
//! }
//! ```
//!
//! A limited request gets `429 Too Many Requests` with `Retry-After` and the
//! IETF `RateLimit-Policy` / `RateLimit` fields; admitted responses carry
//! `RateLimit` too.
//!
//! # Capabilities
//!
//! | capability | where |
//! |---|---|
//! | six algorithms (GCRA by default, token and leaky bucket, fixed and sliding window, sliding log), the same in memory and in Redis | [`Algorithm`], [`PolicyBuilder::algorithm`] |
//! | several limits per subject (10/s and 1 000/day), checked all or nothing | [`RateLimitLayerBuilder::policy`](tower::RateLimitLayerBuilder::policy) several times; [`Store::check`] with several policies |
//! | expensive requests cost more | [`RateLimitLayerBuilder::cost`](tower::RateLimitLayerBuilder::cost) |
//! | a cost known after the response (failed logins, LLM tokens) | [`RateLimitLayerBuilder::charge_from_response`](tower::RateLimitLayerBuilder::charge_from_response), [`tower::Charge`] |
//! | idempotency keys: a retried request is answered with its first decision, not charged twice | [`RateLimitLayerBuilder::idempotency_key`](tower::RateLimitLayerBuilder::idempotency_key); [`CheckOptions::idempotency_key`] with [`Store::check_with`] |
//! | priority classes: reserve part of a limit for important traffic | [`PolicyBuilder::class`], [`RateLimitLayerBuilder::priority`](tower::RateLimitLayerBuilder::priority); [`CheckOptions::class`] |
//! | plans and tiers (free, pro, per-customer overrides) | [`RateLimitLayerBuilder::tier`](tower::RateLimitLayerBuilder::tier), [`tier_by`](tower::RateLimitLayerBuilder::tier_by), [`resolve_plan`](tower::RateLimitLayerBuilder::resolve_plan) with a [`tower::PlanResolver`] (a database, a billing API) |
//! | live limits: change policies, tiers and overrides without a restart | [`Limits`] (a [`LimitSet`] swapped atomically) and [`RateLimitLayerBuilder::limits`](tower::RateLimitLayerBuilder::limits); `LimitsFile` reads one from TOML and reloads it (feature `config`) |
//! | token budgets for AI gateways: reserve an estimate at admission, settle the usage when the (streamed) response ends, refund, overage cap, streams in flight | [`TokenBudget`], [`ReservationStore`] |
//! | at most N requests running per key, as leases that expire | [`tower::ConcurrencyLimitLayer`], [`ConcurrencyPolicy`], [`LeaseStore`] |
//! | try a limit before enforcing it, or delay instead of reject | [`tower::Mode`], [`RateLimitLayerBuilder::shape`](tower::RateLimitLayerBuilder::shape) |
//! | the store is down: fail open, fail closed or a local fallback, a timeout, a circuit breaker | [`tower::FailurePolicy`], [`RateLimitLayerBuilder::check_timeout`](tower::RateLimitLayerBuilder::check_timeout), [`RateLimitLayerBuilder::circuit_breaker`](tower::RateLimitLayerBuilder::circuit_breaker) |
//! | fewer Redis calls on hot subjects: concurrent checks share one call (exact, on by default) | `RedisStoreBuilder::coalesce` (feature `redis`) |
//! | the local budget: a slice of a subject's allowance spent in process, with a stated overshoot bound | `redis::LocalBudget`, `RedisStoreBuilder::local_budget` (feature `redis`) |
//! | Redis or memory chosen at start-up | `redis::store_from_env` (a [`BoxLeaseStore`]), [`BoxStore`] |
//! | redis-cell's `CL.THROTTLE` and a Redisson-style limiter, on the same scripts | `RedisStore::throttle`, `RedisStore::rate_limiter` (feature `redis`) |
//! | your own store | [`store`]: the contract and the helpers |
//!
//! The [`tower`](mod@tower) module's page shows the layer's choices with
//! examples; the `redis` module's page (feature `redis`) shows the
//! deployments (Cluster, Sentinel, TLS, ACL users, your own pool).
//!
//! # Feature flags
//!
//! | feature | adds |
//! |---|---|
//! | `tower` (default) | [`tower`](mod@tower): [`RateLimitLayer`](tower::RateLimitLayer), [`ConcurrencyLimitLayer`](tower::ConcurrencyLimitLayer), key extractors, headers |
//! | `axum` | peer addresses from Axum's `ConnectInfo`, `MatchedRoute` |
//! | `tonic` | peer addresses from Tonic; limited calls answered as `tonic::Status` (`RESOURCE_EXHAUSTED`) with `RetryInfo` and `QuotaFailure` details |
//! | `metrics` | counters and a latency histogram per policy through the `metrics` crate |
//! | `config` | `LimitsFile`: policies, tiers and per-subject overrides from a TOML file, with reload (the live [`Limits`] handle needs no feature) |
//! | `testing` | `testing`: a store that fails on command, `RateLimit` headers read back as numbers (the [`ManualClock`] needs no feature) |
//! | `redis` | `redis`: `RedisStore` on standalone Redis, Cluster or Sentinel, ACL users, your own client or bb8 pool; the local budget; redis-cell and Redisson compatibility |
//! | `tls` | `rediss://` through rustls, trusting the system's roots; `tls-webpki-roots` trusts the compiled-in Mozilla roots, `tls-insecure` accepts `#insecure` URLs (tests only) |
//!
//! # Stability
//!
//! The items of this crate's pages are its API. The sibling crates
//! share some internals through `#[doc(hidden)]` items (the algorithms'
//! arithmetic, which the Redis store re-runs); those are not part of it
//! and change without notice.
//!
//! # Several instances: Redis
//!
//! With feature `redis`, the same layer over a `RedisStore` shares every
//! limit across instances. `build()` connects and checks the credentials
//! and permissions, so a misconfiguration fails at start-up with a message
//! that says what to fix:
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn layer() -> Result<(), Box<dyn std::error::Error>> {
//! use portcullis::redis::RedisStore;
//! use portcullis::tower::{ApiKey, RateLimitLayer};
//! use portcullis::Policy;
//!
//! let store = RedisStore::builder()
//!     .url("redis://127.0.0.1:6379") // or .cluster([..]), .sentinel(..), rediss:// with `tls`
//!     .build()
//!     .await?;
//! let layer = RateLimitLayer::builder(store)
//!     .policy(Policy::per_minute(600).name("api").build()?)
//!     .key(ApiKey::new()) // hashed before it reaches Redis
//!     .build()?;
//! # let _ = layer; Ok(()) }
//! ```
//!
//! `portcullis::redis::store_from_env("REDIS_URL")` picks Redis when the
//! variable is set and memory otherwise, as one [`BoxLeaseStore`].
//!
//! # gRPC with Tonic
//!
//! With feature `tonic`, the layer goes on a Tonic server; a limited call
//! gets status `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` and
//! `google.rpc.QuotaFailure` details:
//!
//! ```no_run
//! // Also add: cargo add tonic tonic-health
//! # #[cfg(feature = "tonic")]
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! # let (_reporter, service) = tonic_health::server::health_reporter();
//! use portcullis::tower::{PeerIp, RateLimitLayer};
//! use portcullis::{MemoryStore, Policy};
//!
//! let layer = RateLimitLayer::builder(MemoryStore::new())
//!     .policy(Policy::per_minute(60).name("grpc").build()?)
//!     .key(PeerIp::new()) // Tonic's TcpConnectInfo
//!     .build()?;
//! tonic::transport::Server::builder()
//!     .layer(layer)
//!     .add_service(service)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Without a layer
//!
//! A store answers checks directly: several policies of one subject are
//! decided in one atomic step, all or nothing.
//!
//! ```
//! use portcullis::{MemoryStore, Policy, Store};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let policies = [
//!     Policy::per_second(10).name("burst").build()?,
//!     Policy::per_day(1_000).name("daily").build()?,
//! ];
//! let verdict = store.check("user:42", &policies, 1).await?;
//! assert!(verdict.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

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

// The product, by concern. Each item's page says what it is for.
pub use portcullis_core::{
    // Policies and what a check answers.
    Algorithm,
    // Stores, and the trait to use one directly.
    BoxLeaseStore,
    BoxStore,
    CheckOptions,
    Checked,
    // Time.
    Clock,
    // Concurrency limits.
    ConcurrencyPolicy,
    ConcurrencyPolicyBuilder,
    ConcurrencyPolicyError,
    Decision,
    ErrorScope,
    FastClock,
    LeakyMode,
    Lease,
    LeaseDecision,
    LeaseId,
    LeaseStore,
    // Limits as data: tiers, overrides, swapped live.
    LimitSet,
    LimitSetBuilder,
    Limits,
    LimitsError,
    LimitsSubscription,
    ManualClock,
    MemoryStore,
    MemoryStoreBuilder,
    MonotonicClock,
    Override,
    Policy,
    PolicyBuilder,
    PolicyError,
    PolicySource,
    // Token budgets: reserve at admission, settle from the response.
    Refusal,
    ReservationId,
    ReservationStore,
    Reserved,
    Selected,
    SettleOutcome,
    Settlement,
    Store,
    StoreError,
    SystemClock,
    TokenBudget,
    TokenBudgetBuilder,
    TokenBudgetError,
    Verdict,
    WhenFull,
    // Bounds a request or a policy is held to.
    MAX_FINGERPRINT_LEN,
    MAX_IDEMPOTENCY_KEY_LEN,
    MAX_IDEMPOTENCY_WINDOW,
    MAX_IN_FLIGHT,
    MAX_LEASE_TTL,
    MAX_MAGNITUDE,
    MAX_POLICY_NAME_LEN,
    MIN_LEASE_TTL,
    SLIDING_LOG_MAX_LIMIT,
};
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub use portcullis_core::{LimitsFile, LimitsFileError, Reload, Watcher};

pub use portcullis_core::subject;

// The algorithms' arithmetic, shared with the sibling crates: not API.
#[doc(hidden)]
pub use portcullis_core::algorithms;

pub mod store {
    //! For writing your own store: what a [`Store`](crate::Store) or
    //! [`LeaseStore`](crate::LeaseStore) implementation needs beyond the
    //! traits. An application that uses [`MemoryStore`](crate::MemoryStore)
    //! or `RedisStore` never needs this module.
    //!
    //! A store's contract is on the traits' pages. In short:
    //!
    //! - refuse what no store may decide, alike: [`validate_check`] before
    //!   a check or peek, [`validate_charge`] before a charge (a cost above
    //!   a policy's limit, an empty policy list, names that repeat);
    //! - decide every policy of one call in one atomic step, all or
    //!   nothing, through the current policy (stored state a changed policy
    //!   cannot produce is clamped, never an error);
    //! - with [`CheckOptions`], call [`plan`]: it
    //!   validates the options against the policies and returns the
    //!   [`CheckPlan`] (each policy's class reserve, the idempotency
    //!   [`Record`] to keep beside the subject's state);
    //! - a store held boxed answers with the `Box*Future` types below, at
    //!   most one allocation per call;
    //! - subjects reach keys through [`subject`](crate::subject)'s encoding.
    //!
    //! The differential tests (`tests/` in the repository) hold the memory
    //! and Redis stores to the same decisions; a new store is best tested
    //! the same way against [`MemoryStore`](crate::MemoryStore).

    pub use portcullis_core::{
        validate_charge, validate_check, validate_reserve, validate_settle, validate_subjects,
        BoxAcquireFuture, BoxCheckFuture, BoxReleaseFuture, BoxRenewFuture, BoxResetFuture,
        CheckPlan, Record,
    };

    use portcullis_core::{CheckOptions, Policy, StoreError};

    /// Validates a check with `options` (as [`validate_check`], plus the
    /// options) and plans it: each policy's reserve in permits for the
    /// options' class, in order, and the idempotency [`Record`] to consult
    /// and write. A store calls it once per
    /// [`Store::check_with`](crate::Store::check_with).
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{store, CheckOptions, Policy};
    ///
    /// let policies = [Policy::per_second(10).class("batch", 50).build()?];
    /// let plan = store::plan(&CheckOptions::new().class("batch"), &policies, 1)?;
    /// assert_eq!(plan.reserves(), &[5]);
    /// assert!(plan.record().is_none());
    /// let err = store::plan(&CheckOptions::new().class("batch"), &policies, 6).unwrap_err();
    /// assert!(err.to_string().contains("cost 6"), "{err}");
    /// let zero = CheckOptions::new().idempotency_key("k", Duration::ZERO);
    /// assert!(store::plan(&zero, &policies, 1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`validate_check`]; [`StoreError::Unsupported`] for an empty or
    /// too long idempotency key or fingerprint, or a window of zero or
    /// above [`MAX_IDEMPOTENCY_WINDOW`](crate::MAX_IDEMPOTENCY_WINDOW);
    /// [`StoreError::CostTooHigh`] when the cost and the class's reserve
    /// together exceed a policy's capacity (the class can never be
    /// admitted that cost). A class a policy does not define is no error:
    /// the policy's default class applies.
    pub fn plan(
        options: &CheckOptions,
        policies: &[Policy],
        cost: u64,
    ) -> Result<CheckPlan, StoreError> {
        options.plan(policies, cost)
    }
}

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use portcullis_redis as redis;

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
#[doc(inline)]
pub use portcullis_tower as tower;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing {
    //! The test kit (feature `testing`): test code that sits behind a limiter
    //! without sleeping and without reaching into internals.
    //!
    //! - **Time you move by hand.** A [`ManualClock`](crate::ManualClock)
    //!   (at the crate's root, with the other clocks) given to the store
    //!   (`MemoryStore::builder().clock(…)`, or
    //!   `RedisStoreBuilder::clock(ClockMode::Client(…))`) and to the layer
    //!   ([`RateLimitLayerBuilder::clock`](crate::tower::RateLimitLayerBuilder::clock),
    //!   which its deny cache counts in): `advance` it and every limit moves
    //!   on at once.
    //! - **A store that fails on command.** [`FaultStore`] wraps a real store
    //!   and answers [`Fault::Unavailable`], [`Fault::Timeout`],
    //!   [`Fault::OutcomeUnknown`] or never ([`Fault::Stall`]) while a test
    //!   says so: for fail-open, fail-closed, fallback stores and the circuit
    //!   breaker.
    //! - **Headers read back as numbers.** [`RateLimitFields`] reads a
    //!   response's `RateLimit`, `RateLimit-Policy` and `Retry-After`.
    //!
    //! "The sixth request in a minute is refused, and a minute later it passes",
    //! as a test of an Axum app (with `portcullis` features `axum` and
    //! `testing`, and `tokio`, `axum` and `tower` (feature `util`) as
    //! dev-dependencies):
    //!
    //! ```no_run
    //! // Also add: cargo add tower --features util
    //! use std::time::Duration;
    //!
    //! use axum::body::Body;
    //! use axum::http::{Request, StatusCode};
    //! use axum::{Router, routing::get};
    //! use portcullis::testing::RateLimitFields;
    //! use portcullis::tower::{ApiKey, RateLimitLayer};
    //! use portcullis::{Clock, ManualClock, MemoryStore, Policy, SystemClock};
    //! use tower::ServiceExt;
    //!
    //! fn app(clock: &ManualClock) -> Router {
    //!     let store = MemoryStore::builder().clock(clock.clone()).build();
    //!     let limit = RateLimitLayer::builder(store)
    //!         .policy(Policy::per_minute(5).name("api").build().unwrap())
    //!         .key(ApiKey::new())
    //!         .clock(clock.clone())
    //!         .build()
    //!         .unwrap();
    //!     Router::new().route("/", get(|| async { "ok" })).layer(limit)
    //! }
    //!
    //! fn request() -> Request<Body> {
    //!     Request::get("/").header("x-api-key", "k-1").body(Body::empty()).unwrap()
    //! }
    //!
    //! #[tokio::test]
    //! async fn the_sixth_request_in_a_minute_is_refused() {
    //!     let clock = ManualClock::new(SystemClock.now_micros());
    //!     let app = app(&clock);
    //!     for left in (0..5).rev() {
    //!         let response = app.clone().oneshot(request()).await.unwrap();
    //!         assert_eq!(response.status(), StatusCode::OK);
    //!         let fields = RateLimitFields::read(response.headers()).unwrap();
    //!         assert_eq!(fields.remaining(), Some(left));
    //!     }
    //!     let refused = app.clone().oneshot(request()).await.unwrap();
    //!     assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    //!     let wait = RateLimitFields::read(refused.headers()).unwrap().retry_after().unwrap();
    //!     assert!(wait <= Duration::from_secs(12)); // one request's share of the minute
    //!
    //!     clock.advance(wait);
    //!     let again = app.clone().oneshot(request()).await.unwrap();
    //!     assert_eq!(again.status(), StatusCode::OK);
    //! }
    //! # fn main() {}
    //! ```
    //!
    //! The same test runs in the project's own suite
    //! (`tests/tests/tower/testing_kit.rs`), with the failing store driving
    //! a layer that fails open and one that fails closed.

    pub use portcullis_core::testing::{Fault, FaultStore};
    #[cfg(feature = "tower")]
    pub use portcullis_tower::testing::{FieldError, RateLimitField, RateLimitFields};
}

/// The README's code blocks, compiled and run as doc tests of the facade
/// (so the quick start a user pastes compiles as written). They use the
/// `redis`, `axum` and `testing` features, which `cargo test --workspace`
/// (the `cargo xtask test` run) turns on through the test crate.
#[cfg(all(doctest, feature = "redis", feature = "axum", feature = "testing"))]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// This crate's own README (what crates.io shows), compiled as doc tests.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../README.md")]
struct CrateReadmeDoctests;
