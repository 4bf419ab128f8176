//! The store's half of the GCRA hot path: a charge of a known subject
//! under its shard's read lock ([`MemoryStore::charge_known_gcra`]), and
//! what it leaves for the write lock (the hot slot). The shard's half is
//! `table/hot_path.rs`, the arithmetic `tat.rs`.

use super::MemoryStore;
use crate::memory::entry::Entry;
use crate::memory::table::{Charged, ShardLock};
use crate::memory::tat::{tat_admitted, tat_denied, TatCharge};
use crate::{Decision, Policy};

impl MemoryStore {
    /// The hot path: a GCRA charge of a subject whose only state is a
    /// compact [`Body::Tat`](crate::memory::entry::Body::Tat) of this
    /// policy, made under the shard's read lock by compare-and-swap, with
    /// the decision's figures. `None` (having changed nothing) for
    /// everything else, which takes the general path.
    ///
    /// The caller has checked that `policy` is GCRA and `1 <= cost <=
    /// capacity`
    /// ([`GcraConsts::charge_capacity`](crate::policy::GcraConsts)).
    #[inline(always)]
    pub(in crate::memory) fn charge_known_gcra(
        &self,
        key: &[u8],
        is_key: impl Fn(&Entry) -> bool,
        hash: u64,
        now: u64,
        policy: &Policy,
        cost: u64,
    ) -> Option<Decision> {
        // The figures are computed after the lock is let go (and not at
        // all by a caller that inlines this and never reads them).
        Some(
            match self.charge_known_gcra_tat(key, is_key, hash, now, policy, cost)? {
                TatCharge::Admitted(packed) => tat_admitted(policy, packed, now),
                TatCharge::Denied(packed) => tat_denied(policy, packed, now, cost),
            },
        )
    }

    /// [`MemoryStore::charge_known_gcra`] without the figures: what the
    /// charge did to the packed TAT. `is_key` tells `key`'s entry (see
    /// [`Shard::charge_known_gcra`](crate::memory::table::Shard)).
    #[inline(always)]
    pub(in crate::memory) fn charge_known_gcra_tat(
        &self,
        key: &[u8],
        is_key: impl Fn(&Entry) -> bool,
        hash: u64,
        now: u64,
        policy: &Policy,
        cost: u64,
    ) -> Option<TatCharge> {
        let lock = self.inner.shard(hash);
        let shard = lock.read();
        let charged = shard.charge_known_gcra(hash, is_key, policy, now, cost)?;
        drop(shard);
        // No sweep is scheduled here: a charge of a held subject never
        // grows memory, so the shard's sweeps are counted where it grows
        // (the general path's inserts and writes, `Shard::tick`).
        Some(match charged {
            Charged::Done(charged) => charged,
            Charged::Contended(packed) => {
                Self::promote(lock, hash, key, policy, now);
                TatCharge::Admitted(packed)
            }
        })
    }

    /// Makes a subject whose fast-path charges met one another its shard's
    /// hot slot (under the write lock).
    #[cold]
    #[inline(never)]
    fn promote(lock: &ShardLock, hash: u64, key: &[u8], policy: &Policy, now: u64) {
        lock.write().promote(hash, key, policy, now);
    }
}
