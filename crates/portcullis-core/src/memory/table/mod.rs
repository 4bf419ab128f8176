//! The table: the store's shared state ([`Inner`]: its shards, hasher,
//! clock and bound, [`WhenFull`]) and a shard ([`ShardLock`], [`Shard`]:
//! its hash table of entries, its hot slot, its sweep bookkeeping, its
//! interned names and its idempotency records).
//!
//! A shard's methods live here by concern, top-down: `general.rs` (the
//! general path: checks, post-charges and checks with options under the
//! write lock, inserting subjects), `hot_path.rs` (the GCRA charge of a
//! known subject under the read lock by compare-and-swap, and the hot
//! slot), `sweep.rs` (sweeps, purges, eviction). What an entry holds is in
//! `entry.rs`.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use super::entry::Entry;
use super::lease::Leases;
use super::names::Names;
use super::records::Records;
use super::reservations::Reservations;
use crate::clock::Counter;
use crate::Clock;

mod general;
mod hot_path;
pub(in crate::memory) use self::general::checked;
pub(in crate::memory) use self::hot_path::Charged;
mod reserve;
pub(in crate::memory) mod sweep;

/// What a [`MemoryStore`](crate::MemoryStore) at its bound ([`MemoryStoreBuilder::max_keys`](crate::MemoryStoreBuilder::max_keys))
/// does with a subject it does not hold, once no expired subject can be
/// swept away. Subjects already held are checked exactly either way.
///
/// ```
/// use portcullis::{MemoryStore, WhenFull};
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
    /// Refuse the new subject with [`StoreError::Full`](crate::StoreError::Full), whose
    /// `retry_after` is when the first held subject expires (the tower layer
    /// answers `429` with that `Retry-After`, never lets it through). No
    /// held subject is ever forgotten early, but while the store is full no
    /// new subject is admitted.
    Deny,
}

pub(in crate::memory) struct Inner {
    /// Each on its own cache line, so threads working on different shards
    /// do not slow each other down.
    pub(in crate::memory) shards: Box<[CachePadded<ShardLock>]>,
    /// `shards.len() - 1`; the length is a power of two.
    pub(in crate::memory) shard_mask: usize,
    pub(in crate::memory) hasher: foldhash::fast::RandomState,
    pub(in crate::memory) clock: StoreClock,
    pub(in crate::memory) max_keys: Option<usize>,
    pub(in crate::memory) when_full: WhenFull,
    /// Entries held over all shards (live or expired but not yet swept).
    pub(in crate::memory) len: AtomicUsize,
    /// Leases of concurrency policies (`lease.rs`).
    pub(in crate::memory) leases: Leases,
}

/// The clock, with the default [`FastClock`](crate::FastClock) dispatched statically (it is
/// read on every check).
#[derive(Debug, Clone)]
pub(in crate::memory) enum StoreClock {
    Fast(&'static Counter),
    Custom(Arc<dyn Clock>),
}

impl StoreClock {
    #[inline]
    pub(in crate::memory) fn now_micros(&self) -> u64 {
        match self {
            Self::Fast(counter) => counter.now_micros(),
            Self::Custom(clock) => clock.now_micros(),
        }
    }
}

impl Inner {
    #[inline]
    pub(in crate::memory) fn hash_key(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    pub(in crate::memory) fn shard(&self, hash: u64) -> &ShardLock {
        &self.shards[self.shard_index(hash)]
    }

    /// Bits 40.. pick the shard; hashbrown uses the low bits for the bucket
    /// and the top seven as a tag, so the two stay independent.
    #[inline]
    pub(in crate::memory) fn shard_index(&self, hash: u64) -> usize {
        (hash >> 40) as usize & self.shard_mask
    }

    /// The hasher hashbrown needs when it moves entries.
    pub(in crate::memory) fn rehash(&self) -> impl Fn(&Entry) -> u64 + '_ {
        |entry| self.hash_key(entry.key.as_slice())
    }

    /// Records that `removed` entries left the store.
    #[inline]
    pub(in crate::memory) fn forget(&self, removed: usize) {
        if removed > 0 {
            self.len.fetch_sub(removed, Ordering::Relaxed);
        }
    }

    /// Counts a new entry in, or refuses when the cap is reached.
    pub(in crate::memory) fn admit_new(&self) -> bool {
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

/// A shard's lock: [`std::sync::RwLock`], whose readers retry a lost
/// compare-and-swap at once (parking_lot's back off first, which measured
/// slower with two threads charging one subject). Poisoning is ignored:
/// nothing that runs under the lock panics, and a shard is consistent
/// between any two statements that could.
pub(in crate::memory) struct ShardLock(pub(in crate::memory) RwLock<Shard>);

impl ShardLock {
    #[inline]
    pub(in crate::memory) fn read(&self) -> RwLockReadGuard<'_, Shard> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
    pub(in crate::memory) fn write(&self) -> RwLockWriteGuard<'_, Shard> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

// `repr(C)`: `hot_tat` comes first, on the cache line of the lock word
// (the lock's few bytes precede the shard in its `RwLock`).
#[repr(C)]
pub(in crate::memory) struct Shard {
    /// The packed TAT of the shard's hot slot ([`Body::Tat`](super::entry::Body::Tat) of a hot policy), if it has
    /// one; charged under the read lock by compare-and-swap.
    pub(in crate::memory) hot_tat: AtomicU64,
    /// Fast-path charges of this shard (counted without a read-modify-write:
    /// two threads may count one), on the cache line the read lock writes
    /// anyway; every [`SWEEP_EVERY`](sweep::SWEEP_EVERY)-th sweeps a shard.
    pub(in crate::memory) hot_ops: AtomicU32,
    /// The hash of the subject that holds the hot slot.
    pub(in crate::memory) hot_hash: Option<u64>,
    pub(in crate::memory) table: HashTable<Entry>,
    /// Operations since the last incremental sweep.
    pub(in crate::memory) ops: u32,
    /// Next bucket the incremental sweep looks at.
    pub(in crate::memory) cursor: usize,
    /// Next bucket an eviction looks at.
    pub(in crate::memory) evict_cursor: usize,
    /// No entry expires before this (a lower bound, made exact by full
    /// sweeps and at the end of each incremental pass).
    pub(in crate::memory) min_expires_at_us: u64,
    /// The least expiry seen by the current incremental pass (entries it
    /// scanned and kept, and every write since it began).
    pub(in crate::memory) pass_min_us: u64,
    /// Policy names in use, shared by the slots: a new subject allocates
    /// its key, not its policies' names.
    pub(in crate::memory) names: Names,
    /// Idempotency records of the shard's subjects (`records.rs`).
    pub(in crate::memory) records: Records,
    /// Token reservations of the shard's subjects (`reservations.rs`).
    pub(in crate::memory) reservations: Reservations,
}

impl Shard {
    pub(in crate::memory) fn new() -> Self {
        Self {
            hot_tat: AtomicU64::new(0),
            hot_ops: AtomicU32::new(0),
            hot_hash: None,
            table: HashTable::new(),
            ops: 0,
            cursor: 0,
            evict_cursor: 0,
            min_expires_at_us: u64::MAX,
            pass_min_us: u64::MAX,
            names: Names::default(),
            records: Records::default(),
            reservations: Reservations::default(),
        }
    }

    /// The bucket of `key`'s entry.
    #[inline(always)]
    pub(in crate::memory) fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        self.table
            .find_bucket_index(hash, |entry| entry.key.matches(key))
    }
}
