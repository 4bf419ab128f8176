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
            && let Body::Tat { name, tat } = &mut entry.body
        {
            *tat.get_mut() = packed;
            *name = name.with_hot(false);
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
        let Body::Tat { name, tat } = &mut entry.body else {
            return;
        };
        if name.is_hot() || !name.is(&self.names, policy) {
            return;
        }
        let packed = *tat.get_mut();
        *name = name.with_hot(true);
        self.hot_tat.store(packed, Ordering::Relaxed);
        self.hot_hash = Some(hash);
    }

    /// See [`MemoryStore::charge_known_gcra`](crate::MemoryStore). Under the read lock: the
    /// TAT is replaced by compare-and-swap, so charges of different
    /// subjects in one shard, and of one subject, proceed together. It
    /// never lowers the shard's least expiry (a charge only moves a TAT
    /// later).
    ///
    /// [`Charged::Contended`] says that the subject should become the
    /// shard's hot slot: its swap lost to another thread's.
    #[inline(always)]
    ///
    /// `is_key` tells the subject's entry (`entry.key.matches(key)`); each
    /// entry point of the store passes its own closure, so that each gets
    /// its own copy of the probe, which the compiler then inlines into it.
    pub(in crate::memory) fn charge_known_gcra(
        &self,
        hash: u64,
        is_key: impl Fn(&Entry) -> bool,
        policy: &Policy,
        now: u64,
        cost: u64,
    ) -> Option<Charged> {
        let entry = self.table.find(hash, is_key)?;
        let Body::Tat { name, tat } = &entry.body else {
            return None;
        };
        if !name.is(&self.names, policy) {
            return None;
        }
        let hot = name.is_hot();
        let cell = if hot { &self.hot_tat } else { tat };
        // The first attempt, straight: the retries after a lost swap are
        // out of line, so that this path keeps only what it reads in
        // registers.
        let packed = cell.load(Ordering::Acquire);
        let charged = tat_charge(policy, packed, now, cost)?;
        if let TatCharge::Admitted(new_packed) = charged {
            // The figures are computed by the caller, to keep the window
            // between load and swap short.
            if let Err(current) =
                cell.compare_exchange_weak(packed, new_packed, Ordering::AcqRel, Ordering::Acquire)
            {
                return Self::charge_again(
                    cell,
                    current,
                    current != packed,
                    hot,
                    policy,
                    now,
                    cost,
                );
            }
        }
        Some(Charged::Done(charged))
    }

    /// The retries of [`Shard::charge_known_gcra`] after its swap lost:
    /// each recomputes from the TAT that won. `contended` when another
    /// thread's swap won (a weak swap may also fail spuriously); `hot`
    /// when the subject holds the hot slot already.
    #[cold]
    #[inline(never)]
    fn charge_again(
        cell: &AtomicU64,
        mut packed: u64,
        mut contended: bool,
        hot: bool,
        policy: &Policy,
        now: u64,
        cost: u64,
    ) -> Option<Charged> {
        loop {
            let charged = tat_charge(policy, packed, now, cost)?;
            let TatCharge::Admitted(new_packed) = charged else {
                return Some(Charged::Done(charged));
            };
            match cell.compare_exchange_weak(
                packed,
                new_packed,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) if contended && !hot => return Some(Charged::Contended(new_packed)),
                Ok(_) => return Some(Charged::Done(charged)),
                Err(current) => {
                    contended |= current != packed;
                    packed = current;
                }
            }
        }
    }
}

/// What a fast-path charge did: two words, returned in registers.
#[derive(Clone, Copy)]
pub(in crate::memory) enum Charged {
    Done(TatCharge),
    /// Admitted (the new packed TAT) after losing a swap to another
    /// thread: the subject should become its shard's hot slot.
    Contended(u64),
}
