//! [`RedisStore`]: the public type, what it holds ([`Inner`]) and its
//! inherent methods. The [`Store`](portcullis_core::Store) impl and the
//! route of a check (local budget → coalescing → one call) are in
//! `check.rs`; the concurrency leases ([`LeaseStore`](portcullis_core::LeaseStore))
//! in `leases.rs`; token reservations ([`ReservationStore`](portcullis_core::ReservationStore))
//! in `reserve.rs`; redis-cell's `throttle` in `throttle.rs`; the builder
//! in `builder/`. Below the store: `budget/`, `coalesce/`, then `call/`
//! (one call of a script), then the connection and the scripts.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use portcullis_core::{Policy, StoreError};
use redis::Value;

use crate::budget::Budget;
use crate::call::Caller;
use crate::coalesce::{Coalescer, Lane};
use crate::functions::CallPath;
use crate::redisson::RateLimiter;

pub(crate) mod builder;
mod check;
mod leases;
mod reserve;
mod subjects;
mod throttle;

pub use builder::RedisStoreBuilder;
pub use throttle::{ThrottleCallError, THROTTLE_POLICY_NAME};

/// What a [`RedisStore`] and its clones share.
pub(crate) struct Inner {
    /// What every call needs: pool, timeout, clock, keys, scripts.
    pub(crate) caller: Arc<Caller>,
    /// Checks waiting for a call in flight for their subject and policies
    /// (`coalesce/`); `None` when coalescing is off.
    pub(crate) coalescer: Option<Arc<Coalescer>>,
    /// Checks of any subject waiting for a free call (`coalesce/lane.rs`);
    /// `None` when coalescing is off, and on a Cluster.
    pub(crate) lane: Option<Arc<Lane>>,
    /// Grants of permits for busy subjects (`budget/`); `None` unless
    /// configured.
    pub(crate) budget: Option<Arc<Budget>>,
}

/// A rate-limit [`Store`](portcullis_core::Store) in Redis or Redis Cluster: every check is one
/// atomic Lua script call, with the same decisions as
/// [`MemoryStore`](portcullis_core::MemoryStore).
///
/// Cheap to clone; clones share the pool. See the [guide](crate::guide) for
/// the key layout, clock modes and failure semantics.
///
/// ```no_run
/// use portcullis::{Policy, Store};
/// use portcullis::redis::RedisStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder().url("redis://127.0.0.1:6379").build().await?;
/// let policies = [
///     Policy::per_second(10).name("burst").build()?,
///     Policy::per_day(1_000).name("daily").build()?,
/// ];
/// let verdict = store.check("user:42", &policies, 1).await?;
/// if !verdict.is_allowed() {
///     println!("retry in {:?}", verdict.retry_after());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("pool", &self.inner.caller.pool)
            .field("prefix", &self.inner.caller.keys.prefix())
            .field("timeout", &self.inner.caller.timeout)
            .field("clock", &self.inner.caller.clock)
            .field("hash_subjects", &self.inner.caller.keys.hash_subjects())
            .field("call_path", &self.call_path())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A builder; give it [`url`](RedisStoreBuilder::url),
    /// [`cluster`](RedisStoreBuilder::cluster),
    /// [`sentinel`](RedisStoreBuilder::sentinel),
    /// [`client`](RedisStoreBuilder::client),
    /// [`cluster_client`](RedisStoreBuilder::cluster_client) or
    /// [`pool`](RedisStoreBuilder::pool).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The Redis key holding `policy`'s state for `subject`:
    /// `<prefix>:{<encoded subject>}:<policy name>`. For inspecting with
    /// `redis-cli`.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// // With lazy_connect, this runs without a server.
    /// let store = portcullis::redis::RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// assert_eq!(store.key_for("user:42", "api"), "portcullis:{user:42}:api");
    /// assert!(store.key_for("evil}{subject", "api").starts_with("portcullis:{#"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn key_for(&self, subject: &str, policy_name: &str) -> String {
        self.key(&self.subject(subject), policy_name)
    }

    /// The subject as it appears between the braces of its keys.
    pub(crate) fn subject<'a>(&self, subject: &'a str) -> Cow<'a, str> {
        self.inner.caller.keys.subject(subject)
    }

    /// The key `<prefix>:{<encoded subject>}:<name>`.
    pub(crate) fn key(&self, encoded_subject: &str, name: &str) -> String {
        self.inner.caller.keys.key(encoded_subject, name)
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        self.inner.caller.keys.prefix()
    }

    /// Sends `PING` and waits for the answer: checks at startup that the
    /// server (or every Cluster node the ping reaches) is up.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Timeout`] when the
    /// server does not answer within the store's timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let value = self.inner.caller.query(&redis::cmd("PING")).await?;
        match value {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            Value::BulkString(s) if s == b"PONG" => Ok(()),
            other => Err(StoreError::Protocol {
                detail: format!("PING answered {other:?}"),
            }),
        }
    }

    /// The SHA-1 of the script that checks `policies` (in this order):
    /// what `EVALSHA` calls it, and what `SLOWLOG` and `redis-benchmark`
    /// show.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use portcullis::Policy;
    ///
    /// let store = portcullis::redis::RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// let sha = store.script_sha(&[Policy::per_second(10).build()?])?;
    /// assert_eq!(sha.len(), 40);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Protocol`] for an algorithm this version has no
    /// script for.
    pub fn script_sha(&self, policies: &[Policy]) -> Result<String, StoreError> {
        Ok(self
            .inner
            .caller
            .scripts
            .get(policies.iter().map(Policy::algorithm))?
            .sha()
            .to_owned())
    }

    /// How checks are called: [`CallPath::Functions`] (the default), or
    /// [`CallPath::Evalsha`] once a server refused `FCALL` or `FUNCTION`
    /// (Redis before 7, an ACL without them). The store starts on Redis
    /// Functions and falls back at the first refusal, for good. A node too
    /// full to load the library (`maxmemory` with `noeviction`) moves the
    /// store to [`CallPath::Evalsha`] only until the library can be loaded
    /// (on a Cluster, one full node moves the whole store; both paths
    /// decide alike). `build()`
    /// checks the store with a peek, so the path is chosen there; with
    /// [`lazy_connect(true)`](RedisStoreBuilder::lazy_connect) the first
    /// check (or [`ping`](Self::ping)) finds out.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use portcullis::redis::{CallPath, RedisStore};
    ///
    /// // Without a server (lazy): Functions until a server refuses them.
    /// let store = RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// assert_eq!(store.call_path(), CallPath::Functions);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn call_path(&self) -> CallPath {
        self.inner.caller.scripts.path().get()
    }

    /// The name of the Redis Functions library this version loads,
    /// `portcullis_<hash of its source>` (what `FUNCTION LIST` shows).
    #[must_use]
    pub fn library_name(&self) -> &str {
        self.inner.caller.scripts.library().name()
    }

    /// The Redisson-style rate limiter called `name`
    /// ([`redisson`](crate::redisson)). Handles are cheap; each has its own
    /// client id (for [`RateType::PerClient`](crate::redisson::RateType::PerClient));
    /// clones share it.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = portcullis::redis::RedisStore::builder().url("redis://127.0.0.1").lazy_connect(true).build().await?;
    /// let a = store.rate_limiter("exports");
    /// let b = store.rate_limiter("exports");
    /// assert_eq!(a.name(), "exports");
    /// assert_ne!(a.client_id(), b.client_id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn rate_limiter(&self, name: &str) -> RateLimiter {
        RateLimiter::new(Arc::clone(&self.inner.caller), name)
    }
}
