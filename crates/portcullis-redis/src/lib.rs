//! Redis, Redis Cluster and Sentinel store for portcullis (TLS and ACL users
//! included): every algorithm is one atomic Lua script, with the same
//! decisions as the in-memory store, so moving from one instance to many is
//! a one-line change.
//!
//! ```no_run
//! use portcullis::{Policy, Store};
//! use portcullis::redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Was: let store = MemoryStore::new();
//! let store = RedisStore::builder().url("redis://127.0.0.1:6379").build().await?;
//! // build() connected and checked credentials and permissions;
//! // ping() is there for health checks.
//! store.ping().await?;
//!
//! let policies = [
//!     Policy::per_second(10).name("per-second").build()?,
//!     Policy::per_day(1_000).name("per-day").build()?,
//! ];
//! // Both policies in one script call: all admit and are charged, or none.
//! let verdict = store.check("user:42", &policies, 1).await?;
//! assert!(verdict.is_allowed());
//! assert_eq!(verdict.decisions()[0].remaining(), 9);
//! assert_eq!(verdict.decisions()[1].remaining(), 999);
//! # Ok(()) }
//! ```
//!
//! For a Redis Cluster, give some of its nodes:
//! `RedisStore::builder().cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])`.
//! Everything else is the same.
//!
//! Requirements: Redis 6.2 or later (a write is one `SET … PXAT`; scripts
//! read `TIME` and then write, which needs effect replication). On Redis 7
//! checks run as Redis Functions; elsewhere, or for an ACL user without
//! `FCALL`/`FUNCTION`, as scripts ([`CallPath`]). The test
//! suite runs against Redis 7.0 (Debian's `redis-server`, in CI), and was
//! run against Redis 6.2, 7.2 and 7.4 and Valkey 8 (the README's server
//! compatibility table: what each passed, and what Redis 6.2 lacks). A
//! store builds on a server at `maxmemory` too: a node too full to load
//! the library runs its checks as scripts until it has room. Connections
//! are TCP (`redis://`) or Unix sockets (`redis+unix://`).
//!
//! # Deployments
//!
//! | deployment | how | tested (`cargo xtask test`, Redis 7.0) |
//! |---|---|---|
//! | standalone | `.url("redis://host:6379")`, `redis+unix:///path` | yes |
//! | TLS | `.url("rediss://host:6380")`, feature `tls`; `.tls_ca(pem)` for a private CA | yes: standalone with and without client certificates, and a 3-master Cluster (`tls-cluster yes`) |
//! | mutual TLS | `.tls_client_cert(cert_pem, key_pem)` | yes |
//! | ACL user | `redis://user:password@host`, or `.username(..)` / `.password(..)` | yes, a user allowed only [`ACL_COMMANDS`] (plus [`ACL_CLUSTER_COMMANDS`] on the TLS Cluster) |
//! | password only (`requirepass`) | `redis://:password@host` | yes |
//! | Redis Cluster | `.cluster([urls])` (`rediss://` for TLS) | yes (3 masters, failover, slot migration; TLS) |
//! | Sentinel | `.sentinel("mymaster", ["redis://s1:26379", ...])` | yes (primary, replica, 3 Sentinels; `SENTINEL FAILOVER` and a killed primary) |
//! | your own pool or client | `.pool(bb8_pool)`, `.client(redis::Client)`, `.cluster_client(ClusterClient)` | yes |
//!
//! Other servers (Redis 6.2, 7.2, 7.4, Valkey 8) were run through the same
//! suites by hand; the README's server compatibility table says when and
//! what each passed. Not tested: `rediss://` URLs for Sentinels (handed to
//! redis-rs's Sentinel client with the same certificates, but the test
//! Sentinels speak plain TCP), and managed services themselves
//! (ElastiCache, Memorystore, Azure Cache, Redis Cloud, Upstash): they are
//! TLS plus an ACL user or password, which is what the tests cover on a
//! standalone server.
//!
//! Concurrent checks of one subject share a call (exact, on by default:
//! [`RedisStoreBuilder::coalesce`]); a [`LocalBudget`] trades a stated
//! overshoot for a fraction of a call per request on hot subjects.
//!
//! The [`guide`] is the operations manual: TLS, ACL users, Sentinel, your
//! own pool, the key layout, the scripts, clock modes, failure semantics,
//! connections and the compatibility APIs.

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
// docs.rs shows which feature an item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The modules, top-down: each uses only the ones below it (a module's
// submodules are part of it). `env` and `store` (the public type, its
// `Store` and `LeaseStore` impls, its builder) above `redisson` (the
// Redisson-style limiter), the paths a check takes (`budget`, `coalesce`),
// one call of a script (`call`), then `connection` and `scripts`
// (`functions`: which of FCALL and EVALSHA), and the leaves (`keys`,
// `clock`, `errors`, `redact`, `tls`).
mod env;
mod store;

pub mod redisson;

mod budget;
mod coalesce;

mod call;

mod connection;
mod functions;
mod scripts;

mod clock;
mod errors;
mod keys;
mod redact;
mod tls;

pub mod guide;

pub use budget::LocalBudget;
pub use clock::ClockMode;
pub use env::store_from_env;
pub use errors::{BuildError, RedisCause, ACL_CLUSTER_COMMANDS, ACL_COMMANDS};
pub use functions::CallPath;
pub use keys::MAX_PREFIX_LEN;
pub use redact::redact_url;
pub use store::builder::RedisPool;
pub use store::{RedisStore, RedisStoreBuilder, ThrottleCallError, THROTTLE_POLICY_NAME};

/// The redis-cell reply type, from `portcullis-core`.
pub use portcullis_core::algorithms::{ThrottleError, ThrottleReply};

/// The two builder defaults the workspace's tests name (the reliability
/// runs and the client-clock test); their values are documented on the
/// setters ([`RedisStoreBuilder::timeout`],
/// [`RedisStoreBuilder::client_clock_tolerance`]), and they are not part
/// of the API. The other defaults are private to this crate.
#[doc(hidden)]
pub mod defaults {
    pub use crate::store::builder::{DEFAULT_CLIENT_CLOCK_TOLERANCE, DEFAULT_TIMEOUT};
}

pub mod upstream {
    //! For passing your own client or pool: the types of the `redis`,
    //! `bb8` and `bb8-redis` versions this crate is built with, so that
    //! what you build is what
    //! [`RedisStoreBuilder::client`](crate::RedisStoreBuilder::client),
    //! [`cluster_client`](crate::RedisStoreBuilder::cluster_client) and
    //! [`pool`](crate::RedisStoreBuilder::pool) take, whatever versions
    //! your own dependencies name. For anything else from those crates,
    //! depend on them yourself (`cargo tree -i redis` shows the version).
    //!
    //! ```no_run
    //! use portcullis::redis::upstream::{Client, Pool, RedisConnectionManager};
    //! use portcullis::redis::RedisStore;
    //!
    //! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    //! // A pool the application shares with its own Redis calls.
    //! let pool = Pool::builder()
    //!     .max_size(8)
    //!     .build(RedisConnectionManager::new("redis://127.0.0.1:6379")?)
    //!     .await?;
    //! let store = RedisStore::builder().pool(pool.clone()).build().await?;
    //! // Or a client configured by the application.
    //! let client = Client::open("redis://127.0.0.1:6379")?;
    //! let other = RedisStore::builder().client(client).build().await?;
    //! # let _ = (store, other); Ok(()) }
    //! ```

    pub use bb8::Pool;
    pub use bb8_redis::RedisConnectionManager;
    pub use redis::cluster::ClusterClient;
    pub use redis::Client;
}
