//! Redis and Redis Cluster store for tollgate: every algorithm is one atomic
//! Lua script, with the same decisions as the in-memory store, so moving
//! from one instance to many is a one-line change.
//!
//! ```no_run
//! use tollgate_core::{Policy, Store};
//! use tollgate_redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Was: let store = MemoryStore::new();
//! let store = RedisStore::builder().url("redis://127.0.0.1:6379").build().await?;
//! store.ping().await?; // optional: fail at startup if Redis is down
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
//! suite runs against Redis 7.0 (Debian's `redis-server`); older versions
//! and compatible servers such as Valkey are not tested. Connections are
//! TCP (`redis://`) or Unix sockets (`redis+unix://`).
//!
//! # Key layout
//!
//! Every key is `<prefix>:{<subject>}:<policy>`: the prefix (default
//! `tollgate`, see [`RedisStoreBuilder::prefix`]), the subject in braces
//! (a Cluster hash tag: all policies of one subject live in one slot, so a
//! multi-policy check is one script on one node), and the policy's name.
//! Subjects made of up to 128 of `A-Z a-z 0-9 . _ - : / @ + = ,` are stored
//! as they are; others (long, with braces, spaces, newlines, non-ASCII) and
//! all subjects with [`hash_subjects(true)`](RedisStoreBuilder::hash_subjects)
//! become `#` and the hex SHA-256 of the subject (see
//! [`tollgate_core::encode_subject`]); [`RedisStore::key_for`] prints a key.
//!
//! Values, readable with `redis-cli` (times are microseconds since the Unix
//! epoch; `L` is the policy's limit):
//!
//! | algorithm | type | value |
//! |---|---|---|
//! | GCRA | string | the theoretical arrival time in hexadecimal microseconds when it is a whole microsecond (the usual case: Lua reads hex with `strtoul`, a 16-digit decimal with `strtod`'s slow path); else `gcra:<tat_us>:<rem>` (decimal), `tat_us + rem/L`. Both forms are read (earlier versions wrote `gcra:<tat_us>:0`) |
//! | leaky bucket (queue) | string | `leaky_queue:<free_us>:<rem>`: when the queue is empty, `free_us + rem/L` |
//! | token bucket | string | `token_bucket:<level>:<last_us>`: tokens × period in µs, refilled at `last_us` |
//! | leaky bucket (meter) | string | `leaky_meter:<level>:<last_us>`: water × period in µs, at `last_us` |
//! | fixed window | string | `fixed_window:<window_start_us>:<count>` |
//! | sliding window | string | `sliding_window:<window_start_us>:<previous>:<current>` |
//! | sliding log | sorted set | one member `<time_us>:<n>` per admitted permit, scored by its time; `n` counts permits admitted at that same time, so members never collide |
//!
//! ```text
//! $ redis-cli GET 'tollgate:{user:42}:per-second'
//! "60a24182089f0"
//! $ redis-cli PTTL 'tollgate:{user:42}:per-second'
//! (integer) 100
//! ```
//!
//! Every write sets the key's expiry in the same call (`SET … PXAT`,
//! milliseconds rounded up; the sliding log's `PEXPIREAT`)
//! to the moment the state is back to full, when forgetting it changes
//! nothing: no key is immortal and none lives longer than it matters.
//! Denials and peeks write nothing. A state of another algorithm (a policy
//! changed under the same name) counts as no state.
//!
//! The [redis-cell](RedisStore::throttle) state lives at
//! `<prefix>:{<key>}:throttle`; the [rate limiter](RateLimiter) keys are
//! `<prefix>:limiter:{<name>}:config|state|client:<id>`.
//!
//! # Scripts
//!
//! One Lua source per algorithm (in `src/lua/`). By default they are one
//! Redis Functions library, `tollgate_<hash of its source>`
//! ([`RedisStore::library_name`]), loaded once per node with `FUNCTION LOAD
//! REPLACE` and called with `FCALL` (`FCALL_RO` for a peek), the plan of
//! algorithms passed as one letter per policy: helpers and tables are built
//! once, at load. A node without it (after `FUNCTION FLUSH`, a restart
//! without persistence, a failover, a new Cluster node) answers "Function
//! not found", which proves the call did not run: the store loads the
//! library there and sends the call again. When a server refuses `FCALL`
//! or `FUNCTION` (Redis before 7, an ACL without them) the store falls back
//! for good to scripts ([`CallPath::Evalsha`], [`RedisStore::call_path`]):
//! the sources composed into one script per combination of algorithms a
//! check uses, cached by SHA-1 and called with `EVALSHA`; on `NOSCRIPT` the
//! store sends `SCRIPT LOAD` and the `EVALSHA` again. The arithmetic is integer microseconds throughout, exact in
//! Lua's doubles (policies keep every product below 2^53), and follows
//! tollgate-core's `ALGORITHMS.md` line by line; a differential test holds
//! the Redis and memory stores equal.
//!
//! # Clock modes
//!
//! [`ClockMode::Redis`] (the default) reads Redis' `TIME` inside the script:
//! all app instances share one clock. [`ClockMode::Client`] takes the time
//! from a [`Clock`](tollgate_core::Clock) at each call, for tests with a
//! [`ManualClock`](tollgate_core::ManualClock).
//!
//! # Failure semantics
//!
//! Every call has one deadline ([`RedisStoreBuilder::timeout`], default
//! 250 ms, measured: see [`DEFAULT_TIMEOUT`]) covering pool checkout, the
//! script and any reload. What the errors mean, and their
//! [`ErrorScope`](tollgate_core::ErrorScope) (only `Store` errors count
//! toward the tower layer's circuit breaker):
//!
//! | error | meaning | scope |
//! |---|---|---|
//! | [`StoreError::Unavailable`](tollgate_core::StoreError::Unavailable) | nothing was charged: no connection (refused, down, pool exhausted), or the server refused before running (`LOADING`, `BUSY`, `READONLY`, `CLUSTERDOWN`, ...) | `Store` |
//! | [`StoreError::Timeout`](tollgate_core::StoreError::Timeout) | the script was sent and no answer came in time: it may have run | `Store` |
//! | [`StoreError::OutcomeUnknown`](tollgate_core::StoreError::OutcomeUnknown) | the connection broke mid-call: the script may have run | `Store` |
//! | [`StoreError::OutOfMemory`](tollgate_core::StoreError::OutOfMemory) | Redis is at `maxmemory` with `noeviction` and the subject holds no key: nothing was charged | `NoRoom` (denied, never let through) |
//! | [`StoreError::Protocol`](tollgate_core::StoreError::Protocol) | a reply of the wrong shape or a script error (for example a key of the wrong type) | `Subject` |
//!
//! **Out of memory.** At `maxmemory` with `noeviction`, Redis refuses a
//! script at its first write with `OOM`, so nothing was charged. The store
//! then runs the check once more (the one case of a second round trip) as
//! the script's allow-oom twin: the same script under a
//! `#!lua flags=allow-oom` line (Redis 7), which Redis runs and lets write
//! under OOM. The twin charges subjects whose keys exist, exactly as
//! always (writing a key that exists takes no new memory, save for a
//! sliding log's members, bounded by its limit), and for a subject whose
//! key it would have to create writes nothing and answers `NOROOM`:
//! [`StoreError::OutOfMemory`](tollgate_core::StoreError::OutOfMemory), which the tower layer answers with `429`
//! and `Retry-After: 1`, as it answers a new subject of a full
//! `MemoryStore` that denies. OOM is not an outage: the circuit breaker
//! stays closed and held subjects stay exact. Redis before 7 does not
//! know the `#!lua` line; there the retry fails as a script error
//! (`Protocol`), for that request alone.
//!
//! A call that may have run is never sent again (that would charge twice);
//! only calls the server proves it did not run (`NOSCRIPT`, `MOVED`, `ASK`,
//! `TRYAGAIN`) are resent, within the same deadline. The Cluster client is
//! built with its own retries off for the same reason.
//!
//! On a Redis Cluster, consider `cluster-require-full-coverage no`. With
//! Redis's default (`yes`), once one master is marked failed every node
//! answers `CLUSTERDOWN` for every slot until a replica is promoted (about
//! three seconds with `cluster-node-timeout 2000` in `cargo xtask
//! reliability`), so subjects on healthy masters also get `Unavailable` and
//! the layer's failure policy. With `no`, only the failed master's slots
//! are affected; the same scenario lost no decision on the other masters.
//!
//! # Connections
//!
//! A [`bb8`] pool of [`pool_size`](RedisStoreBuilder::pool_size)
//! multiplexed connections: a call takes a connection from the pool, clones
//! its multiplexed handle and gives it back at once, so all concurrent calls
//! pipeline over a few sockets. The pool's manager is tollgate's own rather
//! than `bb8-redis`'s: it runs each connection's driver task itself and
//! marks the connection broken the moment the socket closes, so a server
//! restart costs only the calls in flight, without a `PING` per checkout.
//! On a Cluster the pool holds the redis crate's multiplexed
//! `ClusterConnection`s (each with one connection per node, reconnecting
//! and following slot changes on its own).
//!
//! # Compatibility APIs
//!
//! [`RedisStore::throttle`] is redis-cell's `CL.THROTTLE` (same arguments,
//! same five integers) computed by the GCRA script, so it runs where modules
//! cannot be loaded:
//!
//! ```no_run
//! # async fn run(store: tollgate_redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
//! // CL.THROTTLE user123 15 30 60 1: 30 per minute, bursts of 16.
//! let reply = store.throttle("user123", 15, 30, 60, 1).await?;
//! assert_eq!(reply.to_array(), [0, 16, 15, -1, 2]);
//! # Ok(()) }
//! ```
//!
//! [`RedisStore::rate_limiter`] is a Redisson-style named limiter whose
//! configuration lives in Redis:
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate_redis::RateType;
//!
//! # async fn run(store: tollgate_redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = store.rate_limiter("reports");
//! limiter.try_set_rate(RateType::Overall, 10, Duration::from_secs(1)).await?; // first writer wins
//! limiter.acquire(2).await?; // waits for the retry-after, never polls
//! # Ok(()) }
//! ```

mod cell;
mod connection;
mod functions;
mod limiter;
mod scripts;
mod store;

pub use cell::{ThrottleCallError, THROTTLE_POLICY_NAME};
pub use functions::CallPath;
pub use limiter::{RateLimiter, RateLimiterConfig, RateLimiterError, RateType, DEFAULT_KEEP_ALIVE};
pub use store::{
    BuildError, CheckFuture, ClockMode, RedisStore, RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, MAX_PREFIX_LEN,
};

/// The `bb8` pool this crate uses, re-exported so versions never mismatch.
pub use bb8;
/// The `redis` crate this crate uses, re-exported so versions never
/// mismatch.
pub use redis;
/// The redis-cell reply type, from `tollgate-core`.
pub use tollgate_core::algorithms::{ThrottleError, ThrottleReply};
