//! The store's half of the GCRA hot path: a charge of a known subject
//! under its shard's read lock ([`MemoryStore::charge_known_gcra`]), and
//! what it leaves for the write lock (the hot slot, every so often a
//! sweep). The shard's half is `table/hot_path.rs`, the arithmetic
//! `tat.rs`.

use std::sync::atomic::Ordering;

use super::MemoryStore;
use crate::memory::table::sweep::SWEEP_EVERY;
use crate::memory::table::{Inner, ShardLock};
use crate::memory::tat::{tat_admitted, TatCharge};
use crate::{Algorithm, Decision, Policy};

impl MemoryStore {
    /// The hot path: a GCRA charge of a subject whose only state is a
    /// compact [`Body::Tat`] of this policy, made under the shard's read
    /// lock by compare-and-swap. `None` (having changed nothing) for
    /// everything else, which takes the general path.
    #[inline(always)]
    pub(in crate::memory) fn charge_known_gcra(
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
        let inner = &*self.inner;
        let lock = inner.shard(hash);
        let shard = lock.read();
        let (charged, promote) = shard.charge_known_gcra(hash, key, policy, now, cost)?;
        // Every `SWEEP_EVERY`-th fast-path charge of a shard sweeps a
        // shard, taking them in turn from this one (so that one busy
        // subject keeps every shard swept). The count is a load and a store
        // on the cache line the read lock has just written: no shared line
        // is added, and two threads may count one charge (a sweep then
        // comes a little later).
        let ops = shard.hot_ops.load(Ordering::Relaxed).wrapping_add(1);
        shard.hot_ops.store(ops, Ordering::Relaxed);
        drop(shard);
        let sweep = ops.is_multiple_of(SWEEP_EVERY);
        if promote || sweep {
            let turn = sweep.then_some((ops / SWEEP_EVERY) as usize);
            Self::after_charge(inner, lock, promote, turn, hash, key, policy, now);
        }
        // The figures of an admission are computed after the lock is let
        // go.
        Some(match charged {
            TatCharge::Denied(decision) => decision,
            TatCharge::Admitted(packed) => tat_admitted(policy, packed, now),
        })
    }

    /// What a fast-path charge leaves for the write lock: making its
    /// subject the hot slot, or the sweep of the shard `turn` shards on
    /// from its own.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn after_charge(
        inner: &Inner,
        lock: &ShardLock,
        promote: bool,
        turn: Option<usize>,
        hash: u64,
        key: &[u8],
        policy: &Policy,
        now: u64,
    ) {
        if promote {
            lock.write().promote(hash, key, policy, now);
        }
        if let Some(turn) = turn {
            let target = &inner.shards[(inner.shard_index(hash) + turn) & inner.shard_mask];
            // Looked at under the read lock first: a write lock would stop
            // the shard's other readers even when there is nothing to do.
            if target.read().min_expires_at_us <= now {
                let freed = target.write().sweep_some(inner, now);
                inner.forget(freed);
            }
        }
    }
}
