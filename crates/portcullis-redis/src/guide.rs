//! The operations manual of the Redis store: how to connect it to TLS, ACL
//! users, Sentinel or your own pool; where its state lives (the key layout);
//! how it runs on the server (scripts, clocks); what it does when Redis
//! fails; and the compatibility APIs. This module holds no code.
//!
//! # TLS
//!
//! Enable the `tls` feature (`portcullis = { features = ["redis", "tls"] }`):
//! rustls through redis-rs's `tokio-rustls-comp`, with the ring crypto
//! provider (installed as rustls' process default by `build()` unless the
//! application installed one). Server certificates are checked against the
//! operating system's roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` are honoured),
//! or the Mozilla roots compiled in with `tls-webpki-roots`, or only the CA
//! given to [`RedisStoreBuilder::tls_ca`]. `rediss://host#insecure` turns
//! certificate checks off; it needs the `tls-insecure` feature and is for
//! tests only. `rediss://` without the feature fails at `build()` with
//! [`BuildError::TlsNotEnabled`], saying which feature to enable.
//!
//! # ACL users
//!
//! The user needs its key prefix and [`ACL_COMMANDS`]:
//!
//! ```text
//! ACL SETUSER app on >password ~portcullis:* +ping +evalsha +script|load +time +get +set +exists +del +hmget +hset +pexpire +pexpireat +zadd +zcount +zrangebyscore +zremrangebyrank +zremrangebyscore +zrevrange +zcard +zscore +zrem
//! ```
//!
//! On a Redis Cluster the user also needs [`ACL_CLUSTER_COMMANDS`]
//! (`+cluster|slots +asking`). [`ACL_COMMANDS`] runs checks as `EVALSHA`
//! scripts; add `+fcall +fcall_ro +function|load` for the Redis Functions
//! path, which costs the server less per check ([`RedisStore::call_path`]
//! tells which one a store uses).
//!
//! `build()` checks this: a user missing one of them is a
//! [`BuildError::Permission`] naming the rule to grant (a missing `+get`
//! would otherwise look like "no state" to the scripts and admit
//! everything). `CONFIG GET` is optional (see "Failure semantics").
//! Passwords never appear in `Debug` output, error messages or logs.
//!
//! # Sentinel
//!
//! [`RedisStoreBuilder::sentinel`] takes the master name and some
//! Sentinels. Each new connection asks the Sentinels for the current
//! primary; a connection to a primary that was demoted (closed by
//! Sentinel, `READONLY`) or stopped answering (a call timed out) is
//! replaced, so the store follows a failover without a restart. `cargo
//! xtask reliability` measured the first correct decision about 2 s after
//! `SENTINEL FAILOVER` (writes paused first) and about 2.6 s after the
//! primary was killed (`down-after-milliseconds 1000`), with no wrong
//! decision. Redis replicates asynchronously: writes a primary
//! acknowledged just before it died may be lost by any failover (a
//! subject then gets a few more permits); pause writes (`CLIENT PAUSE
//! WRITE`) before a planned failover to lose none.
//!
//! # Your own pool or client
//!
//! [`RedisStoreBuilder::pool`] takes a `bb8::Pool<bb8_redis::RedisConnectionManager>`
//! (these types are re-exported in [`upstream`](crate::upstream) so versions match),
//! [`RedisStoreBuilder::client`] a `redis::Client` and
//! [`RedisStoreBuilder::cluster_client`] a `ClusterClient` (build it with
//! `.retries(0)`: the store never resends a call that may have run).
//!
//! # Key layout
//!
//! Every key is `<prefix>:{<subject>}:<policy>`: the prefix (default
//! `portcullis`, see [`RedisStoreBuilder::prefix`]), the subject in braces
//! (a Cluster hash tag: all policies of one subject live in one slot, so a
//! multi-policy check is one script on one node), and the policy's name.
//! Subjects made of up to 128 of `A-Z a-z 0-9 . _ - : / @ + = ,` are stored
//! as they are; others (long, with braces, spaces, newlines, non-ASCII) and
//! all subjects with [`hash_subjects(true)`](crate::RedisStoreBuilder::hash_subjects)
//! become `#` and the hex SHA-256 of the subject (see
//! [`portcullis::subject::encode_subject`]); [`RedisStore::key_for`] prints a key.
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
//! | concurrency leases ([`ConcurrencyPolicy`](portcullis_core::ConcurrencyPolicy)), at `<prefix>:{<subject>}:lease:<name>` ([`RedisStore::lease_key_for`]) | sorted set | one member per live lease, its id in 32 hex digits, scored by its expiry; pruned at every call, the key expiring with its last lease ([`LeaseStore`](portcullis_core::LeaseStore): one atomic `FCALL`/`EVALSHA` per acquire, renewal and release) |
//! | token reservations ([`TokenBudget`](portcullis_core::TokenBudget)): the open set at `<prefix>:{<subject>}:rsv:<budget>` ([`RedisStore::reservation_key_for`]), each reservation's record at that key, `:` and its id | sorted set; string | the open reservations' ids scored by their expiry (only when the budget limits streams in flight), pruned at every reserve, the key expiring with its last; a record `o:<estimate>:<expiry>` while open, `s:<estimate>:<used>:<overage>:<expiry>` once settled, expiring a TTL after either ([`ReservationStore`](portcullis_core::ReservationStore): one `EVALSHA` of `reserve.lua` per reserve and per settle, with the budget's policy keys) |
//!
//! The four bucket states (GCRA and the leaky bucket queue, the token bucket
//! and the leaky meter) end in the units they were written in: the writing
//! policy's `@<limit>:<period_us>:<capacity>` (so `18b4c2f1e3a07@5:60000000:5`).
//! A policy of other numbers under the same name carries the permits the
//! state holds into its own units (ALGORITHMS.md, "Changing a policy"); a
//! state without the tail (written by an earlier version) is read in the
//! current units.
//!
//! ```text
//! $ redis-cli GET 'portcullis:{user:42}:per-second'
//! "60a24182089f0"
//! $ redis-cli PTTL 'portcullis:{user:42}:per-second'
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
//! The [redis-cell](crate::RedisStore::throttle) state lives at
//! `<prefix>:{<key>}:throttle`; the [rate limiter](crate::redisson::RateLimiter) keys are
//! `<prefix>:limiter:{<name>}:config|state|client:<id>`.
//!
//! # Scripts
//!
//! One Lua source per algorithm (in `src/lua/`). By default they are one
//! Redis Functions library, `portcullis_<hash of its source>`
//! ([`RedisStore::library_name`]), loaded once per node with `FUNCTION LOAD
//! REPLACE` and called with `FCALL` (`FCALL_RO` for a peek), the plan of
//! algorithms passed as one letter per policy: helpers and tables are built
//! once, at load. A node without it (after `FUNCTION FLUSH`, a restart
//! without persistence, a failover, a new Cluster node) answers "Function
//! not found", which proves the call did not run: the store loads the
//! library there and sends the call again. When a server refuses `FCALL`
//! or `FUNCTION` (Redis before 7, an ACL without them) the store falls back
//! for good to scripts ([`CallPath::Evalsha`], [`RedisStore::call_path`]);
//! a node that lacks the library and is too full to load it (`maxmemory`
//! with `noeviction` refuses `FUNCTION LOAD`, not `SCRIPT LOAD`) moves the
//! store to scripts until one check, tried once a second, loads it:
//! the sources composed into one script per combination of algorithms a
//! check uses, cached by SHA-1 and called with `EVALSHA`; on `NOSCRIPT` the
//! store sends `SCRIPT LOAD` and the `EVALSHA` again. The arithmetic is integer microseconds throughout, exact in
//! Lua's doubles (policies keep every product below 2^53), and follows
//! portcullis-core's `ALGORITHMS.md` line by line; a differential test holds
//! the Redis and memory stores equal.
//!
//! A post-charge ([`Store::charge`](portcullis_core::Store::charge): a cost
//! known after the fact, charged into a debt capped at one full capacity
//! beyond empty; GCRA and the token bucket) is one call of `charge.lua`:
//! the library's `portcullis_<hash>_charge` function, or its own composed
//! script on the `EVALSHA` path. Checks run the same code as without it.
//!
//! # Many checks, one call
//!
//! Charges of one subject and policies that arrive while a call for them is
//! in flight wait for it, then go together as one call
//! (`portcullis_<hash>_batch`; for one policy of a fast path,
//! `_gcra_batch`, `_token_bucket_batch`, `_leaky_meter_batch`,
//! `_leaky_queue_batch`, `_fixed_window_batch`, `_sliding_window_batch` or
//! `_sliding_log_batch`, which read the state once and write it once),
//! which decides them one after another in arrival order, as sequential
//! checks at that instant would (ALGORITHMS.md, "Coalesced checks").
//! Nothing waits for a batch to fill; a
//! batch holds at most 128 checks. Off with
//! [`RedisStoreBuilder::coalesce(false)`](crate::RedisStoreBuilder::coalesce);
//! peeks are never coalesced. On the `EVALSHA` path (a server without
//! Functions, or one that refused them) the batch is one call of a script
//! composed for the policy set (`lua/batch_script.lua`), which decides the
//! checks in turn as the general batch does.
//!
//! Checks of different subjects batch too, on a standalone server or behind
//! Sentinel: a store keeps at most two calls of checks in flight, and the
//! checks that find both busy go together as one call of
//! `portcullis_<hash>_mixed`, each run as the function it would have been
//! sent to alone (ALGORITHMS.md, "Batches across subjects"); on the
//! `EVALSHA` path, as one call of a script (`lua/mixed_script.lua`) that
//! decides each as the check script composed for its policy set would. On
//! a Cluster (keys of one call must share a slot) every check goes alone.
//!
//! With a [`LocalBudget`](crate::LocalBudget), a busy subject's checks are
//! admitted from rate shares (`portcullis_<hash>_gcra_take`: the next
//! emission slots over the grant period, up to the demand of the last
//! one, charged at once and dispensed on the GCRA schedule), with the
//! bound the type states; on the `EVALSHA` path, as one call of a script
//! of the same code (`lua/grant.lua`), with the same answers and bound.
//!
//! # Clock modes
//!
//! [`ClockMode::Redis`] (the default) reads Redis' `TIME` inside the script:
//! all app instances share one clock. [`ClockMode::Client`] takes the time
//! from a [`Clock`](portcullis_core::Clock) at each call, for tests with a
//! [`ManualClock`](portcullis_core::ManualClock). Keys expire on Redis's
//! clock at the client's times, so a client clock behind Redis's would
//! write keys already expired and admit everything: `build()` compares it
//! with `TIME` and refuses one further than
//! [`client_clock_tolerance`](crate::RedisStoreBuilder::client_clock_tolerance) (one second by default).
//!
//! # Failure semantics
//!
//! `build()` connects (unless [`RedisStoreBuilder::lazy_connect`]): it
//! opens the pool, sends `PING`, runs a permission probe (every command the
//! scripts call, on three keys of the prefix that the probe deletes again)
//! and a peek, so an unreachable server, a TLS failure, refused
//! credentials, a missing ACL permission or an unknown Sentinel master is a
//! [`BuildError`] naming what to change, with redis-rs's error as its
//! `source()`. With `lazy_connect(true)` these surface later as
//! [`StoreError::Unavailable`](portcullis_core::StoreError::Unavailable),
//! whose source chain holds the last connection error.
//!
//! A full Redis: with `maxmemory` set and `maxmemory-policy noeviction`,
//! a full Redis refuses every write with `OOM`, so every check that
//! charges fails with a store error. `build()` reads both settings where
//! `CONFIG GET` is allowed (managed Redis often refuses it; then nothing is
//! logged) and logs a `tracing` warning in that case. Every portcullis key
//! has a TTL, so `maxmemory-policy volatile-ttl` is the one to use: Redis
//! then frees the keys closest to expiring, which are the ones that matter
//! least.
//!
//! Every call has one deadline ([`RedisStoreBuilder::timeout`], default
//! 250 ms, measured: see the setter) covering pool checkout, the
//! script and any reload. What the errors mean, and their
//! [`ErrorScope`](portcullis_core::ErrorScope) (only `Store` errors count
//! toward the tower layer's circuit breaker):
//!
//! | error | meaning | scope |
//! |---|---|---|
//! | [`StoreError::Unavailable`](portcullis_core::StoreError::Unavailable) | nothing was charged: no connection (refused, down, pool exhausted), or the server refused before running (`LOADING`, `BUSY`, `READONLY`, `CLUSTERDOWN`, ...) | `Store` |
//! | [`StoreError::Timeout`](portcullis_core::StoreError::Timeout) | the script was sent and no answer came in time: it may have run | `Store` |
//! | [`StoreError::OutcomeUnknown`](portcullis_core::StoreError::OutcomeUnknown) | the connection broke mid-call: the script may have run | `Store` |
//! | [`StoreError::OutOfMemory`](portcullis_core::StoreError::OutOfMemory) | Redis is at `maxmemory` with `noeviction` and the subject holds no key: nothing was charged | `NoRoom` (denied, never let through) |
//! | [`StoreError::Rejected`](portcullis_core::StoreError::Rejected) | Redis answered the call with an error (a script error, a command it does not know); the redis-rs error is the `source()` | `Subject` |
//! | [`StoreError::Protocol`](portcullis_core::StoreError::Protocol) | a reply of the wrong shape (another portcullis-redis version's library?) | `Subject` |
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
//! [`StoreError::OutOfMemory`](portcullis_core::StoreError::OutOfMemory), which the tower layer answers with `429`
//! and `Retry-After: 1`, as it answers a new subject of a full
//! `MemoryStore` that denies. OOM is not an outage: the circuit breaker
//! stays closed and held subjects stay exact. Redis before 7 does not
//! know the `#!lua` line; there the retry fails as a script error
//! (`Rejected`), for that request alone.
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
//! A [`bb8`] pool of [`pool_size`](crate::RedisStoreBuilder::pool_size)
//! multiplexed connections opened by bb8-redis's
//! `RedisConnectionManager` (or, for Sentinel, from the primary the
//! Sentinels name): a call takes a connection from the pool, clones its
//! multiplexed handle and gives it back at once, so all concurrent calls
//! pipeline over a few sockets. bb8-redis alone would `PING` on every
//! checkout to find a dead connection; portcullis wraps its manager instead:
//! a call that meets a dead socket marks its connection broken (the pool
//! replaces it) and bumps a failure epoch, and only then are the other
//! pooled connections `PING`ed once before their next use. A healthy server
//! costs no extra round trip; after a restart, the calls in flight and the
//! first call to meet a dead socket fail, and later calls find fresh
//! connections.
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
//! # async fn run(store: portcullis::redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
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
//! use portcullis::redis::redisson::RateType;
//!
//! # async fn run(store: portcullis::redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = store.rate_limiter("reports");
//! limiter.try_set_rate(RateType::Overall, 10, Duration::from_secs(1)).await?; // first writer wins
//! limiter.acquire(2).await?; // waits for the retry-after, never polls
//! # Ok(()) }
//! ```
//!
//! [`ACL_CLUSTER_COMMANDS`]: crate::ACL_CLUSTER_COMMANDS
//! [`ACL_COMMANDS`]: crate::ACL_COMMANDS
//! [`BuildError`]: crate::BuildError
//! [`BuildError::Permission`]: crate::BuildError::Permission
//! [`BuildError::TlsNotEnabled`]: crate::BuildError::TlsNotEnabled
//! [`CallPath::Evalsha`]: crate::CallPath::Evalsha
//! [`ClockMode::Client`]: crate::ClockMode::Client
//! [`ClockMode::Redis`]: crate::ClockMode::Redis
//! [`RedisStore::call_path`]: crate::RedisStore::call_path
//! [`RedisStore::key_for`]: crate::RedisStore::key_for
//! [`RedisStore::lease_key_for`]: crate::RedisStore::lease_key_for
//! [`RedisStore::reservation_key_for`]: crate::RedisStore::reservation_key_for
//! [`RedisStore::library_name`]: crate::RedisStore::library_name
//! [`RedisStore::rate_limiter`]: crate::RedisStore::rate_limiter
//! [`RedisStore::throttle`]: crate::RedisStore::throttle
//! [`RedisStoreBuilder::client`]: crate::RedisStoreBuilder::client
//! [`RedisStoreBuilder::cluster_client`]: crate::RedisStoreBuilder::cluster_client
//! [`RedisStoreBuilder::lazy_connect`]: crate::RedisStoreBuilder::lazy_connect
//! [`RedisStoreBuilder::pool`]: crate::RedisStoreBuilder::pool
//! [`RedisStoreBuilder::prefix`]: crate::RedisStoreBuilder::prefix
//! [`RedisStoreBuilder::sentinel`]: crate::RedisStoreBuilder::sentinel
//! [`RedisStoreBuilder::timeout`]: crate::RedisStoreBuilder::timeout
//! [`RedisStoreBuilder::tls_ca`]: crate::RedisStoreBuilder::tls_ca
//! [`bb8`]: crate::upstream::Pool
//! [`portcullis::subject::encode_subject`]: portcullis_core::subject::encode_subject
