//! The concurrent in-memory store.
//!
//! # Layout
//!
//! State lives in a fixed number of shards, each a [`std::sync::RwLock`]
//! on its own cache line around a [`hashbrown::HashTable`] of entries,
//! stored in the table itself: a lookup reads a group of control bytes and
//! then the entry, two dependent memory accesses. (A dense `Vec` of entries
//! behind a table of positions holds less memory but adds a third access,
//! and measured slower at a million subjects.) An entry is one subject: its
//! key and one slot (policy name, algorithm state) per policy that has
//! charged it. The subject's hash
//! picks the shard, so every policy of one subject sits behind one lock and
//! a multi-policy check is one critical section under the write lock: every
//! policy's [`algorithms::check`] is computed first and the new states are
//! written only if all admit.
//!
//! The subject is hashed once per call; the same hash picks the shard (from
//! high bits) and the bucket (hashbrown uses the low bits and the top
//! seven). A lookup borrows the caller's `&str` and allocates nothing; only
//! a new subject may allocate (its key when longer than 24 bytes, and its
//! list of slots when it has more than one policy; policy names are
//! shared). An entry is 96 bytes plus those allocations.
//!
//! # The GCRA hot path
//!
//! A GCRA state whose TAT has no fraction of a microsecond (every state of
//! a policy whose emission interval `period / limit` is whole, such as ten
//! per second or a thousand per minute) is kept as one [`AtomicU64`], which
//! is also its expiry. A one-policy GCRA charge of a subject that holds
//! only such a state runs under the shard's **read** lock and replaces the
//! TAT by compare-and-swap, with the arithmetic of [`algorithms::check`]
//! rearranged so that admitting takes no division (a property test holds
//! the two equal). Charges of any subjects in one shard, including the same
//! subject, then proceed in parallel, and stay exact: a swap that lost to
//! another recomputes from the TAT that won. A subject whose swap lost
//! becomes its shard's *hot slot*: its TAT moves (under the write lock)
//! next to the shard's lock word, so that charging it contends for one
//! cache line instead of two; the general path moves it back into its
//! entry before touching the subject, and a sweep frees it with the entry.
//! One subject per shard holds the hot slot, until its state expires.
//! Everything else (new subjects,
//! other algorithms, several policies, fractional TATs, peeks) takes the
//! write lock, with GCRA on a `u64` fast path there too.
//!
//! # Expiry and sweeping
//!
//! Every slot knows when its state is back to full capacity
//! ([`Step::expires_at_us`]); an entry expires with the latest of its
//! slots. A state past its expiry is the same as no state, so expired slots
//! and entries are treated as absent on lookup and reused in place. Memory is
//! reclaimed without a background thread, by work proportional to the
//! operations a shard serves:
//!
//! - **Incremental sweep.** Every [`SWEEP_EVERY`] operations on a shard
//!   scan the next [`SWEEP_CHUNK`] buckets of its table (a cursor walks the
//!   table round and round) and drop expired entries. While a chunk yields
//!   at least a quarter of its buckets as expired entries, up to
//!   [`SWEEP_MAX_CHUNKS`] chunks are scanned in a row (the work is then
//!   paid for by the entries freed, which were each inserted once). When
//!   the cursor completes a pass over a table that is more than three
//!   quarters empty, the table shrinks.
//!   Hot-path charges count per thread instead of per shard (so they write
//!   nothing shared): every [`SWEEP_EVERY`]-th on a thread sweeps a shard,
//!   taking the shards in turn rather than the one charged (a traffic
//!   pattern that repeats every [`SWEEP_EVERY`] charges would otherwise
//!   reach the same few shards).
//! - **Sweep before growth.** When inserting a subject would make a shard's
//!   table grow, the whole shard is swept first; if that frees less than an
//!   eighth of it, the table grows at once, so the next such sweep is at
//!   least an eighth of a table's worth of inserts away.
//! - **`max_keys`.** The store holds at most [`DEFAULT_MAX_KEYS`] subjects
//!   unless told otherwise ([`MemoryStoreBuilder::max_keys`],
//!   [`MemoryStoreBuilder::unbounded`]). When it is full, a new subject
//!   first sweeps its own shard; if nothing there has expired it evicts, in
//!   its own shard (when that holds at least half its share of the bound,
//!   else in the fullest shard), the sampled entry that is soonest back to
//!   full capacity ([`WhenFull::EvictNearestFull`], the default), or (with
//!   [`WhenFull::Deny`]) sweeps every shard that may hold expired entries,
//!   outside its own lock, and retries.
//!   Subjects already held never need room: they are always checked
//!   exactly, except the one an eviction removes.
//!
//! Each shard keeps a lower bound of its entries' expiry times (made exact
//! by every full sweep and at the end of every incremental pass; a hot-path
//! charge only moves an expiry later), so shards with nothing expired skip
//! their sweeps without a scan.
//!
//! Each of these costs O(1) amortized per operation. A shard that stops
//! receiving operations keeps its expired entries until it is used again or
//! [`MemoryStore::purge_expired`] is called (from a timer of the
//! application's own, if it wants one).

use std::borrow::Cow;
use std::fmt;
use std::future::{ready, Ready};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use crate::algorithms::{self, GcraState, State, Step};
use crate::{
    validate_check, Algorithm, Clock, Decision, FastClock, Policy, Store, StoreError, Verdict,
    MAX_PLAIN_SUBJECT_LEN,
};

/// Operations on a shard between two incremental sweeps.
const SWEEP_EVERY: u32 = 64;
/// Buckets scanned per chunk of an incremental sweep.
const SWEEP_CHUNK: usize = 128;
/// Most chunks one incremental sweep scans.
const SWEEP_MAX_CHUNKS: usize = 16;
/// A table with fewer buckets is never shrunk.
const MIN_SHRINK_BUCKETS: usize = 256;
/// Most shards a store may have.
const MAX_SHARDS: usize = 4096;
/// The first byte of a hashed subject's key: never a byte of UTF-8.
const HASHED_KEY_TAG: u8 = 0xFF;
/// Most policy names a shard shares between its subjects.
const MAX_INTERNED_NAMES: usize = 32;
/// Entries an eviction compares (the one soonest back to full goes).
const EVICT_SAMPLE: usize = 16;
/// Times a new subject tries to make room in other shards before it is
/// refused (other threads may take the room it made).
const MAKE_ROOM_ATTEMPTS: usize = 4;

/// The number of subjects a [`MemoryStore`] holds at most unless its
/// builder says otherwise: 262 144 (2^18).
///
/// A held subject with a key of up to 24 bytes and one policy costs 97
/// bytes in its shard's table (the entry and one control byte), and a table
/// is between 7/16 and 7/8 full, so the default bound keeps a store under
/// about 60 MB ([`MemoryStore::bytes_per_entry`]; measure with
/// [`MemoryStore::memory_bytes`]). Size it to the subjects active within
/// your longest policy's period: a store at its bound evicts (or denies,
/// per [`WhenFull`]) rather than grow.
pub const DEFAULT_MAX_KEYS: usize = 1 << 18;

/// What a [`MemoryStore`] at its bound ([`MemoryStoreBuilder::max_keys`])
/// does with a subject it does not hold, once no expired subject can be
/// swept away. Subjects already held are checked exactly either way.
///
/// ```
/// use tollgate_core::{MemoryStore, WhenFull};
///
/// assert_eq!(WhenFull::default(), WhenFull::EvictNearestFull);
/// let strict = MemoryStore::builder().max_keys(10_000).when_full(WhenFull::Deny).build();
/// # let _ = strict;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WhenFull {
    /// Store the new subject in place of the held one whose loss admits
    /// least (the default): among 16 sampled entries of the
    /// new subject's shard (or of the fullest shard, when the new subject's
    /// holds less than half its share of the bound), an expired one if any,
    /// else the one soonest back to full capacity (the smallest remaining
    /// wait).
    ///
    /// **Worst case.** An eviction forgets one subject's state, so that
    /// subject may again be admitted the permits its state still held back:
    /// at most its policies' capacity (burst), and never more than the
    /// permits its state would have regained by the time it was back to
    /// full. No other subject's decision changes. Under a sustained flood of
    /// new subjects, each eviction over-admits at most that much for one
    /// subject, and subjects that spent more than the flood's (a held user
    /// with one permit left, against fresh identities that spent one each)
    /// are evicted last.
    ///
    /// Why the default: denying instead lets a flood of fresh identities
    /// (which each get their limit anyway) lock every legitimate new user
    /// out until entries expire — up to a day for a daily quota — while
    /// evicting the entry nearest to full costs at most a few permits of
    /// one lightly used subject per eviction.
    #[default]
    EvictNearestFull,
    /// Refuse the new subject with [`StoreError::Full`], whose
    /// `retry_after` is when the first held subject expires (the tower layer
    /// answers `429` with that `Retry-After`, never lets it through). No
    /// held subject is ever forgotten early, but while the store is full no
    /// new subject is admitted.
    Deny,
}

/// A concurrent, in-process [`Store`].
///
/// Checks answer synchronously (the future is [`std::future::Ready`]) and
/// lock only the shard the subject hashes to, so unrelated subjects proceed
/// in parallel; GCRA charges of known subjects (the common case) take that
/// lock shared and update the state by compare-and-swap. Every policy of one
/// subject lives in one shard: a multi-policy check is all or nothing.
///
/// Time comes from the [`FastClock`] unless the builder is given another
/// clock.
///
/// Cloning is cheap and **shares state**: clones see and charge the same
/// counters (an [`Arc`] inside), which is how one store serves several
/// services or tasks.
///
/// Memory stays bounded without a background thread: a subject's state is
/// forgotten once it is back to full capacity, and shards sweep such
/// subjects away as they serve operations (see [`MemoryStore::len`] and
/// [`MemoryStore::purge_expired`]). The number of subjects is capped at
/// [`DEFAULT_MAX_KEYS`] unless [`MemoryStoreBuilder::max_keys`] or
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
/// use tollgate_core::{ManualClock, MemoryStore, Policy, Store};
///
/// # futures::executor::block_on(async {
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
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Each on its own cache line, so threads working on different shards
    /// do not slow each other down.
    shards: Box<[CachePadded<ShardLock>]>,
    /// `shards.len() - 1`; the length is a power of two.
    shard_mask: usize,
    hasher: foldhash::fast::RandomState,
    clock: StoreClock,
    max_keys: Option<usize>,
    when_full: WhenFull,
    /// Entries held over all shards (live or expired but not yet swept).
    len: AtomicUsize,
}

/// The clock, with the default [`FastClock`] dispatched statically (it is
/// read on every check).
#[derive(Debug, Clone)]
enum StoreClock {
    Fast,
    Custom(Arc<dyn Clock>),
}

impl StoreClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        match self {
            Self::Fast => FastClock.now_micros(),
            Self::Custom(clock) => clock.now_micros(),
        }
    }
}

/// Builder for a [`MemoryStore`]; finish with [`MemoryStoreBuilder::build`].
///
/// ```
/// use tollgate_core::{ManualClock, MemoryStore};
///
/// let store = MemoryStore::builder()
///     .clock(ManualClock::new(0))
///     .shards(16)
///     .max_keys(1_000_000)
///     .build();
/// assert!(store.is_empty());
/// assert_eq!(store.max_keys(), Some(1_000_000));
/// ```
#[derive(Debug, Clone)]
#[must_use = "a MemoryStoreBuilder does nothing until .build() is called"]
pub struct MemoryStoreBuilder {
    clock: StoreClock,
    shards: Option<usize>,
    max_keys: Option<usize>,
    when_full: WhenFull,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            clock: StoreClock::Fast,
            shards: None,
            max_keys: Some(DEFAULT_MAX_KEYS),
            when_full: WhenFull::default(),
        }
    }
}

impl MemoryStoreBuilder {
    /// Reads time from `clock` instead of the [`FastClock`] (pass
    /// [`SystemClock`](crate::SystemClock) to read `SystemTime` on every
    /// check). Pass a clone
    /// of a [`ManualClock`](crate::ManualClock) to drive time in tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = StoreClock::Custom(Arc::new(clock));
        self
    }

    /// Sets the number of shards (independent locks), rounded up to a power
    /// of two between 1 and 4096. Defaults to four per available CPU.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Caps the number of subjects held (default [`DEFAULT_MAX_KEYS`]).
    ///
    /// When the store is full, a check that would add a new subject first
    /// sweeps expired subjects; if none can be freed it evicts or refuses,
    /// per [`MemoryStoreBuilder::when_full`]. Subjects already held keep
    /// being checked exactly, and peeks and denials never need room.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// Removes the cap on the number of subjects: the store then holds the
    /// subjects active within their policies' periods, plus expired ones
    /// not yet swept, however many that is. An explicit opt-out: a flood of
    /// distinct subjects (IP addresses, API keys) then grows memory without
    /// bound.
    pub fn unbounded(mut self) -> Self {
        self.max_keys = None;
        self
    }

    /// What a full store does with a subject it does not hold (default
    /// [`WhenFull::EvictNearestFull`]; see [`WhenFull`] for the worst case
    /// of each).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// Builds the store.
    #[must_use]
    pub fn build(self) -> MemoryStore {
        if let StoreClock::Fast = self.clock {
            // The first reading calibrates the counter (under a
            // millisecond): pay it here rather than on the first check.
            let _ = FastClock.now_micros();
        }
        let shards = self
            .shards
            .unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get) * 4
            })
            .clamp(1, MAX_SHARDS)
            .next_power_of_two();
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| CachePadded::new(ShardLock(RwLock::new(Shard::new()))))
                    .collect(),
                shard_mask: shards - 1,
                hasher: foldhash::fast::RandomState::default(),
                clock: self.clock,
                max_keys: self.max_keys,
                when_full: self.when_full,
                len: AtomicUsize::new(0),
            }),
        }
    }
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
    /// A store on the [`FastClock`] with default sharding, holding at most
    /// [`DEFAULT_MAX_KEYS`] subjects (evicting per
    /// [`WhenFull::EvictNearestFull`] beyond; see
    /// [`MemoryStoreBuilder::unbounded`] to opt out).
    ///
    /// ```
    /// use tollgate_core::{MemoryStore, DEFAULT_MAX_KEYS};
    ///
    /// let store = MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// assert_eq!(store.max_keys(), Some(DEFAULT_MAX_KEYS));
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A store reading time from `clock`, otherwise as [`MemoryStore::new`].
    ///
    /// ```
    /// use tollgate_core::{ManualClock, MemoryStore};
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
    /// use tollgate_core::{MemoryStore, Policy, Store};
    ///
    /// # futures::executor::block_on(async {
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
    /// control byte (97 on 64-bit targets). Tables are between 7/16 and
    /// 7/8 full, so a subject costs between about 1.14 and 2.3 times this;
    /// a key longer than 24 bytes adds its length (keys longer than
    /// [`MAX_PLAIN_SUBJECT_LEN`] are stored as 33 bytes), and a subject
    /// charged by more than one policy moves its slots to the heap, 56
    /// bytes per policy. Multiply by [`MemoryStore::max_keys`] to size a
    /// store.
    ///
    /// ```
    /// use tollgate_core::MemoryStore;
    ///
    /// let worst = MemoryStore::bytes_per_entry() * 16 / 7 * tollgate_core::DEFAULT_MAX_KEYS;
    /// assert!(worst < 64 << 20, "the default bound stays under 64 MiB");
    /// ```
    #[must_use]
    pub const fn bytes_per_entry() -> usize {
        std::mem::size_of::<Entry>() + 1
    }

    /// The memory the store holds now, in bytes: its tables' allocations
    /// and what entries hold outside them (long keys, several policies).
    /// Scans every entry, one shard at a time under its read lock: for a
    /// metric scraped now and then, not for every request.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        let mut bytes = std::mem::size_of::<Inner>()
            + self.inner.shards.len() * std::mem::size_of::<CachePadded<ShardLock>>();
        for shard in &*self.inner.shards {
            let shard = shard.read();
            bytes += shard.table.allocation_size();
            bytes += shard.names.capacity() * std::mem::size_of::<Arc<str>>();
            for entry in shard.table.iter() {
                if entry.key.spilled() {
                    bytes += entry.key.capacity();
                }
                if entry.slots.spilled() {
                    bytes += entry.slots.capacity() * std::mem::size_of::<Slot>();
                }
            }
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
    /// use tollgate_core::{ManualClock, MemoryStore, Policy, Store};
    ///
    /// # futures::executor::block_on(async {
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
                if let Some(shard) = fullest {
                    if shard.write().evict_one(now) {
                        inner.forget(1);
                        freed = 1;
                    }
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

    /// The hot path: a GCRA charge of a subject whose only state is a
    /// [`SlotState::Tat`] of this policy, made under the shard's read lock
    /// by compare-and-swap. `None` (having changed nothing) for everything
    /// else, which takes the general path.
    #[inline(always)]
    fn charge_known_gcra(
        &self,
        key: &[u8],
        hash: u64,
        now: u64,
        policy: &Policy,
        cost: u64,
    ) -> Option<Decision> {
        if policy.algorithm() != Algorithm::Gcra || cost == 0 {
            return None;
        }
        let interval = policy.whole_interval_micros()?;
        let inner = &*self.inner;
        let lock = inner.shard(hash);
        let shard = lock.read();
        let (charged, promote) = shard.charge_known_gcra(hash, key, policy, interval, now, cost)?;
        drop(shard);
        if promote {
            lock.write().promote(hash, key, policy, now);
        }
        // These charges count towards sweeps per thread rather than per
        // shard (a shared counter would be written on every charge): every
        // `SWEEP_EVERY`-th charge on a thread sweeps a shard, taking the
        // shards in turn rather than the one charged, so that no traffic
        // pattern can leave a shard unswept.
        if let Some(turn) = hot_tick() {
            // Looked at under the read lock first: a write lock would stop
            // the shard's other readers even when there is nothing to do.
            let target = &inner.shards[turn & inner.shard_mask];
            if target.read().min_expires_at_us <= now {
                let freed = target.write().sweep_some(inner, now);
                inner.forget(freed);
            }
        }
        // The figures of an admission are computed after the lock is let
        // go.
        Some(match charged {
            TatCharge::Denied(decision) => decision,
            TatCharge::Admitted(new_tat_us) => tat_admitted(policy, interval, new_tat_us, now),
        })
    }

    fn reset_now(&self, subject: &str, policies: &[Policy]) {
        let key = Key::new(subject);
        let key = key.as_bytes();
        let inner = &*self.inner;
        let hash = inner.hash_key(key);
        let mut shard = inner.shard(hash).write();
        shard.demote_if_hot(hash);
        let hot = shard.hot_tat.load(Ordering::Relaxed);
        let Ok(mut entry) = shard.table.find_entry(hash, |e| e.key.as_slice() == key) else {
            return;
        };
        let slots = &mut entry.get_mut().slots;
        slots.retain(|slot| !policies.iter().any(|p| p.name() == &*slot.policy));
        if slots.is_empty() {
            entry.remove();
            inner.forget(1);
        } else {
            let expires_at_us = entry.get().expires_at_us(hot);
            shard.note_expiry(expires_at_us);
        }
    }
}

impl Store for MemoryStore {
    type CheckFuture = Ready<Result<Verdict, StoreError>>;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        // A single policy with a cost it can admit is valid; anything else
        // goes through the shared validation (same errors as every store).
        let valid = matches!(policies, [policy] if cost <= policy.capacity());
        if !valid {
            if let Err(err) = validate_check(policies, cost) {
                return ready(Err(err));
            }
        }
        let key = Key::new(subject);
        let key = key.as_bytes();
        let hash = self.inner.hash_key(key);
        // Read before locking to keep the critical section short. Two
        // concurrent checks may then apply their times out of order; every
        // algorithm handles a time earlier than its state's (it never admits
        // more than it would have at the later time).
        let now = self.inner.clock.now_micros();
        // One policy, the common case, carries a `Decision` until the very
        // end rather than a `Verdict` (twice its size).
        if let [policy] = policies {
            if let Some(decision) = self.charge_known_gcra(key, hash, now, policy, cost) {
                return ready(Ok(Verdict::from_one(decision)));
            }
            let decision = self.on_shard(hash, now, |shard, inner| {
                shard.check_one(inner, hash, key, policy, now, cost)
            });
            return ready(decision.map(Verdict::from_one));
        }
        ready(self.on_shard(hash, now, |shard, inner| {
            shard.check_many(inner, hash, key, policies, now, cost)
        }))
    }

    fn check_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        Some(self.check(subject, policies, cost).into_inner())
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

impl Inner {
    #[inline]
    fn hash_key(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &ShardLock {
        &self.shards[self.shard_index(hash)]
    }

    /// Bits 40.. pick the shard; hashbrown uses the low bits for the bucket
    /// and the top seven as a tag, so the two stay independent.
    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        (hash >> 40) as usize & self.shard_mask
    }

    /// The hasher hashbrown needs when it moves entries.
    fn rehash(&self) -> impl Fn(&Entry) -> u64 + '_ {
        |entry| self.hash_key(&entry.key)
    }

    /// Records that `removed` entries left the store.
    #[inline]
    fn forget(&self, removed: usize) {
        if removed > 0 {
            self.len.fetch_sub(removed, Ordering::Relaxed);
        }
    }

    /// Counts a new entry in, or refuses when the cap is reached.
    fn admit_new(&self) -> bool {
        match self.max_keys {
            None => {
                self.len.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(max) => self
                .len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |len| {
                    (len < max).then_some(len + 1)
                })
                .is_ok(),
        }
    }
}

/// A subject as stored: its bytes when it is at most
/// [`MAX_PLAIN_SUBJECT_LEN`] long, or the byte `0xFF` and its SHA-256 digest
/// (raw, not hex: `0xFF` never occurs in UTF-8, so the two never collide).
/// Built on the stack: looking a subject up allocates nothing.
enum Key<'a> {
    Raw(&'a [u8]),
    Hashed([u8; 33]),
}

impl<'a> Key<'a> {
    #[inline(always)]
    fn new(subject: &'a str) -> Self {
        if subject.len() <= MAX_PLAIN_SUBJECT_LEN {
            Self::Raw(subject.as_bytes())
        } else {
            Self::Hashed(Self::hashed(subject))
        }
    }

    #[cold]
    #[inline(never)]
    fn hashed(subject: &str) -> [u8; 33] {
        let mut key = [0; 33];
        key[0] = HASHED_KEY_TAG;
        key[1..].copy_from_slice(&Sha256::digest(subject.as_bytes()));
        key
    }

    #[inline(always)]
    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Raw(key) => key,
            Self::Hashed(key) => key,
        }
    }
}

/// [`algorithms::check`], with GCRA (the default algorithm) on a fast path.
#[inline(always)]
fn check_policy(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Step {
    if policy.algorithm() == Algorithm::Gcra {
        let tat = match state {
            Some(State::Gcra(tat)) => Some(*tat),
            _ => None,
        };
        if let Some(fast) = gcra_fast(policy, tat, now_us, cost) {
            return Step {
                decision: fast.decision,
                new_state: fast.tat.map(State::Gcra),
                expires_at_us: fast.expires_at_us,
            };
        }
    }
    algorithms::check(policy, state, now_us, cost)
}

/// What [`gcra_fast`] decided: a [`Step`] with the state unwrapped.
#[derive(Clone, Copy)]
struct GcraFast {
    decision: Decision,
    /// The new TAT when admitted with a cost.
    tat: Option<GcraState>,
    expires_at_us: u64,
}

/// GCRA exactly as [`algorithms::check`] computes it (`ALGORITHMS.md`,
/// "GCRA"), in `u64` rather than `u128` and computing the figures only a
/// denial reports only on denial: two divisions for an admitted request
/// instead of six 128-bit ones.
///
/// Spans are kept relative to `now` (`span = (time − now)·L`), which policy
/// validation bounds by `2^53` for every state this policy writes. Anything
/// else (a cost above the capacity, a state left by a policy with another
/// limit or period, a time past `u64::MAX`) returns `None`, and the caller
/// uses the reference implementation.
#[inline(always)]
fn gcra_fast(policy: &Policy, tat: Option<GcraState>, now_us: u64, cost: u64) -> Option<GcraFast> {
    let capacity = policy.capacity();
    // `(scale, increment)` is `(limit, period)` for an exact policy.
    let (limit, period) = policy.emission_interval();
    if cost > capacity {
        return None;
    }
    let full = capacity.checked_mul(period)?;
    let span_old = match tat {
        // A fraction of a whole microsecond or more: carried by the
        // reference only.
        Some(GcraState { tat_rem, .. }) if tat_rem >= limit => return None,
        // `tat_us + tat_rem / L >= now` exactly when `tat_us >= now`.
        Some(GcraState { tat_us, tat_rem }) if tat_us >= now_us => {
            (tat_us - now_us).checked_mul(limit)?.checked_add(tat_rem)?
        }
        _ => 0,
    };
    if span_old > full
        && (span_old / limit).saturating_sub(full.div_ceil(limit))
            > full.div_ceil(limit).max(1_000_000)
    {
        // Further ahead than the policy can leave, beyond the clock
        // tolerance: the reference clamps it and writes the repair.
        return None;
    }
    let span_new = span_old.checked_add(cost.max(1).checked_mul(period)?)?;
    if span_new > full {
        let retry_after = (span_new - full).div_ceil(limit);
        let remaining = full.saturating_sub(span_old) / period;
        let reset_after = span_old.div_ceil(limit);
        return Some(GcraFast {
            decision: Decision::denied_us(capacity, remaining, retry_after, reset_after),
            tat: None,
            expires_at_us: now_us.saturating_add(reset_after),
        });
    }
    if cost == 0 {
        let remaining = (full - span_old) / period;
        let reset_after = span_old.div_ceil(limit);
        return Some(GcraFast {
            decision: Decision::allowed_us(capacity, remaining, reset_after),
            tat: None,
            expires_at_us: now_us.saturating_add(reset_after),
        });
    }
    // The new TAT is `now + span_new / L`.
    let (whole, rem) = (span_new / limit, span_new % limit);
    let tat_us = now_us.checked_add(whole)?;
    let remaining = (full - span_new) / period;
    let reset_after = whole + u64::from(rem > 0);
    Some(GcraFast {
        decision: Decision::allowed_us(capacity, remaining, reset_after),
        tat: Some(GcraState {
            tat_us,
            tat_rem: rem,
        }),
        expires_at_us: now_us.saturating_add(reset_after),
    })
}

thread_local! {
    /// Hot-path charges on this thread since its last sweep, and how many
    /// sweeps it made.
    static HOT_OPS: std::cell::Cell<(u32, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Counts a hot-path charge. Every [`SWEEP_EVERY`]-th on this thread, the
/// number of sweeps this thread made before, which picks the shard to
/// sweep.
#[inline]
fn hot_tick() -> Option<usize> {
    HOT_OPS.with(|cell| {
        let (ops, sweeps) = cell.get();
        if ops + 1 < SWEEP_EVERY {
            cell.set((ops + 1, sweeps));
            None
        } else {
            cell.set((0, sweeps.wrapping_add(1)));
            Some(sweeps)
        }
    })
}

/// What a GCRA charge does to a [`SlotState::Tat`].
enum TatCharge {
    /// Admitted: the new TAT.
    Admitted(u64),
    Denied(Decision),
}

/// A GCRA charge of `cost > 0` on the TAT `tat_us` of a policy whose
/// emission interval is `interval` whole microseconds: [`gcra_fast`] with
/// `L` cancelled out of every span, so admitting takes no division. `None`
/// where an intermediate would overflow (the caller takes the general path).
#[inline(always)]
fn tat_charge(
    policy: &Policy,
    interval: u64,
    tat_us: u64,
    now_us: u64,
    cost: u64,
) -> Option<TatCharge> {
    let full = policy.capacity().checked_mul(interval)?;
    // A TAT in the past is the same as no state (so an expired slot needs
    // no telling apart). One further ahead than the policy can leave is
    // clamped, and written back, by the reference.
    let ahead = tat_us.saturating_sub(now_us);
    if ahead.saturating_sub(full) > full.max(1_000_000) {
        return None;
    }
    let span = ahead.checked_add(cost.checked_mul(interval)?)?;
    if span > full {
        // Denials write nothing: their figures come from the reference
        // arithmetic.
        let state = GcraState { tat_us, tat_rem: 0 };
        let denied = gcra_fast(policy, Some(state), now_us, cost)?;
        return Some(TatCharge::Denied(denied.decision));
    }
    Some(TatCharge::Admitted(now_us.checked_add(span)?))
}

/// The decision of an admitting [`tat_charge`] that moved the TAT to
/// `new_tat_us`.
#[inline(always)]
fn tat_admitted(policy: &Policy, interval: u64, new_tat_us: u64, now_us: u64) -> Decision {
    let capacity = policy.capacity();
    // `tat_charge` checked `span <= capacity · interval` without overflow.
    let span = new_tat_us - now_us;
    let remaining = (capacity * interval - span) / interval;
    Decision::allowed_us(capacity, remaining, span)
}

/// A shard's lock: [`std::sync::RwLock`], whose readers retry a lost
/// compare-and-swap at once (parking_lot's back off first, which measured
/// slower with two threads charging one subject). Poisoning is ignored:
/// nothing that runs under the lock panics, and a shard is consistent
/// between any two statements that could.
struct ShardLock(RwLock<Shard>);

impl ShardLock {
    #[inline]
    fn read(&self) -> RwLockReadGuard<'_, Shard> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
    fn write(&self) -> RwLockWriteGuard<'_, Shard> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One subject.
struct Entry {
    /// Inline up to 24 bytes (most user ids, IP addresses, e-mail
    /// addresses): a lookup compares it without leaving the entry.
    key: SmallVec<[u8; 24]>,
    /// One per policy that charged the subject and has not expired (save
    /// for policies no longer used, until the next write drops them).
    slots: SmallVec<[Slot; 1]>,
}

/// One policy's state for one subject.
struct Slot {
    /// Shared with the shard's other slots of the same policy.
    policy: Arc<str>,
    state: SlotState,
}

/// A slot's state, and when it expires.
enum SlotState {
    /// A GCRA state without a fraction of a microsecond (every state of a
    /// policy whose emission interval is a whole number of microseconds):
    /// its TAT, which is also when it expires. The hot path charges it under
    /// the shard's read lock, by compare-and-swap.
    Tat(AtomicU64),
    /// A `Tat` state kept in its shard's [`Shard::hot_tat`] instead, on the
    /// cache line of the shard's lock word: a subject charged by several
    /// threads at once is moved there, so that each charge contends for one
    /// cache line rather than two. At most one slot per shard, always the
    /// only slot of its entry.
    Hot,
    /// Any other state.
    Other { state: State, expires_at_us: u64 },
}

impl SlotState {
    fn new(state: State, expires_at_us: u64) -> Self {
        match state {
            State::Gcra(GcraState { tat_us, tat_rem: 0 }) if tat_us == expires_at_us => {
                Self::Tat(AtomicU64::new(tat_us))
            }
            state => Self::Other {
                state,
                expires_at_us,
            },
        }
    }
}

impl Slot {
    /// When the state expires; `hot` is the shard's [`Shard::hot_tat`].
    #[inline]
    fn expires_at_us(&self, hot: u64) -> u64 {
        match &self.state {
            SlotState::Tat(tat) => tat.load(Ordering::Acquire),
            SlotState::Hot => hot,
            SlotState::Other { expires_at_us, .. } => *expires_at_us,
        }
    }

    /// The state, unless it expired (an expired state is no state).
    #[inline]
    fn live_state(&self, now: u64, hot: u64) -> Option<Cow<'_, State>> {
        let tat_us = match &self.state {
            SlotState::Tat(tat) => tat.load(Ordering::Acquire),
            SlotState::Hot => hot,
            SlotState::Other {
                state,
                expires_at_us,
            } => return (*expires_at_us > now).then_some(Cow::Borrowed(state)),
        };
        (tat_us > now).then_some(Cow::Owned(State::Gcra(GcraState { tat_us, tat_rem: 0 })))
    }

    /// Whether this is its shard's hot slot.
    fn is_hot(&self) -> bool {
        matches!(self.state, SlotState::Hot)
    }
}

impl Entry {
    /// A new subject's entry, without slots yet.
    fn new(key: &[u8]) -> Self {
        Self {
            key: SmallVec::from_slice(key),
            slots: SmallVec::new(),
        }
    }

    /// The latest expiry of the slots: from then on the entry is absent.
    /// `hot` is the shard's [`Shard::hot_tat`].
    #[inline]
    fn expires_at_us(&self, hot: u64) -> u64 {
        match &*self.slots {
            [slot] => slot.expires_at_us(hot),
            slots => slots
                .iter()
                .map(|slot| slot.expires_at_us(hot))
                .max()
                .unwrap_or(0),
        }
    }

    /// Whether the entry holds its shard's hot slot.
    fn is_hot(&self) -> bool {
        self.slots.iter().any(Slot::is_hot)
    }

    /// The position of `policy`'s slot.
    #[inline]
    fn slot(&self, policy: &Arc<str>) -> Option<usize> {
        self.slots
            .iter()
            .position(|slot| same_name(&slot.policy, policy))
    }

    /// The state `policy` left, unless it expired.
    #[inline]
    fn live_state(&self, policy: &Arc<str>, now: u64, hot: u64) -> Option<Cow<'_, State>> {
        self.slots[self.slot(policy)?].live_state(now, hot)
    }

    /// Stores `state` as `policy`'s, in the slot at `position` if known.
    #[inline(always)]
    fn write(
        &mut self,
        names: &mut Vec<Arc<str>>,
        position: Option<usize>,
        policy: &Arc<str>,
        state: State,
        expires_at_us: u64,
    ) {
        match position.and_then(|position| self.slots.get_mut(position)) {
            Some(slot) => slot.state = SlotState::new(state, expires_at_us),
            None => self.add_slot(names, policy, state, expires_at_us),
        }
    }

    #[inline(never)]
    fn add_slot(
        &mut self,
        names: &mut Vec<Arc<str>>,
        policy: &Arc<str>,
        state: State,
        expires_at_us: u64,
    ) {
        self.slots.push(Slot {
            policy: intern(names, policy),
            state: SlotState::new(state, expires_at_us),
        });
    }

    /// After writes: drops the slots that expired (policies no longer used
    /// with this subject).
    #[inline]
    fn refresh(&mut self, now: u64, hot: u64) {
        if self.slots.len() > 1 {
            self.slots.retain(|slot| slot.expires_at_us(hot) > now);
        }
    }
}

// `repr(C)`: `hot_tat` comes first, on the cache line of the lock word
// (the lock's few bytes precede the shard in its `RwLock`).
#[repr(C)]
struct Shard {
    /// The TAT of the shard's hot slot ([`SlotState::Hot`]), if it has
    /// one; charged under the read lock by compare-and-swap.
    hot_tat: AtomicU64,
    /// The hash of the subject that holds the hot slot.
    hot_hash: Option<u64>,
    table: HashTable<Entry>,
    /// Operations since the last incremental sweep.
    ops: u32,
    /// Next bucket the incremental sweep looks at.
    cursor: usize,
    /// Next bucket an eviction looks at.
    evict_cursor: usize,
    /// No entry expires before this (a lower bound, made exact by full
    /// sweeps and at the end of each incremental pass).
    min_expires_at_us: u64,
    /// The least expiry seen by the current incremental pass (entries it
    /// scanned and kept, and every write since it began).
    pass_min_us: u64,
    /// Policy names in use, shared by the slots: a new subject allocates
    /// its key, not its policies' names.
    names: Vec<Arc<str>>,
}

/// The shared copy of a policy name, interning up to [`MAX_INTERNED_NAMES`]
/// names per shard (applications use a handful; past that, each slot holds
/// the `Arc` of the policy that wrote it).
///
/// The first policy seen with a name lends its own `Arc`, so checks made
/// with clones of that policy find their slot by a pointer comparison.
fn intern(names: &mut Vec<Arc<str>>, name: &Arc<str>) -> Arc<str> {
    if let Some(interned) = names.iter().find(|interned| same_name(interned, name)) {
        return Arc::clone(interned);
    }
    if names.len() < MAX_INTERNED_NAMES {
        names.push(Arc::clone(name));
    }
    Arc::clone(name)
}

/// Whether two policy names are equal, comparing pointers first.
#[inline(always)]
fn same_name(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

impl Shard {
    fn new() -> Self {
        Self {
            hot_tat: AtomicU64::new(0),
            hot_hash: None,
            table: HashTable::new(),
            ops: 0,
            cursor: 0,
            evict_cursor: 0,
            min_expires_at_us: u64::MAX,
            pass_min_us: u64::MAX,
            names: Vec::new(),
        }
    }

    /// Counts an operation; every [`SWEEP_EVERY`] runs an incremental
    /// sweep.
    #[inline(always)]
    fn tick(&mut self, inner: &Inner, now: u64) {
        self.ops += 1;
        if self.ops >= SWEEP_EVERY {
            self.ops = 0;
            let freed = self.sweep_some(inner, now);
            inner.forget(freed);
        }
    }

    /// Moves the hot slot back into its entry when `hash` is the hot
    /// subject's, so that the general path finds all of that subject's
    /// state in its entry.
    #[inline(always)]
    fn demote_if_hot(&mut self, hash: u64) {
        if self.hot_hash == Some(hash) {
            self.demote();
        }
    }

    /// Moves the hot slot, if any, back into its entry.
    #[cold]
    #[inline(never)]
    fn demote(&mut self) {
        let Some(hash) = self.hot_hash.take() else {
            return;
        };
        let tat_us = self.hot_tat.load(Ordering::Relaxed);
        if let Some(entry) = self.table.find_mut(hash, Entry::is_hot) {
            for slot in &mut entry.slots {
                if slot.is_hot() {
                    slot.state = SlotState::Tat(AtomicU64::new(tat_us));
                }
            }
        }
    }

    /// Makes `key`'s slot the shard's hot slot, after hot-path charges of it
    /// met one another; unless another live subject holds it (no
    /// ping-pong between two busy subjects of one shard).
    #[cold]
    #[inline(never)]
    fn promote(&mut self, hash: u64, key: &[u8], policy: &Policy, now: u64) {
        if self.hot_hash.is_some() {
            if self.hot_tat.load(Ordering::Relaxed) > now {
                return;
            }
            self.demote();
        }
        let Some(entry) = self.table.find_mut(hash, |e| e.key.as_slice() == key) else {
            return;
        };
        let [slot] = &mut *entry.slots else {
            return;
        };
        let SlotState::Tat(tat) = &slot.state else {
            return;
        };
        if !same_name(&slot.policy, policy.shared_name()) {
            return;
        }
        let tat_us = tat.load(Ordering::Relaxed);
        slot.state = SlotState::Hot;
        self.hot_tat.store(tat_us, Ordering::Relaxed);
        self.hot_hash = Some(hash);
    }

    /// The bucket of `key`'s entry.
    #[inline(always)]
    fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        self.table
            .find_bucket_index(hash, |entry| entry.key.as_slice() == key)
    }

    /// See [`MemoryStore::charge_known_gcra`]. Under the read lock: the
    /// TAT is replaced by compare-and-swap, so charges of different
    /// subjects in one shard, and of one subject, proceed together. It
    /// neither counts towards a sweep nor lowers the shard's least expiry
    /// (a charge only moves a TAT later), so it writes nothing else.
    ///
    /// Also says whether the subject should become the shard's hot slot:
    /// when its swap lost to another thread's.
    #[inline(always)]
    fn charge_known_gcra(
        &self,
        hash: u64,
        key: &[u8],
        policy: &Policy,
        interval: u64,
        now: u64,
        cost: u64,
    ) -> Option<(TatCharge, bool)> {
        let entry = self.table.get_bucket(self.find(hash, key)?)?;
        let [slot] = &*entry.slots else {
            return None;
        };
        let (cell, hot) = match &slot.state {
            SlotState::Tat(cell) => (cell, false),
            SlotState::Hot => (&self.hot_tat, true),
            SlotState::Other { .. } => return None,
        };
        if !same_name(&slot.policy, policy.shared_name()) {
            return None;
        }
        let mut contended = false;
        let mut tat_us = cell.load(Ordering::Acquire);
        loop {
            match tat_charge(policy, interval, tat_us, now, cost)? {
                denied @ TatCharge::Denied(_) => return Some((denied, false)),
                TatCharge::Admitted(new_tat_us) => {
                    match cell.compare_exchange_weak(
                        tat_us,
                        new_tat_us,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        // The figures are computed by the caller, to keep
                        // the window between load and swap short.
                        Ok(_) => return Some((TatCharge::Admitted(new_tat_us), contended && !hot)),
                        Err(current) => {
                            contended |= current != tat_us;
                            tat_us = current;
                        }
                    }
                }
            }
        }
    }

    /// The common case, one policy: no intermediate list of steps, and the
    /// state is written in place.
    #[inline(always)]
    fn check_one(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policy: &Policy,
        now: u64,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let name = policy.shared_name();
        // The time again, under the lock: no state written before is then
        // later than it (with a clock that never goes back), so a state
        // ahead of it beyond the clock tolerance is a policy change or a
        // clock set back, which the algorithm clamps, never a check that
        // read the clock before another's and locked after it.
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let Some(entry) = index.and_then(|index| self.table.get_bucket_mut(index)) else {
            let step = check_policy(policy, None, now, cost);
            if let (true, Some(state)) = (cost > 0, step.new_state) {
                let mut entry = Entry::new(key);
                entry.write(&mut self.names, None, name, state, step.expires_at_us);
                entry.refresh(now, hot);
                self.insert(inner, hash, entry, now)?;
            }
            self.tick(inner, now);
            return Ok(step.decision);
        };
        let position = entry.slot(name);
        let state = position.and_then(|position| entry.slots[position].live_state(now, hot));
        let step = check_policy(policy, state.as_deref(), now, cost);
        if let (true, Some(state)) = (cost > 0, step.new_state) {
            entry.write(&mut self.names, position, name, state, step.expires_at_us);
            entry.refresh(now, hot);
            let expires_at_us = entry.expires_at_us(hot);
            self.note_expiry(expires_at_us);
        }
        self.tick(inner, now);
        Ok(step.decision)
    }

    /// Several policies: every one is computed first, and the new states
    /// are written only if all admit.
    #[inline(never)]
    fn check_many(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policies: &[Policy],
        now: u64,
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        // The time again, under the lock (see `check_one`).
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let mut steps: SmallVec<[Step; 2]> = policies
            .iter()
            .map(|policy| {
                let state =
                    entry.and_then(|entry| entry.live_state(policy.shared_name(), now, hot));
                check_policy(policy, state.as_deref(), now, cost)
            })
            .collect();
        if cost > 0 && steps.iter().any(|step| !step.decision.is_allowed()) {
            // Nothing is charged, so the policies that would have admitted
            // report their state as it stays: as a peek does (which writes
            // only a repair).
            for (policy, step) in policies.iter().zip(steps.iter_mut()) {
                if step.decision.is_allowed() {
                    let state =
                        entry.and_then(|entry| entry.live_state(policy.shared_name(), now, hot));
                    *step = check_policy(policy, state.as_deref(), now, 0);
                }
            }
        }
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        // New states of an admission, and repairs (ALGORITHMS.md, "Changing
        // a policy") whatever the verdict; a peek writes nothing.
        let write = cost > 0 && steps.iter().any(|step| step.new_state.is_some());
        if !write {
            self.tick(inner, now);
            return Ok(verdict);
        }
        let apply = |entry: &mut Entry, names: &mut Vec<Arc<str>>| {
            for (policy, step) in policies.iter().zip(steps) {
                if let Some(state) = step.new_state {
                    let name = policy.shared_name();
                    let position = entry.slot(name);
                    entry.write(names, position, name, state, step.expires_at_us);
                }
            }
            entry.refresh(now, hot);
        };
        match index.and_then(|index| self.table.get_bucket_mut(index)) {
            Some(entry) => {
                apply(entry, &mut self.names);
                let expires_at_us = entry.expires_at_us(hot);
                self.note_expiry(expires_at_us);
            }
            None => {
                let mut entry = Entry::new(key);
                apply(&mut entry, &mut self.names);
                self.insert(inner, hash, entry, now)?;
            }
        }
        self.tick(inner, now);
        Ok(verdict)
    }

    #[inline(never)]
    fn insert(
        &mut self,
        inner: &Inner,
        hash: u64,
        entry: Entry,
        now: u64,
    ) -> Result<(), StoreError> {
        if !inner.admit_new() {
            if self.min_expires_at_us <= now {
                let freed = self.purge(now);
                inner.forget(freed);
            }
            // Evicting in place keeps the count: one entry out, this one in.
            // Only from a shard that holds at least half its share of the
            // bound, so that a shard holding a few heavy subjects is not
            // where a flood evicts; other shards are left to `make_room`,
            // which evicts from the fullest.
            let share = inner.max_keys.unwrap_or(usize::MAX) / inner.shards.len() / 2;
            let room = inner.admit_new()
                || (inner.when_full == WhenFull::EvictNearestFull
                    && self.table.len() >= share.max(1)
                    && self.evict_one(now));
            if !room {
                return Err(StoreError::Full {
                    // `admit_new` refuses only when a cap is set.
                    max_keys: inner.max_keys.unwrap_or(usize::MAX),
                    // Filled in by `make_room`, which sees every shard.
                    retry_after: std::time::Duration::ZERO,
                });
            }
        }
        if self.table.len() == self.table.capacity() {
            // The insert would grow the table: sweep first. If that frees
            // little, grow now so the next full sweep is far away.
            let freed = self.purge(now);
            inner.forget(freed);
            let len = self.table.len();
            if len > 0 && len >= self.table.capacity() / 8 * 7 {
                self.table.reserve(len, inner.rehash());
                self.cursor = 0;
            }
        }
        // A new entry has no hot slot.
        self.note_expiry(entry.expires_at_us(0));
        let rehash = inner.rehash();
        self.table.insert_unique(hash, entry, &rehash);
        Ok(())
    }

    /// Removes the entry whose loss admits least among [`EVICT_SAMPLE`]
    /// entries from the shard's eviction cursor on: the first expired one,
    /// else the one soonest back to full capacity. Returns whether one was
    /// removed (not when the table is empty); the caller accounts for it.
    #[cold]
    #[inline(never)]
    fn evict_one(&mut self, now: u64) -> bool {
        let buckets = self.table.num_buckets();
        if self.table.is_empty() || buckets == 0 {
            return false;
        }
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let mut best: Option<(usize, u64)> = None;
        let mut seen = 0;
        let start = self.evict_cursor;
        for step in 0..buckets {
            let index = (start + step) % buckets;
            let Some(entry) = self.table.get_bucket(index) else {
                continue;
            };
            let expires_at_us = entry.expires_at_us(hot);
            if best.is_none_or(|(_, least)| expires_at_us < least) {
                best = Some((index, expires_at_us));
            }
            seen += 1;
            if expires_at_us <= now || seen >= EVICT_SAMPLE {
                self.evict_cursor = index + 1;
                break;
            }
        }
        let Some((index, _)) = best else {
            return false;
        };
        match self.table.get_bucket_entry(index) {
            Ok(entry) => {
                let (removed, _) = entry.remove();
                if removed.is_hot() {
                    self.hot_hash = None;
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Removes every expired entry; returns how many.
    fn purge(&mut self, now: u64) -> usize {
        let before = self.table.len();
        let mut min = u64::MAX;
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let mut hot_removed = false;
        self.table.retain(|entry| {
            let expires_at_us = entry.expires_at_us(hot);
            let live = expires_at_us > now;
            if live {
                min = min.min(expires_at_us);
            } else {
                hot_removed |= entry.is_hot();
            }
            live
        });
        if hot_removed {
            self.hot_hash = None;
        }
        self.min_expires_at_us = min;
        self.pass_min_us = min;
        before - self.table.len()
    }

    /// Records that an entry now expires at `at`.
    #[inline(always)]
    fn note_expiry(&mut self, at: u64) {
        self.min_expires_at_us = self.min_expires_at_us.min(at);
        self.pass_min_us = self.pass_min_us.min(at);
    }

    /// One incremental sweep step; returns how many entries it removed.
    #[inline(never)]
    fn sweep_some(&mut self, inner: &Inner, now: u64) -> usize {
        if self.min_expires_at_us > now {
            return 0;
        }
        let buckets = self.table.num_buckets();
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let mut removed = 0;
        for _ in 0..SWEEP_MAX_CHUNKS {
            let start = self.cursor.min(buckets);
            let end = (start + SWEEP_CHUNK).min(buckets);
            let mut chunk_removed = 0;
            for index in start..end {
                if let Ok(entry) = self.table.get_bucket_entry(index) {
                    let expires_at_us = entry.get().expires_at_us(hot);
                    if expires_at_us <= now {
                        let (removed_entry, _) = entry.remove();
                        if removed_entry.is_hot() {
                            self.hot_hash = None;
                        }
                        chunk_removed += 1;
                    } else {
                        self.pass_min_us = self.pass_min_us.min(expires_at_us);
                    }
                }
            }
            removed += chunk_removed;
            if end >= buckets {
                // A full pass: every entry was scanned or written since it
                // began, so the least expiry seen is exact enough to skip
                // sweeps until then.
                self.min_expires_at_us = self.pass_min_us;
                self.pass_min_us = u64::MAX;
                self.cursor = 0;
                let len = self.table.len();
                if buckets >= MIN_SHRINK_BUCKETS && len < buckets / 4 {
                    self.table.shrink_to(len * 2, inner.rehash());
                }
                break;
            }
            self.cursor = end;
            if chunk_removed * 4 < SWEEP_CHUNK {
                break;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;
    use std::time::Duration;

    const T0: u64 = 1_700_000_000_000_000;

    fn check(store: &MemoryStore, subject: &str, policies: &[Policy], cost: u64) -> Verdict {
        Store::check(store, subject, policies, cost)
            .into_inner()
            .expect("a valid check")
    }

    #[test]
    fn hashed_subjects_are_distinct_from_plain_ones_and_each_other() {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let policies = [Policy::per_minute(1).build().unwrap()];
        let long = "x".repeat(500);
        let other_long = "y".repeat(500);
        for subject in ["plain", "with space", "", &long, &other_long, "#plain"] {
            assert!(
                check(&store, subject, &policies, 1).is_allowed(),
                "{subject:?}"
            );
            assert!(
                !check(&store, subject, &policies, 1).is_allowed(),
                "{subject:?}"
            );
        }
        assert_eq!(store.len(), 6);
        assert!(matches!(Key::new(&long), Key::Hashed(_)));
        assert!(matches!(Key::new("a:b"), Key::Raw(b"a:b")));
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// The fast GCRA is the reference GCRA, including the fall-backs.
        #[test]
        fn fast_gcra_is_the_reference(
            limit in prop_oneof![1..10u64, 1..1_000_000u64],
            period in prop_oneof![1..10u64, 1..1_000_000u64, 1..4_000_000_000u64],
            extra_burst in prop_oneof![Just(0u64), 0..100u64],
            now in prop_oneof![0..1_000u64, T0..T0 + 1, u64::MAX - 1_000..=u64::MAX],
            tat_offset in prop_oneof![
                Just(None),
                (-5_000_000_000i64..5_000_000_000).prop_map(Some),
                (i64::MIN..i64::MAX).prop_map(Some),
            ],
            rem_seed: u64,
            rem_overflow in prop::bool::weighted(0.05),
            cost_seed: u64,
        ) {
            let Ok(policy) = Policy::per(limit, Duration::from_micros(period))
                .burst(limit.saturating_add(extra_burst))
                .build()
            else {
                return Ok(());
            };
            let tat = tat_offset.map(|offset| GcraState {
                tat_us: now.saturating_add_signed(offset),
                tat_rem: if rem_overflow { rem_seed % (limit * 3) } else { rem_seed % limit },
            });
            let cost = cost_seed % (policy.capacity() + 2);
            let state = tat.map(State::Gcra);
            let fast = check_policy(&policy, state.as_ref(), now, cost);
            let reference = algorithms::check(&policy, state.as_ref(), now, cost);
            prop_assert_eq!(fast, reference);
        }

        /// The hot path's division-free GCRA is the reference GCRA, for
        /// every state it can meet.
        #[test]
        fn tat_charge_is_the_reference(
            interval in prop_oneof![1..10u64, 1..1_000_000u64],
            limit in prop_oneof![1..10u64, 1..1_000u64],
            extra_burst in prop_oneof![Just(0u64), 0..100u64],
            now in prop_oneof![0..1_000u64, T0..T0 + 1, u64::MAX - 1_000..=u64::MAX],
            tat_offset in prop_oneof![
                -5_000_000_000i64..5_000_000_000,
                i64::MIN..i64::MAX,
            ],
            cost_seed: u64,
        ) {
            let Some(period) = interval.checked_mul(limit) else {
                return Ok(());
            };
            let Ok(policy) = Policy::per(limit, Duration::from_micros(period))
                .burst(limit.saturating_add(extra_burst))
                .build()
            else {
                return Ok(());
            };
            prop_assert_eq!(policy.whole_interval_micros(), Some(interval));
            let tat_us = now.saturating_add_signed(tat_offset);
            let cost = 1 + cost_seed % policy.capacity();
            let state = State::Gcra(GcraState { tat_us, tat_rem: 0 });
            let reference = algorithms::check(&policy, Some(&state), now, cost);
            match tat_charge(&policy, interval, tat_us, now, cost) {
                None => {}
                Some(TatCharge::Denied(decision)) => {
                    prop_assert_eq!(decision, reference.decision);
                    prop_assert_eq!(reference.new_state, None);
                }
                Some(TatCharge::Admitted(new_tat_us)) => {
                    let decision = tat_admitted(&policy, interval, new_tat_us, now);
                    prop_assert_eq!(decision, reference.decision);
                    let written = State::Gcra(GcraState { tat_us: new_tat_us, tat_rem: 0 });
                    prop_assert_eq!(reference.new_state, Some(written));
                    prop_assert_eq!(reference.expires_at_us, new_tat_us);
                }
            }
        }
    }

    #[test]
    fn an_entry_is_96_bytes() {
        // The module docs promise it; the table's footprint follows it.
        assert_eq!(std::mem::size_of::<Entry>(), 96);
        assert_eq!(MemoryStore::bytes_per_entry(), 97);
        // `bytes_per_entry` says a subject with several policies adds a
        // slot of 56 bytes per policy.
        assert_eq!(std::mem::size_of::<Slot>(), 56);
    }

    #[test]
    fn shard_count_is_a_power_of_two_within_bounds() {
        for (asked, got) in [(0, 1), (1, 1), (3, 4), (16, 16), (1 << 20, MAX_SHARDS)] {
            let store = MemoryStore::builder().shards(asked).build();
            assert_eq!(store.inner.shards.len(), got, "asked for {asked}");
        }
    }

    #[test]
    fn incremental_sweep_drains_and_shrinks_an_idle_table() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(1)
            .build();
        let policies = [Policy::per_second(1).build().unwrap()];
        for i in 0..10_000 {
            check(&store, &format!("k{i}"), &policies, 1);
        }
        let buckets_before = store.inner.shards[0].write().table.num_buckets();
        clock.advance(Duration::from_secs(1));
        // Peeks at one subject: nothing is written, but the shard sweeps.
        for _ in 0..buckets_before {
            check(&store, "other", &policies, 0);
        }
        assert_eq!(store.len(), 0);
        let shard = store.inner.shards[0].write();
        assert!(shard.table.num_buckets() < buckets_before / 4);
    }

    #[test]
    fn slots_of_unused_policies_are_dropped_once_expired() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let old = [Policy::per_second(5).name("old").build().unwrap()];
        let new = [Policy::per_minute(5).name("new").build().unwrap()];
        check(&store, "alice", &old, 1);
        check(&store, "alice", &new, 1);
        clock.advance(Duration::from_secs(2));
        check(&store, "alice", &new, 1);
        let key = Key::new("alice");
        let hash = store.inner.hash_key(key.as_bytes());
        let shard = store.inner.shard(hash).write();
        let entry = shard
            .table
            .get_bucket(shard.find(hash, b"alice").unwrap())
            .unwrap();
        assert_eq!(entry.slots.len(), 1);
        assert_eq!(&*entry.slots[0].policy, "new");
    }

    /// Every entry is found by its key in its own shard, and the store
    /// counts exactly the entries held.
    fn assert_consistent(store: &MemoryStore) {
        let mut total = 0;
        for (index, shard) in store.inner.shards.iter().enumerate() {
            let shard = shard.write();
            for entry in shard.table.iter() {
                let hash = store.inner.hash_key(&entry.key);
                assert_eq!(store.inner.shard_index(hash), index);
                let found = shard
                    .table
                    .get_bucket(shard.find(hash, &entry.key).unwrap());
                assert_eq!(found.unwrap().key, entry.key);
            }
            total += shard.table.len();
        }
        assert_eq!(store.len(), total);
    }

    #[test]
    fn the_table_follows_removals_sweeps_and_purges() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(2)
            .build();
        let short = [Policy::per_second(1).name("short").build().unwrap()];
        let long = [Policy::per_hour(1).name("long").build().unwrap()];
        let both = [short[0].clone(), long[0].clone()];
        for round in 0..4_u64 {
            for i in 0..3_000 {
                let policies = if i % 3 == 0 { &long } else { &short };
                check(&store, &format!("k{round}-{i}"), policies, 1);
            }
            // Resets remove entries from the middle.
            for i in (0..3_000).step_by(7) {
                futures::executor::block_on(store.reset(&format!("k{round}-{i}"), &both)).unwrap();
            }
            assert_consistent(&store);
            clock.advance(Duration::from_secs(1));
            // Peeks drive incremental sweeps, which remove as they walk.
            for i in 0..2_000 {
                check(&store, &format!("peek{}", i % 16), &short, 0);
            }
            assert_consistent(&store);
        }
        // Sweeps removed some of the expired subjects; a purge the rest.
        let before = store.len();
        let purged = store.purge_expired();
        assert_consistent(&store);
        // Only the hour-long subjects are left, each still limited.
        let live = 4 * (0..3_000).filter(|i| i % 3 == 0 && i % 7 != 0).count();
        assert_eq!(store.len(), live);
        assert_eq!(before - purged, live);
        assert!(before < 4 * 3_000 - 4 * 429, "no sweep removed anything");
        assert!(!check(&store, "k0-3", &long, 1).is_allowed());
        assert!(check(&store, "k0-7", &long, 1).is_allowed());
    }

    #[test]
    fn charges_of_one_hot_subject_sweep_every_shard() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(8)
            .build();
        let idle = [Policy::per_second(1).name("idle").build().unwrap()];
        for i in 0..4_000 {
            check(&store, &format!("idle{i}"), &idle, 1);
        }
        clock.advance(Duration::from_secs(1));
        // One subject, always the same shard, on the hot path (a whole
        // interval): 40 000 charges make 625 sweeps, taken in turn over the
        // 8 shards, each up to 16 chunks of 128 entries.
        let hot = [Policy::per_second(1_000_000).name("hot").build().unwrap()];
        assert_eq!(hot[0].whole_interval_micros(), Some(1));
        for _ in 0..40_000 {
            check(&store, "hot", &hot, 1);
            clock.advance(Duration::from_micros(1));
        }
        assert_eq!(store.len(), 1);
        assert_consistent(&store);
    }

    /// Makes `subject` its shard's hot slot, as contention would.
    fn make_hot(store: &MemoryStore, subject: &str, policy: &Policy, now: u64) -> bool {
        let key = Key::new(subject);
        let hash = store.inner.hash_key(key.as_bytes());
        let mut shard = store.inner.shard(hash).write();
        shard.promote(hash, key.as_bytes(), policy, now);
        shard.hot_hash == Some(hash)
    }

    #[test]
    fn the_hot_slot_holds_the_state_exactly_through_every_path() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(1)
            .build();
        // 10 per second: an interval of 100 ms, so a `Tat` state.
        let policies = [Policy::per_second(10).name("hot").build().unwrap()];
        let other = [Policy::per_minute(100).name("other").build().unwrap()];
        check(&store, "alice", &policies, 1);
        check(&store, "bob", &policies, 1);
        assert!(make_hot(&store, "alice", &policies[0], T0));
        // Another live subject cannot take the hot slot.
        assert!(!make_hot(&store, "bob", &policies[0], T0));
        // Hot-path charges: 9 more admitted (capacity 10), then denied.
        for _ in 0..9 {
            assert!(check(&store, "alice", &policies, 1).is_allowed());
        }
        assert!(!check(&store, "alice", &policies, 1).is_allowed());
        // They took the hot path: the slot is still hot.
        assert!(store.inner.shards[0].read().hot_hash.is_some());
        // A peek (general path) sees the hot state, then the slot is back
        // in its entry.
        let peek = check(&store, "alice", &policies, 0);
        assert_eq!(peek.decisions()[0].remaining(), 0);
        assert_eq!(
            peek.decisions()[0].retry_after(),
            Some(Duration::from_millis(100))
        );
        assert!(store.inner.shards[0].read().hot_hash.is_none());
        // Hot again; a second policy on the same subject joins it (general
        // path), and both are kept.
        assert!(make_hot(&store, "alice", &policies[0], T0));
        clock.advance(Duration::from_millis(100));
        let both = [policies[0].clone(), other[0].clone()];
        let verdict = check(&store, "alice", &both, 1);
        assert!(verdict.is_allowed());
        assert_eq!(verdict.decisions()[0].remaining(), 0);
        assert_eq!(verdict.decisions()[1].remaining(), 99);
        // Hot again after reset of the second policy; a reset of the first
        // forgets the subject.
        futures::executor::block_on(store.reset("alice", &other)).unwrap();
        clock.advance(Duration::from_millis(100));
        assert!(make_hot(&store, "alice", &policies[0], T0 + 200_000));
        futures::executor::block_on(store.reset("alice", &policies)).unwrap();
        assert!(store.inner.shards[0].read().hot_hash.is_none());
        assert_eq!(
            check(&store, "alice", &policies, 0).decisions()[0].remaining(),
            10
        );
        // A hot subject that goes idle is swept like any other, and frees
        // the hot slot.
        check(&store, "alice", &policies, 1);
        assert!(make_hot(&store, "alice", &policies[0], T0 + 200_000));
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.purge_expired(), 2);
        assert!(store.inner.shards[0].read().hot_hash.is_none());
        assert!(store.is_empty());
        // An expired hot subject gives the slot up to a busy one.
        check(&store, "alice", &policies, 1);
        check(&store, "bob", &policies, 1);
        let now = T0 + 2_200_000;
        assert!(make_hot(&store, "alice", &policies[0], now));
        clock.advance(Duration::from_secs(1));
        check(&store, "bob", &policies, 1);
        assert!(make_hot(&store, "bob", &policies[0], now + 1_000_000));
        assert_consistent(&store);
        // Alice's state went back to her entry, expired: she is full again.
        assert_eq!(
            check(&store, "alice", &policies, 0).decisions()[0].remaining(),
            10
        );
    }
}
