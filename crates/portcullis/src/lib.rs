//! Exact rate limiting for Rust services that run as several instances: one
//! set of algorithms that decides the same in process memory and in Redis
//! (standalone, Cluster, Sentinel, TLS), a tower
//! [`RateLimitLayer`](tower::RateLimitLayer) for
//! Axum, Tonic and Hyper, and keyed concurrency limits.
//!
//! This is the crate to depend on: it re-exports the core types at its root
//! ([`Policy`], [`MemoryStore`], [`Store`], ...), the tower layer as
//! [`tower`](mod@tower) and the Redis store as `redis` (feature `redis`).
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
//! `RateLimit` too. Who is limited (an API key, a user, a client IP behind
//! trusted proxies), several policies at once, plan tiers, costs, charging
//! after the response and what happens when the store fails are choices of
//! the layer's builder: the [`tower`](mod@tower) module's page has the
//! table.
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
//! | `redis` | `redis`: `RedisStore` on standalone Redis, Cluster or Sentinel, ACL users, your own bb8 pool |
//! | `tls` | `rediss://` through rustls, trusting the system's roots; `tls-webpki-roots` trusts the compiled-in Mozilla roots, `tls-insecure` accepts `#insecure` URLs (tests only) |
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
//! variable is set and memory otherwise, as one [`BoxStore`].
//!
//! # gRPC with Tonic
//!
//! With feature `tonic`, the layer goes on a Tonic server; a limited call
//! gets status `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` and
//! `google.rpc.QuotaFailure` details:
//!
//! ```no_run
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
//! # futures::executor::block_on(async {
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

// docs.rs shows which feature each item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use portcullis_core::*;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use portcullis_redis as redis;

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
#[doc(inline)]
pub use portcullis_tower as tower;

/// The README's code blocks, compiled and run as doc tests of the facade
/// (so the quick start a user pastes compiles as written). They use the
/// `redis` and `axum` features, which `cargo test --workspace` (the
/// `cargo xtask test` run) turns on through the test crate.
#[cfg(all(doctest, feature = "redis", feature = "axum"))]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// This crate's own README (what crates.io shows), compiled as doc tests.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../README.md")]
struct CrateReadmeDoctests;
