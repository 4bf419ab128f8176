//! The GCRA fast path: the charge of a known subject under the shard's
//! read lock by compare-and-swap, the division-free arithmetic it uses
//! on a packed TAT (whole or fractional emission intervals),
//! the `u64` GCRA of the general path, and the shard's hot slot (see
//! "The GCRA hot path" in the module docs).

use std::sync::atomic::{AtomicU64, Ordering};

use super::entry::{pack, packed_expiry, unpack, Body, Entry};
use super::table::{Shard, ShardLock};
use super::{Inner, MemoryStore, SWEEP_EVERY};
use crate::algorithms::{self, GcraState, State, Step};
use crate::{Algorithm, Decision, Policy};

impl MemoryStore {
    /// The hot path: a GCRA charge of a subject whose only state is a
    /// compact [`Body::Tat`] of this policy, made under the shard's read
    /// lock by compare-and-swap. `None` (having changed nothing) for
    /// everything else, which takes the general path.
    #[inline(always)]
    pub(super) fn charge_known_gcra(
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

/// [`algorithms::check`], with GCRA (the default algorithm) on a fast path.
#[inline(always)]
pub(super) fn check_policy(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Step {
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
pub(super) struct GcraFast {
    pub(super) decision: Decision,
    /// The new TAT when admitted with a cost.
    pub(super) tat: Option<GcraState>,
    pub(super) expires_at_us: u64,
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
pub(super) fn gcra_fast(
    policy: &Policy,
    tat: Option<GcraState>,
    now_us: u64,
    cost: u64,
) -> Option<GcraFast> {
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

/// What a GCRA charge does to a packed TAT.
pub(super) enum TatCharge {
    /// Admitted: the new packed TAT.
    Admitted(u64),
    Denied(Decision),
}

/// A GCRA charge of `cost > 0` on the packed TAT `packed` (`ALGORITHMS.md`,
/// "MemoryStore's GCRA fast path"): [`gcra_fast`] with every span kept as
/// whole microseconds and a remainder in units of `1 / scale` µs, using
/// the policy's precomputed [`GcraConsts`](crate::policy::GcraConsts), so
/// that admitting divides by nothing (unless a cost above 1 carries a
/// fraction) and denying divides once (for the whole costs left). `None`
/// where the reference must decide (a fraction not below the scale, a TAT
/// it would clamp, a TAT the packing cannot hold).
#[inline(always)]
pub(super) fn tat_charge(
    policy: &Policy,
    packed: u64,
    now_us: u64,
    cost: u64,
) -> Option<TatCharge> {
    let g = policy.gcra_consts();
    let (scale, period) = policy.emission_interval();
    let (tat_us, tat_rem) = unpack(packed);
    if tat_rem >= scale {
        return None;
    }
    // A TAT in the past is the same as no state (so an expired entry needs
    // no telling apart): `tat_us + tat_rem / scale >= now` exactly when
    // `tat_us >= now`.
    let (ahead, ahead_rem) = if tat_us >= now_us {
        (tat_us - now_us, tat_rem)
    } else {
        (0, 0)
    };
    // Further ahead than the policy can leave, beyond the clock tolerance:
    // the reference clamps it and writes the repair.
    if ahead.saturating_sub(g.full_ceil_us) > g.tolerance_us {
        return None;
    }
    // The span after the charge, `span_old + cost · increment`, as whole
    // microseconds and a remainder below the scale. Every term is below
    // 2^54 (the capacity times the increment is at most 2^52).
    let mut new_rem = ahead_rem + cost * g.interval_rem;
    let mut new_ahead = ahead + cost * g.interval_us;
    if new_rem >= scale {
        if cost == 1 {
            new_rem -= scale;
            new_ahead += 1;
        } else {
            new_ahead += new_rem / scale;
            new_rem %= scale;
        }
    }
    if new_ahead > g.full_us || (new_ahead == g.full_us && new_rem > g.full_rem) {
        // Denials write nothing. Their figures are the reference's: the
        // wait until the span fits (`span_new − full`, rounded up to a
        // microsecond), the whole costs left below the capacity, and the
        // time until the TAT is reached (rounded up).
        let (over_us, over_rem) = if new_rem >= g.full_rem {
            (new_ahead - g.full_us, new_rem - g.full_rem)
        } else {
            // `new_ahead > full_us` here.
            (new_ahead - g.full_us - 1, new_rem + scale - g.full_rem)
        };
        let retry_after = over_us + u64::from(over_rem > 0);
        let remaining = g.full.saturating_sub(ahead * scale + ahead_rem) / period;
        let reset_after = ahead + u64::from(ahead_rem > 0);
        let decision = Decision::denied_us(policy.capacity(), remaining, retry_after, reset_after);
        return Some(TatCharge::Denied(decision));
    }
    Some(TatCharge::Admitted(pack(
        now_us.checked_add(new_ahead)?,
        new_rem,
    )?))
}

/// The decision of an admitting [`tat_charge`] that moved the TAT to
/// `packed`.
#[inline(always)]
pub(super) fn tat_admitted(policy: &Policy, packed: u64, now_us: u64) -> Decision {
    let (scale, period) = policy.emission_interval();
    let full = policy.gcra_consts().full;
    let (tat_us, tat_rem) = unpack(packed);
    // `tat_charge` checked `span <= full` (at most 2^52) with `tat_us >= now`.
    let ahead = tat_us - now_us;
    let span = ahead * scale + tat_rem;
    let remaining = (full - span) / period;
    Decision::allowed_us(policy.capacity(), remaining, ahead + u64::from(tat_rem > 0))
}

impl Shard {
    /// Moves the hot slot back into its entry when `hash` is the hot
    /// subject's, so that the general path finds all of that subject's
    /// state in its entry.
    #[inline(always)]
    pub(super) fn demote_if_hot(&mut self, hash: u64) {
        if self.hot_hash == Some(hash) {
            self.demote();
        }
    }

    /// Moves the hot slot, if any, back into its entry.
    #[cold]
    #[inline(never)]
    pub(super) fn demote(&mut self) {
        let Some(hash) = self.hot_hash.take() else {
            return;
        };
        let packed = self.hot_tat.load(Ordering::Relaxed);
        if let Some(entry) = self.table.find_mut(hash, Entry::is_hot) {
            if let Body::Hot { name } = entry.body {
                entry.body = Body::Tat {
                    name,
                    tat: AtomicU64::new(packed),
                };
            }
        }
    }

    /// Makes `key`'s entry the shard's hot slot, after fast-path charges of
    /// it met one another; unless another live subject holds it (no
    /// ping-pong between two busy subjects of one shard).
    #[cold]
    #[inline(never)]
    pub(super) fn promote(&mut self, hash: u64, key: &[u8], policy: &Policy, now: u64) {
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

    /// See [`MemoryStore::charge_known_gcra`]. Under the read lock: the
    /// TAT is replaced by compare-and-swap, so charges of different
    /// subjects in one shard, and of one subject, proceed together. It
    /// never lowers the shard's least expiry (a charge only moves a TAT
    /// later).
    ///
    /// Also says whether the subject should become the shard's hot slot:
    /// when its swap lost to another thread's.
    #[inline(always)]
    pub(super) fn charge_known_gcra(
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
