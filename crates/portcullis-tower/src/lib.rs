//! A tower [`RateLimitLayer`] for Axum, Tonic and Hyper, backed by any
//! portcullis [`Store`](portcullis_core::Store): the in-process
//! [`MemoryStore`](portcullis_core::MemoryStore) or Redis.
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use portcullis::{MemoryStore, Policy};
//! use portcullis::tower::RateLimitLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // 10 requests per second per client IP, bursts of up to 20.
//! let policy = Policy::per_second(10).burst(20).name("api").build()?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(MemoryStore::new(), policy));
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! Limited requests get `429 Too Many Requests` with `Retry-After` and the
//! IETF `RateLimit-Policy` / `RateLimit` fields (gRPC requests get status 8
//! `RESOURCE_EXHAUSTED`); admitted responses carry `RateLimit` too.
//!
//! A policy's quota in `RateLimit-Policy` is its capacity, the most a
//! client may send at once, and its window the time that capacity takes to
//! refill: `Policy::per_minute(100)` is `q=100;w=60`, and
//! `Policy::per_second(10).burst(20)` is `q=20;w=2` (the same rate, bursts
//! of 20). So the remaining `r` of `RateLimit` never exceeds `q`, as the
//! draft's quota units require, and the legacy `X-RateLimit-Limit` is the
//! same number.
//!
//! Layers stack: when an inner layer (say per user) already wrote
//! `RateLimit` / `RateLimit-Policy`, an outer layer (say per token) appends
//! its members to those lists, so the client sees every policy, innermost
//! first; `Retry-After` becomes the larger of the two.
//!
//! # What to configure
//!
//! | need | use |
//! |---|---|
//! | who is limited | [`RateLimitLayerBuilder::key`]: [`PeerIp`], [`ClientIp`] behind proxies, [`BearerToken`], [`ApiKey`], [`Header`], [`User`], `MatchedRoute` (feature `axum`), [`Method`], [`Global`], a closure of the request's head ([`RequestHead`]), a tuple, [`KeyExtractor::or`] |
//! | several limits at once | [`RateLimitLayerBuilder::policy`] several times (checked atomically) |
//! | plans / tiers | [`RateLimitLayerBuilder::tier`] and [`RateLimitLayerBuilder::tier_by`]; a plan per subject from a database or billing API: [`RateLimitLayerBuilder::resolve_plan`] with a [`PlanResolver`] |
//! | limits that change without a restart (policies, tiers, per-subject overrides) | [`RateLimitLayerBuilder::limits`] with a [`Limits`](portcullis_core::Limits) handle (a TOML file: the facade's `LimitsFile`, feature `config`) |
//! | a retried request answered with its first decision, not charged twice | [`RateLimitLayerBuilder::idempotency_key`] |
//! | part of a limit reserved for important traffic (priority classes) | [`RateLimitLayerBuilder::priority`] with [`PolicyBuilder::class`](portcullis_core::PolicyBuilder::class) |
//! | fewer Redis calls on hot subjects | the store's choice, not the layer's: `RedisStoreBuilder::coalesce` (on by default) and the local budget, `LocalBudget` (the facade's `redis` module) |
//! | expensive requests | [`RateLimitLayerBuilder::cost`] |
//! | a cost known only after the response (failed logins, LLM tokens) | [`RateLimitLayerBuilder::charge_from_response`], [`Charge`] |
//! | LLM tokens reserved at admission and settled from the (streamed) response, with requests per minute and streams in flight | [`TokenBudgetLayer`] with a [`TokenBudget`](portcullis_core::TokenBudget) and an [`Estimate`] |
//! | try before enforcing, or delay instead of reject | [`Mode`] |
//! | the store is down | [`FailurePolicy`], [`RateLimitLayerBuilder::check_timeout`], [`RateLimitLayerBuilder::circuit_breaker`] |
//! | requests without a key | [`MissingKey`] |
//! | headers and bodies | [`HeaderMode`], [`RateLimitLayerBuilder::legacy_headers`], [`RateLimitLayerBuilder::problem_json`], [`RateLimitLayerBuilder::on_limited`] |
//! | the decision in handlers | [`RateLimitLayerBuilder::info_in_extensions`], [`RateLimitInfo`] |
//! | who is denied most, for an admin endpoint (`portcullis top` merges instances) | [`RateLimitLayerBuilder::top_denied`] with a [`TopDenied`] |
//! | at most N requests running per key | [`ConcurrencyLimitLayer`] (see [Concurrency limits](#concurrency-limits)) |
//! | the cheapest responses on Axum (no wrapper body for Axum to box) | [`RateLimitLayer::keep_body`] |
//!
//! The layer needs a Tokio runtime with timers (for the check timeout and
//! for waits). Features: `axum` (`ConnectInfo` peer addresses and
//! `MatchedRoute`), `tonic` (Tonic's `TcpConnectInfo` peer addresses, and
//! limited gRPC calls answered through `tonic::Status` with
//! `google.rpc.RetryInfo` and `google.rpc.QuotaFailure` details),
//! `metrics` (counters, gauges and histograms per policy through the
//! `metrics` crate, named after OpenTelemetry's rate-limiting metrics:
//! `portcullis_requests_total{policy, result}`,
//! `portcullis_store_errors_total`, `portcullis_store_duration_seconds`, and
//! for [`ConcurrencyLimitLayer`] `portcullis_concurrency_requests_total`,
//! `portcullis_concurrency_store_errors_total`,
//! `portcullis_active_request_leases` and
//! `portcullis_request_lease_duration_seconds`; the README's "Metrics and
//! dashboard" has the whole table. All are registered with help
//! text and units: `describe_metrics`). Each request goes to the recorder in
//! force when it is decided (a scope's `metrics::with_local_recorder`, else
//! the global one), so a recorder installed after the layer was built sees
//! it; with none installed, a request records nothing and reads no clock
//! (a zero-sized recorder, as `metrics::NoopRecorder`, counts as none).
//!
//! # When the store fails
//!
//! Only errors about the store as a whole (unreachable, timed out,
//! `CLUSTERDOWN`, `LOADING`, `BUSY`) count toward the circuit breaker and
//! get the [`FailurePolicy`]; an error about one subject is answered for
//! that request alone, and a new subject the store has no room for is
//! denied, never let through (the table at
//! [`ErrorScope`](portcullis_core::ErrorScope)). Each request let through
//! undecided is counted (`portcullis_requests_total{result="failed_open"}`) and logged at `warn`,
//! at most once per second per layer with the count since the last log;
//! the breaker logs opening (`warn`) and closing (`info`). Install a
//! `tracing` subscriber to see them.
//!
//! # Concurrency limits
//!
//! A rate limit caps how often requests *start*; a slow endpoint (exports,
//! reports, LLM calls) also needs a cap on how many *run at once* per
//! tenant. [`ConcurrencyLimitLayer`] allows each key at most
//! `max_in_flight` requests in flight and answers the others `429` (gRPC
//! `RESOURCE_EXHAUSTED`), with the same key extractors, missing-key
//! handling, fail-open / fail-closed choice, circuit breaker and
//! rate-limited logs as [`RateLimitLayer`], and stacks with it:
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::post, Router};
//! use axum::http::HeaderName;
//! use portcullis::{ConcurrencyPolicy, MemoryStore, Policy};
//! use portcullis::tower::{ConcurrencyLimitLayer, Header, RateLimitLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new(); // or a RedisStore shared by every instance
//! let tenant = Header::new(HeaderName::from_static("x-tenant"));
//! // At most 2 exports running per tenant; a lease lives 30 s unless renewed.
//! let running = ConcurrencyLimitLayer::builder(store.clone())
//!     .policy(ConcurrencyPolicy::max_in_flight(2).lease_ttl(Duration::from_secs(30)).name("exports").build()?)
//!     .key(tenant.clone())
//!     .build()?;
//! // And at most 10 started per minute per tenant.
//! let started = RateLimitLayer::builder(store)
//!     .policy(Policy::per_minute(10).name("exports-per-minute").build()?)
//!     .key(tenant)
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/exports", post(|| async { "exported" }))
//!     .layer(running) // inner: runs only for requests the rate limit admitted
//!     .layer(started);
//! # let _ = app; Ok(()) }
//! ```
//!
//! Each admitted request holds a **lease** (an id with an expiry) from a
//! [`LeaseStore`](portcullis_core::LeaseStore):
//!
//! - it is released when the response body has been sent in full, when the
//!   body fails or is dropped, when the inner service fails, and when the
//!   request's future is dropped (the client disconnected, a timeout layer
//!   gave up): a permit is never leaked by a cancelled request;
//! - while the request runs, a task renews it every third of the lease TTL,
//!   so a request may run longer than the TTL;
//! - if the instance holding it dies, the lease expires after the TTL and
//!   the permit comes back by itself.
//!
//! Releases and renewals run on the Tokio runtime (a permit dropped outside
//! one releases at once on the memory store; a Redis lease then expires
//! with its TTL). A denied request's `Retry-After` is the time until the
//! earliest live lease expires unless its holder renews it: the latest a
//! permit comes back without renewals (a release frees one sooner).
//!
//! How it differs from tower's `ConcurrencyLimitLayer`: tower's limits the
//! whole service in one process and applies **backpressure** (`poll_ready`
//! waits for a permit, requests queue); this one is **keyed** (one limit
//! per tenant, user or IP), **answers `429`** at once instead of queueing,
//! is **shared across instances** through a `RedisStore` (one atomic Lua
//! call per acquire, renew and release), and its permits are **leases
//! that expire**, so a crashed instance cannot hold them forever. Use
//! tower's to protect a process from overload, this one for fairness
//! between tenants.

//! # Charging after the response
//!
//! Some costs are known only once the handler has run: a failed login (a
//! successful one should cost nothing), the tokens an LLM response used.
//! [`RateLimitLayerBuilder::charge_from_response`] computes the cost from
//! the response head; before the handler runs the layer only peeks (a
//! subject with no permit left gets the usual `429` and never reaches the
//! handler), and once the response head is ready it charges the cost with
//! [`Store::charge`](portcullis_core::Store::charge), awaiting it before the
//! response is returned. The charge may take the subject past its limit
//! into a debt paid back by waiting, capped at one full capacity beyond
//! empty: one response locks a subject out for at most the policy's full
//! reset plus one emission interval. A handler adds or refunds cost through
//! the [`Charge`] handle in the request extensions; an admitted
//! response's `RateLimit` fields describe the state after the charge.
//! Only GCRA (the default)
//! and token-bucket policies can be charged after the fact; `build()`
//! refuses the others with [`ConfigError::ChargeAfterResponse`].
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{http::{HeaderMap, HeaderName, StatusCode}, routing::post, Router};
//! use portcullis::{MemoryStore, Policy};
//! use portcullis::tower::{ApiKey, Header, PeerIp, RateLimitLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 5 failed logins per 15 minutes per (IP, username); successes are free.
//! let failed_logins = RateLimitLayer::builder(MemoryStore::new())
//!     .policy(Policy::per(5, std::time::Duration::from_secs(900)).name("failed-logins").build()?)
//!     .key((PeerIp::new(), Header::new(HeaderName::from_static("x-username"))))
//!     .charge_from_response(|parts| u64::from(parts.status == StatusCode::UNAUTHORIZED))
//!     .build()?;
//! // 10 000 tokens per minute per API key, as each response reports them.
//! let tokens = RateLimitLayer::builder(MemoryStore::new())
//!     .policy(Policy::per_minute(10_000).name("tokens").build()?)
//!     .key(ApiKey::new())
//!     .charge_from_response(|parts| {
//!         parts.headers.get("x-tokens-used")
//!             .and_then(|v| v.to_str().ok()?.parse().ok())
//!             .unwrap_or(0)
//!     })
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/login", post(|| async { StatusCode::UNAUTHORIZED }).layer(failed_logins))
//!     .route("/v1/complete", post(|| async {
//!         let mut headers = HeaderMap::new();
//!         headers.insert("x-tokens-used", 3_000.into());
//!         (headers, "…")
//!     }).layer(tokens));
//! # let _ = app; Ok(()) }
//! ```
//!

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

#[macro_use]
mod macros;
mod breaker;
// The two layers' modules are public for the paths sibling code and old
// imports name, but hidden: the crate root (the facade's `tower` page) is
// each type's one documented home.
#[doc(hidden)]
pub mod concurrency;
mod config;
mod headers;
mod info;
mod key;
mod observe;
#[doc(hidden)]
pub mod rate_limit;
mod response;
// The test kit's header reader (feature `testing`); the facade's
// `portcullis::testing` is its documented home.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
mod tokens;
mod top_denied;

pub use concurrency::{
    ConcurrencyFailure, ConcurrencyLimit, ConcurrencyLimitLayer, ConcurrencyLimitLayerBuilder,
    ResponseBody as ConcurrencyLimitBody, ResponseFuture as ConcurrencyLimitFuture,
};
pub use config::{ConfigError, FailurePolicy, HeaderMode, MissingKey, Mode};
pub use info::RateLimitInfo;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use key::MatchedRoute;
pub use key::{
    ApiKey, BearerToken, BoxKeyExtractor, ClientIp, Global, Header, KeyBuf, KeyExtractor, Method,
    Or, PeerIp, ProxyHeader, RequestHead, User,
};
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use observe::describe_metrics;
pub use rate_limit::{
    Charge, KeepBody, KeepBodyFuture, KeepBodyLayer, LookupKey, Plan, PlanResolver,
    PlanResolverBuilder, RateLimit, RateLimitLayer, RateLimitLayerBuilder, ResolverFailure,
    ResponseBody as RateLimitBody, ResponseFuture as RateLimitFuture,
};
pub use tokens::{
    Estimate, TokenBody, TokenBudgetFuture, TokenBudgetLayer, TokenBudgetLayerBuilder,
    TokenBudgetService, TokenRequestBody, MAX_ESTIMATE_BODY,
};
pub use top_denied::{
    TopDenied, TopDeniedEntry, MAX_TOP_DENIED, TOP_DENIED_FORMAT, TOP_DENIED_VERSION,
};
