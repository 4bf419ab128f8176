//! The shard's half of the GCRA hot path: the charge of a known subject
//! under the read lock by compare-and-swap ([`Shard::charge_known_gcra`]),
//! and the hot slot a contended subject moves to ([`Shard::promote`],
//! [`Shard::demote`]). The arithmetic is in `tat.rs`; the store's half
//! (taking the lock, sweeping every so often) in `store/hot_path.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Shard;
use crate::memory::entry::{Body, Entry};
use crate::memory::tat::{packed_expiry, tat_charge, TatCharge};
use crate::Policy;

impl Shard {
    /// Moves the hot slot back into its entry when `hash` is the hot
    /// subject's, so that the general path finds all of that subject's
    /// state in its entry.
    #[inline(always)]
    pub(in crate::memory) fn demote_if_hot(&mut self, hash: u64) {
        if self.hot_hash == Some(hash) {
            self.demote();
        }
    }

    /// Moves the hot slot, if any, back into its entry.
    #[cold]
    #[inline(never)]
    pub(in crate::memory) fn demote(&mut self) {
        let Some(hash) = self.hot_hash.take() else {
            return;
        };
        let packed = self.hot_tat.load(Ordering::Relaxed);
        if let Some(entry) = self.table.find_mut(hash, Entry::is_hot)
            && let Body::Hot { name } = entry.body
        {
            entry.body = Body::Tat {
                name,
                tat: AtomicU64::new(packed),
            };
        }
    }

    /// Makes `key`'s entry the shard's hot slot, after fast-path charges of
    /// it met one another; unless another live subject holds it (no
    /// ping-pong between two busy subjects of one shard).
    #[cold]
    #[inline(never)]
    pub(in crate::memory) fn promote(&mut self, hash: u64, key: &[u8], policy: &Policy, now: u64) {
        if self.hot_hash.is_some() {
            if packed_expiry(self.hot_tat.load(Ordering::Relaxed)) > now {
                return;
            }
            self.demote();
        }
        let Some(entry) = self.table.find_mut(hash, |e| e.key.matches(key)) else {
            return;
        };
        let Body::Tat { name, tat } = &entry.body else {
            return;
        };
        if !name.is(&self.names, policy) {
            return;
        }
        let packed = tat.load(Ordering::Relaxed);
        entry.body = Body::Hot { name: *name };
        self.hot_tat.store(packed, Ordering::Relaxed);
        self.hot_hash = Some(hash);
    }

    /// See [`MemoryStore::charge_known_gcra`](crate::MemoryStore). Under the read lock: the
    /// TAT is replaced by compare-and-swap, so charges of different
    /// subjects in one shard, and of one subject, proceed together. It
    /// never lowers the shard's least expiry (a charge only moves a TAT
    /// later).
    ///
    /// Also says whether the subject should become the shard's hot slot:
    /// when its swap lost to another thread's.
    #[inline(always)]
    pub(in crate::memory) fn charge_known_gcra(
        &self,
        hash: u64,
        key: &[u8],
        policy: &Policy,
        now: u64,
        cost: u64,
    ) -> Option<(TatCharge, bool)> {
        let entry = self.table.find(hash, |entry| entry.key.matches(key))?;
        let (name, cell, hot) = match &entry.body {
            Body::Tat { name, tat } => (*name, tat, false),
            Body::Hot { name } => (*name, &self.hot_tat, true),
            Body::Slots(_) => return None,
        };
        if !name.is(&self.names, policy) {
            return None;
        }
        let mut contended = false;
        let mut packed = cell.load(Ordering::Acquire);
        loop {
            match tat_charge(policy, packed, now, cost)? {
                denied @ TatCharge::Denied(_) => return Some((denied, false)),
                TatCharge::Admitted(new_packed) => {
                    match cell.compare_exchange_weak(
                        packed,
                        new_packed,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        // The figures are computed by the caller, to keep
                        // the window between load and swap short.
                        Ok(_) => return Some((TatCharge::Admitted(new_packed), contended && !hot)),
                        Err(current) => {
                            contended |= current != packed;
                            packed = current;
                        }
                    }
                }
            }
        }
    }
}
