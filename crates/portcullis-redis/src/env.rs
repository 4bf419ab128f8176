//! `store_from_env`: the store an application picks at start-up from one
//! environment variable (Redis when it holds a URL, process memory when it
//! is unset), behind one type that holds rate limits and concurrency
//! leases.

use portcullis_core::{BoxLeaseStore, MemoryStore};

use crate::{redact_url, BuildError, RedisStore};

/// The store named by the environment variable `var`: a [`RedisStore`]
/// built from its URL (what [`RedisStoreBuilder::url`](crate::RedisStoreBuilder::url)
/// takes: `redis://`, `rediss://`, `redis+unix://`) when it is set and not
/// empty, else a [`MemoryStore`] with its defaults. Both
/// come as a [`BoxLeaseStore`], so the application is not generic over the
/// store, and the one store serves a `RateLimitLayer`
/// ([`Store`](portcullis_core::Store)) and a `ConcurrencyLimitLayer`
/// ([`LeaseStore`](portcullis_core::LeaseStore)); `.into()` makes it a
/// [`BoxStore`](portcullis_core::BoxStore) where only rates are checked.
///
/// The Redis store is built with its defaults and connected at once, so a
/// wrong URL or an unreachable server fails here, at start-up, with a
/// message that says what to change. Where the state lives is logged at
/// `info` (the URL with its password replaced by `***`). For a key prefix,
/// TLS files, a pool size or timeouts, build the store yourself with
/// [`RedisStore::builder`] and pass it to [`BoxLeaseStore::new`] (or to
/// `BoxStore::new` if it needs no concurrency limits).
///
/// # Errors
///
/// The [`BuildError`] of [`RedisStoreBuilder::build`](crate::RedisStoreBuilder::build)
/// when the variable holds a URL.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{ConcurrencyPolicy, LeaseId, LeaseStore, Policy, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Unset here, so the state lives in process memory.
/// let store = portcullis::redis::store_from_env("PORTCULLIS_DOC_UNSET_REDIS_URL").await?;
/// let policies = [Policy::per_minute(1).name("api").build()?];
/// assert!(store.check("alice", &policies, 1).await?.is_allowed());
/// assert!(!store.check("alice", &policies, 1).await?.is_allowed());
/// // The same store holds concurrency leases.
/// let running = ConcurrencyPolicy::max_in_flight(1).lease_ttl(Duration::from_secs(30)).build()?;
/// assert!(store.acquire("alice", &running, LeaseId::generate()).await?.is_granted());
/// assert!(!store.acquire("alice", &running, LeaseId::generate()).await?.is_granted());
/// # Ok(()) }
/// ```
pub async fn store_from_env(var: &str) -> Result<BoxLeaseStore, BuildError> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => {
            let store = RedisStore::builder().url(url.trim()).build().await?;
            tracing::info!(
                "rate-limit state in Redis at {} ({var})",
                redact_url(url.trim())
            );
            Ok(BoxLeaseStore::new(store))
        }
        _ => {
            tracing::info!(
                "rate-limit state in process memory; set {var} to a redis:// URL to share it between instances"
            );
            Ok(BoxLeaseStore::new(MemoryStore::new()))
        }
    }
}
