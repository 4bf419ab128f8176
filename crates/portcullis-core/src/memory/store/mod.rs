//! [`MemoryStore`]: the public type, its inherent methods and its
//! [`Store`] impl. Its other concerns live in this module's submodules:
//! `builder.rs` ([`MemoryStoreBuilder`]), `hot_path.rs` (the GCRA charge of
//! a known subject under the shard's read lock), `check.rs` (the check
//! [`Store::check`] and [`MemoryStore::check_denial`] make: inline for the
//! hot path, out of line for the rest), `charge.rs`
//! ([`Store::charge`]), `options.rs` ([`Store::check_with`]), `reserve.rs`
//! (the [`ReservationStore`](crate::ReservationStore) impl) and `lease.rs`
//! (the [`LeaseStore`](crate::LeaseStore) impl).

use std::fmt;
use std::future::{ready, Ready};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

pub use self::builder::MemoryStoreBuilder;
use super::entry::Entry;
use super::key::Key;
use super::table::{Inner, Shard, ShardLock, WhenFull};
use crate::{Clock, Policy, Store, StoreError, Verdict};

pub(super) mod builder;
mod charge;
mod check;
mod hot_path;
mod lease;
mod options;
mod reserve;
mod subjects;

/// Times a new subject tries to make room in other shards before it is
/// refused (other threads may take the room it made).
const MAKE_ROOM_ATTEMPTS: usize = 4;

/// The number of subjects a [`MemoryStore`] holds at most unless its
/// builder says otherwise: 262 144 (2^18).
///
/// A held subject with a key of up to 22 bytes and one GCRA policy costs
/// 41 bytes in its shard's table (the entry and one control byte), and a
/// table is between 7/16 and 7/8 full, so the default bound keeps a store
/// under about 25 MB ([`MemoryStore::bytes_per_entry`]; measure with
/// [`MemoryStore::memory_bytes`]). Size it to the subjects active within
/// your longest policy's period: a store at its bound evicts (or denies,
/// per [`WhenFull`]) rather than grow.
pub const DEFAULT_MAX_KEYS: usize = 1 << 18;

/// A concurrent, in-process [`Store`].
///
/// Checks answer synchronously (the future is [`std::future::Ready`]) and
/// lock only the shard the subject hashes to, so unrelated subjects proceed
/// in parallel; GCRA charges of known subjects (the common case) take that
/// lock shared and update the state by compare-and-swap. Every policy of one
/// subject lives in one shard: a multi-policy check is all or nothing.
///
/// Time comes from the [`FastClock`](crate::FastClock) unless the builder is given another
/// clock.
///
/// Cloning is cheap and **shares state**: clones see and charge the same
/// counters (an [`Arc`] inside), which is how one store serves several
/// services or tasks.
///
/// Memory stays bounded without a background thread: a subject's state is
/// forgotten once it is back to full capacity, and shards sweep such
/// subjects away as they admit and insert (a denial writes nothing and
/// sweeps nothing; see [`MemoryStore::len`] and
/// [`MemoryStore::purge_expired`]). The number of subjects is capped at
/// 262 144 (2^18) unless [`MemoryStoreBuilder::max_keys`] or
/// [`MemoryStoreBuilder::unbounded`] says otherwise; a full store keeps
/// checking held subjects exactly and evicts or denies new ones
/// ([`WhenFull`]). [`MemoryStore::bytes_per_entry`] and
/// [`MemoryStore::memory_bytes`] size it.
///
/// Subjects longer than [`MAX_PLAIN_SUBJECT_LEN`] bytes are stored by their SHA-256 digest, so a hostile subject costs a
/// bounded amount of memory; shorter ones are stored as they are, whatever
/// their characters.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{ManualClock, MemoryStore, Policy, Store};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let store = MemoryStore::builder().clock(clock.clone()).max_keys(100_000).build();
/// let policies = [Policy::per_second(1).name("api").build()?];
///
/// assert!(store.check("alice", &policies, 1).await?.is_allowed());
/// let denied = store.check("alice", &policies, 1).await?;
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
///
/// // A clone shares the state.
/// let clone = store.clone();
/// assert!(!clone.check("alice", &policies, 1).await?.is_allowed());
///
/// clock.advance(Duration::from_secs(1));
/// assert!(clone.check("alice", &policies, 1).await?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// [`MAX_PLAIN_SUBJECT_LEN`]: crate::subject::MAX_PLAIN_SUBJECT_LEN
#[derive(Clone)]
pub struct MemoryStore {
    pub(super) inner: Arc<Inner>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .field("shards", &self.inner.shards.len())
            .field("max_keys", &self.inner.max_keys)
            .field("when_full", &self.inner.when_full)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store on the [`FastClock`](crate::FastClock) with default sharding, holding at most
    /// 262 144 (2^18) subjects (evicting per
    /// [`WhenFull::EvictNearestFull`] beyond; see
    /// [`MemoryStoreBuilder::unbounded`] to opt out).
    ///
    /// ```
    /// use portcullis::MemoryStore;
    ///
    /// let store = MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// assert_eq!(store.max_keys(), Some(262_144));
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A store reading time from `clock`, otherwise as [`MemoryStore::new`].
    ///
    /// ```
    /// use portcullis::{ManualClock, MemoryStore};
    ///
    /// let clock = ManualClock::new(1_700_000_000_000_000);
    /// let store = MemoryStore::with_clock(clock.clone());
    /// assert!(store.is_empty());
    /// ```
    #[must_use]
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::builder().clock(clock).build()
    }

    /// A builder for a store with a custom clock, shard count or subject cap.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// The number of subjects held.
    ///
    /// This counts every subject whose entry is still in memory, which
    /// includes subjects whose state has expired but that no sweep has
    /// removed yet: it is the figure that memory use follows. Call
    /// [`MemoryStore::purge_expired`] first for the number of live subjects.
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let policies = [Policy::per_minute(5).build()?];
    /// store.check("alice", &policies, 1).await?;
    /// store.check("bob", &policies, 1).await?;
    /// store.peek("carol", &policies).await?; // a peek stores nothing
    /// assert_eq!(store.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Relaxed)
    }

    /// Whether no subject is held (see [`MemoryStore::len`]).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most subjects the store holds, or `None` when
    /// [`unbounded`](MemoryStoreBuilder::unbounded).
    #[must_use]
    pub fn max_keys(&self) -> Option<usize> {
        self.inner.max_keys
    }

    /// Bytes a held subject takes in its shard's table: its entry and one
    /// control byte (41 on 64-bit targets). Tables are between 7/16 and
    /// 7/8 full, so a subject costs between about 1.14 and 2.3 times this;
    /// a key longer than 22 bytes adds its length (keys longer than
    /// [`MAX_PLAIN_SUBJECT_LEN`] are stored as 33 bytes), and a subject
    /// with other states than one GCRA state (several policies, other
    /// algorithms) moves them to the heap: 24 bytes and 80 per policy (the state, its policy's name and the units it is written in).
    /// Multiply by [`MemoryStore::max_keys`] to size a store.
    ///
    /// ```
    /// use portcullis::MemoryStore;
    ///
    /// let default_max_keys = MemoryStore::new().max_keys().unwrap();
    /// let worst = MemoryStore::bytes_per_entry() * 16 / 7 * default_max_keys;
    /// assert!(worst < 32 << 20, "the default bound stays under 32 MiB");
    /// ```
    ///
    /// [`MAX_PLAIN_SUBJECT_LEN`]: crate::subject::MAX_PLAIN_SUBJECT_LEN
    #[must_use]
    pub const fn bytes_per_entry() -> usize {
        std::mem::size_of::<Entry>() + 1
    }

    /// The memory the store holds now, in bytes: its tables' allocations,
    /// what entries hold outside them (long keys, several policies), and
    /// the idempotency records ([`MemoryStore::idempotency_records`]) and
    /// token reservations ([`MemoryStore::reservations`]).
    /// Scans every entry, one shard at a time under its read lock: for a
    /// metric scraped now and then, not for every request.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        let mut bytes = std::mem::size_of::<Inner>()
            + self.inner.shards.len() * std::mem::size_of::<CachePadded<ShardLock>>();
        for shard in &*self.inner.shards {
            let shard = shard.read();
            bytes += shard.table.allocation_size();
            bytes += shard.names.heap_bytes();
            bytes += shard.table.iter().map(Entry::heap_bytes).sum::<usize>();
            bytes += shard.records.memory_bytes();
            bytes += shard.reservations.memory_bytes();
        }
        bytes
    }

    /// Removes every subject whose state has expired, in every shard, now,
    /// and returns how many were removed.
    ///
    /// Never needed for correctness or for bounded memory (shards sweep as
    /// they serve operations); useful from an application's own timer to
    /// return memory after a burst of traffic that then stopped, or before
    /// reading an exact [`MemoryStore::len`]. Locks one shard at a time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{ManualClock, MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let clock = ManualClock::new(1_700_000_000_000_000);
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let policies = [Policy::per_second(10).build()?];
    /// store.check("alice", &policies, 1).await?;
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(store.purge_expired(), 1);
    /// assert!(store.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn purge_expired(&self) -> usize {
        let now = self.inner.clock.now_micros();
        let mut removed = 0;
        for shard in &*self.inner.shards {
            let mut shard = shard.write();
            let freed = shard.purge(now);
            self.inner.forget(freed);
            removed += freed;
        }
        removed
    }

    /// Runs `check` on the shard of the subject hashed to `hash`, under its
    /// write lock. When the store is full, frees room in the other shards
    /// (one lock at a time) and runs it once more.
    #[inline(always)]
    fn on_shard<T>(
        &self,
        hash: u64,
        now: u64,
        check: impl Fn(&mut Shard, &Inner) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let shard = inner.shard(hash);
        let first = check(&mut shard.write(), inner);
        if !matches!(first, Err(StoreError::Full { .. })) {
            return first;
        }
        self.make_room(now, first, || check(&mut shard.write(), inner))
    }

    fn reset_now(&self, subject: &str, policies: &[Policy]) {
        let key = Key::new(subject);
        let key = key.as_bytes();
        let inner = &*self.inner;
        let hash = inner.hash_key(key);
        let mut guard = inner.shard(hash).write();
        let shard = &mut *guard;
        shard.demote_if_hot(hash);
        let hot = shard.hot_tat.load(Ordering::Relaxed);
        let Ok(mut entry) = shard.table.find_entry(hash, |e| e.key.matches(key)) else {
            return;
        };
        if entry.get_mut().forget(&shard.names, policies) {
            entry.remove();
            inner.forget(1);
        } else {
            let expires_at_us = entry.get().expires_at_us(hot);
            shard.note_expiry(expires_at_us);
        }
    }

    /// A new subject found the store full and its own shard could not
    /// make room: sweep expired entries everywhere (and, when evicting,
    /// evict from the fullest shard), then retry; a few times, since other
    /// threads may take the room made. A refusal carries the time until the
    /// first held subject expires.
    #[cold]
    #[inline(never)]
    fn make_room<T>(
        &self,
        now: u64,
        first: Result<T, StoreError>,
        retry: impl Fn() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let mut result = first;
        for _ in 0..MAKE_ROOM_ATTEMPTS {
            let mut freed = 0;
            for shard in &*inner.shards {
                // Looked at under the read lock first: a flood of new
                // subjects at the bound must not stop every shard in turn.
                if shard.read().min_expires_at_us > now {
                    continue;
                }
                let mut shard = shard.write();
                if shard.min_expires_at_us <= now {
                    let purged = shard.purge(now);
                    inner.forget(purged);
                    freed += purged;
                }
            }
            if freed == 0 && inner.when_full == WhenFull::EvictNearestFull {
                let fullest = inner
                    .shards
                    .iter()
                    .max_by_key(|shard| shard.read().table.len());
                if let Some(shard) = fullest
                    && shard.write().evict_one(now)
                {
                    inner.forget(1);
                    freed = 1;
                }
            }
            if freed == 0 {
                break;
            }
            result = retry();
            if !matches!(result, Err(StoreError::Full { .. })) {
                return result;
            }
        }
        match result {
            Err(StoreError::Full { max_keys, .. }) => {
                let first_expiry = inner
                    .shards
                    .iter()
                    .map(|shard| shard.read().min_expires_at_us)
                    .min()
                    .unwrap_or(u64::MAX);
                Err(StoreError::Full {
                    max_keys,
                    retry_after: std::time::Duration::from_micros(
                        first_expiry.saturating_sub(now).max(1),
                    ),
                })
            }
            other => other,
        }
    }
}

impl Store for MemoryStore {
    type CheckFuture = Ready<Result<Verdict, StoreError>>;

    #[inline]
    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        ready(self.check_sync(subject, policies, cost))
    }

    #[inline]
    fn check_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        Some(self.check_sync(subject, policies, cost))
    }

    #[inline]
    fn check_denial_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Option<Verdict>, StoreError>> {
        Some(self.check_denial(subject, policies, cost))
    }

    fn charge(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> impl std::future::Future<Output = Result<Verdict, StoreError>> + Send + 'static {
        ready(self.charge_now(subject, policies, cost))
    }

    fn check_with(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &crate::CheckOptions,
    ) -> impl std::future::Future<Output = Result<crate::Checked, StoreError>> + Send + 'static
    {
        ready(self.check_with_now(subject, policies, cost, options))
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static {
        self.reset_now(subject, policies);
        ready(Ok(()))
    }
}
