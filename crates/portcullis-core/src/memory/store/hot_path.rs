//! The store's half of the GCRA hot path: a charge of a known subject
//! under its shard's read lock ([`MemoryStore::charge_known_gcra`]), and
//! what it leaves for the write lock (the hot slot, every so often a
//! sweep). The shard's half is `table/hot_path.rs`, the arithmetic
//! `tat.rs`.

use std::sync::atomic::Ordering;

use super::MemoryStore;
use crate::memory::entry::Entry;
use crate::memory::table::sweep::SWEEP_EVERY;
use crate::memory::table::{Charged, Inner, ShardLock};
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
        let inner = &*self.inner;
        let lock = inner.shard(hash);
        let shard = lock.read();
        let charged = shard.charge_known_gcra(hash, is_key, policy, now, cost)?;
        // A denial wrote nothing and grows nothing: it counts towards no
        // sweep (about 13 instructions of every denied check; memory grows
        // only by inserts, which sweep before a table grows).
        if let Charged::Done(denied @ TatCharge::Denied(_)) = charged {
            return Some(denied);
        }
        // Every `SWEEP_EVERY`-th admitting fast-path charge of a shard
        // sweeps a shard, taking them in turn from this one (so that one
        // busy subject keeps every shard swept, and a burst of subjects
        // that stopped is forgotten by the traffic that goes on). The
        // count is a load and a store on the cache line the read lock has
        // just written: no shared line is added, and two threads may count
        // one charge (a sweep then comes a little later).
        let ops = shard.hot_ops.load(Ordering::Relaxed).wrapping_add(1);
        shard.hot_ops.store(ops, Ordering::Relaxed);
        drop(shard);
        let (charged, promote) = match charged {
            Charged::Done(charged) => (charged, false),
            Charged::Contended(packed) => (TatCharge::Admitted(packed), true),
        };
        let sweep = ops.is_multiple_of(SWEEP_EVERY);
        if promote || sweep {
            let turn = sweep.then_some((ops / SWEEP_EVERY) as usize);
            Self::after_charge(inner, lock, promote, turn, hash, key, policy, now);
        }
        Some(charged)
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
