//! The GCRA fast path: the charge of a known subject under the shard's
//! read lock by compare-and-swap, the division-free arithmetic it uses,
//! the `u64` GCRA of the general path, and the shard's hot slot (see
//! "The GCRA hot path" in the module docs).

use super::*;

impl MemoryStore {
    /// The hot path: a GCRA charge of a subject whose only state is a
    /// [`SlotState::Tat`] of this policy, made under the shard's read lock
    /// by compare-and-swap. `None` (having changed nothing) for everything
    /// else, which takes the general path.
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

thread_local! {
    /// Hot-path charges on this thread: every [`SWEEP_EVERY`]-th sweeps.
    static HOT_OPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts a hot-path charge. Every [`SWEEP_EVERY`]-th on this thread, the
/// number of sweeps this thread made before, which picks the shard to
/// sweep. One counter, so the common case is a load, an add, a store and
/// a test.
#[inline(always)]
pub(super) fn hot_tick() -> Option<usize> {
    HOT_OPS.with(|cell| {
        let ops = cell.get().wrapping_add(1);
        cell.set(ops);
        (ops % u64::from(SWEEP_EVERY) == 0).then(|| (ops / u64::from(SWEEP_EVERY) - 1) as usize)
    })
}

/// What a GCRA charge does to a [`SlotState::Tat`].
pub(super) enum TatCharge {
    /// Admitted: the new TAT.
    Admitted(u64),
    Denied(Decision),
}

/// A GCRA charge of `cost > 0` on the TAT `tat_us` of a policy whose
/// emission interval is `interval` whole microseconds: [`gcra_fast`] with
/// `L` cancelled out of every span, so admitting takes no division and
/// denying one (for the whole costs left). `None`
/// where an intermediate would overflow (the caller takes the general path).
#[inline(always)]
pub(super) fn tat_charge(
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
        // Denials write nothing. Their figures are those of the reference
        // with `L` cancelled out as well (every span is a multiple of it):
        // the wait until the span fits, the whole costs left below the
        // capacity, and the time until the TAT is reached.
        let remaining = full.saturating_sub(ahead) / interval;
        let decision = Decision::denied_us(policy.capacity(), remaining, span - full, ahead);
        return Some(TatCharge::Denied(decision));
    }
    Some(TatCharge::Admitted(now_us.checked_add(span)?))
}

/// The decision of an admitting [`tat_charge`] that moved the TAT to
/// `new_tat_us`.
#[inline(always)]
pub(super) fn tat_admitted(
    policy: &Policy,
    interval: u64,
    new_tat_us: u64,
    now_us: u64,
) -> Decision {
    let capacity = policy.capacity();
    // `tat_charge` checked `span <= capacity · interval` without overflow.
    let span = new_tat_us - now_us;
    let remaining = (capacity * interval - span) / interval;
    Decision::allowed_us(capacity, remaining, span)
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
    pub(super) fn promote(&mut self, hash: u64, key: &[u8], policy: &Policy, now: u64) {
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

    /// See [`MemoryStore::charge_known_gcra`]. Under the read lock: the
    /// TAT is replaced by compare-and-swap, so charges of different
    /// subjects in one shard, and of one subject, proceed together. It
    /// neither counts towards a sweep nor lowers the shard's least expiry
    /// (a charge only moves a TAT later), so it writes nothing else.
    ///
    /// Also says whether the subject should become the shard's hot slot:
    /// when its swap lost to another thread's.
    #[inline(always)]
    pub(super) fn charge_known_gcra(
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
}
