//! Reclaiming a shard's memory: the incremental sweep, purges and the
//! eviction of a full store's nearest-full subject (see "Expiry and
//! sweeping" in `ALGORITHMS.md`). Sweeping across shards when a store is
//! full is the store's (`make_room` in `store/mod.rs`).

use std::sync::atomic::Ordering;

use super::{Inner, Shard};

/// Operations on a shard between two incremental sweeps.
pub(in crate::memory) const SWEEP_EVERY: u32 = 64;
/// Buckets scanned per chunk of an incremental sweep.
const SWEEP_CHUNK: usize = 128;
/// Most chunks one incremental sweep scans.
const SWEEP_MAX_CHUNKS: usize = 16;
/// A table with fewer buckets is never shrunk.
const MIN_SHRINK_BUCKETS: usize = 256;
/// Entries an eviction compares (the one soonest back to full goes).
const EVICT_SAMPLE: usize = 16;

impl Shard {
    /// Counts an operation; every [`SWEEP_EVERY`] runs an incremental
    /// sweep.
    #[inline(always)]
    pub(in crate::memory) fn tick(&mut self, inner: &Inner, now: u64) {
        self.ops += 1;
        if self.ops >= SWEEP_EVERY {
            self.ops = 0;
            let freed = self.sweep_some(inner, now);
            inner.forget(freed);
        }
    }

    /// Removes the entry whose loss admits least among [`EVICT_SAMPLE`]
    /// entries from the shard's eviction cursor on: the first expired one,
    /// else the one soonest back to full capacity. Returns whether one was
    /// removed (not when the table is empty); the caller accounts for it.
    #[cold]
    #[inline(never)]
    pub(in crate::memory) fn evict_one(&mut self, now: u64) -> bool {
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
    pub(in crate::memory) fn purge(&mut self, now: u64) -> usize {
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
    pub(in crate::memory) fn note_expiry(&mut self, at: u64) {
        self.min_expires_at_us = self.min_expires_at_us.min(at);
        self.pass_min_us = self.pass_min_us.min(at);
    }

    /// One incremental sweep step; returns how many entries it removed.
    #[inline(never)]
    pub(in crate::memory) fn sweep_some(&mut self, inner: &Inner, now: u64) -> usize {
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
