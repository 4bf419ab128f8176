//! [`MemoryStoreBuilder`]: the clock, shard count and subject bound of a
//! [`MemoryStore`], and building its shards.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};

use crossbeam_utils::CachePadded;

use super::{MemoryStore, DEFAULT_MAX_KEYS};
use crate::clock::Counter;
use crate::memory::lease::Leases;
use crate::memory::table::{Inner, Shard, ShardLock, StoreClock, WhenFull};
use crate::Clock;

/// Most shards a store may have.
pub(in crate::memory) const MAX_SHARDS: usize = 4096;

/// Builder for a [`MemoryStore`]; finish with [`MemoryStoreBuilder::build`].
///
/// ```
/// use portcullis::{ManualClock, MemoryStore};
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
            // The first reading calibrates the counter (under a
            // millisecond): paid here rather than on the first check.
            clock: StoreClock::Fast(Counter::global()),
            shards: None,
            max_keys: Some(DEFAULT_MAX_KEYS),
            when_full: WhenFull::default(),
        }
    }
}

impl MemoryStoreBuilder {
    /// Reads time from `clock` instead of the [`FastClock`](crate::FastClock) (pass
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

    /// Caps the number of subjects held (default 262 144, 2^18: under
    /// about 25 MB at its worst, see [`MemoryStore::bytes_per_entry`]).
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
                leases: Leases::new(self.max_keys),
            }),
        }
    }
}
