//! The general path: a check of any policies ([`Shard::check_one`],
//! [`Shard::check_many`]), a post-charge ([`Shard::charge_many`]) and a
//! check with options ([`Shard::check_with`]: idempotency records and
//! priority classes), each in one critical section under the shard's write
//! lock, and the writes and inserts they share.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::{Inner, Shard, WhenFull};
use crate::algorithms::check_fast;
use crate::algorithms::classes::check_class;
use crate::algorithms::{self, Step};
use crate::memory::entry::{Entry, Live};
use crate::memory::names::Names;
use crate::memory::records::Rec;
use crate::{CheckPlan, Checked, Decision, Policy, StoreError, Verdict};

/// [`check_fast`] of a state as [`Entry::live`] read it: a state it
/// rescaled to `policy`'s units is written back on a charge whatever the
/// verdict, as a repair is (ALGORITHMS.md, "Changing a policy").
#[inline(always)]
pub(in crate::memory) fn checked(
    policy: &Policy,
    live: Option<Live<'_>>,
    now: u64,
    cost: u64,
) -> Step {
    match live {
        None => check_fast(policy, None, now, cost),
        Some((state, false)) => check_fast(policy, Some(&state), now, cost),
        Some((state, true)) => {
            let mut step = check_fast(policy, Some(&state), now, cost);
            if cost > 0 && step.new_state.is_none() {
                step.new_state = Some(state.into_owned());
            }
            step
        }
    }
}

impl Shard {
    /// The common case, one policy: no intermediate list of steps, and the
    /// state is written in place.
    #[inline(always)]
    pub(in crate::memory) fn check_one(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policy: &Policy,
        now: u64,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        // The time again, under the lock: no state written before is then
        // later than it (with a clock that never goes back), so a state
        // ahead of it beyond the clock tolerance is a policy change or a
        // clock set back, which the algorithm clamps, never a check that
        // read the clock before another's and locked after it.
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let Some(entry) = index.and_then(|index| self.table.get_bucket_mut(index)) else {
            let step = check_fast(policy, None, now, cost);
            if let (true, Some(state)) = (cost > 0, step.new_state) {
                let entry = Entry::new(&mut self.names, key, policy, state, step.expires_at_us);
                self.insert(inner, hash, entry, now)?;
            }
            self.tick(inner, now);
            return Ok(step.decision);
        };
        let live = entry.live(&self.names, policy, now, hot);
        let step = checked(policy, live, now, cost);
        if let (true, Some(state)) = (cost > 0, step.new_state) {
            entry.write(&mut self.names, policy, state, step.expires_at_us, hot);
            entry.refresh(&self.names, now);
            let expires_at_us = entry.expires_at_us(hot);
            self.note_expiry(expires_at_us);
        }
        self.tick(inner, now);
        Ok(step.decision)
    }

    /// Several policies: every one is computed first, and the new states
    /// are written only if all admit.
    #[inline(never)]
    pub(in crate::memory) fn check_many(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policies: &[Policy],
        now: u64,
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        // The time again, under the lock (see `check_one`).
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let mut steps: SmallVec<[Step; 2]> = policies
            .iter()
            .map(|policy| {
                let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
                checked(policy, live, now, cost)
            })
            .collect();
        if cost > 0 && steps.iter().any(|step| !step.decision.is_allowed()) {
            // Nothing is charged, so the policies that would have admitted
            // report their state as it stays: as a peek does (which writes
            // only a repair).
            for (policy, step) in policies.iter().zip(steps.iter_mut()) {
                if step.decision.is_allowed() {
                    let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
                    // A peek; a rescaled state is still written back, as
                    // a repair.
                    let repair = live
                        .as_ref()
                        .filter(|(_, rescaled)| *rescaled)
                        .map(|(state, _)| state.clone().into_owned());
                    *step = checked(policy, live, now, 0);
                    if step.new_state.is_none() {
                        step.new_state = repair;
                    }
                }
            }
        }
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        // New states of an admission, and repairs (ALGORITHMS.md, "Changing
        // a policy") whatever the verdict; a peek writes nothing.
        let write = cost > 0 && steps.iter().any(|step| step.new_state.is_some());
        if !write {
            self.tick(inner, now);
            return Ok(verdict);
        }
        self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        self.tick(inner, now);
        Ok(verdict)
    }

    /// Writes the new states of `steps` (each policy with its step) to the
    /// subject's entry at `index`, or to a new entry when there is none,
    /// and notes when it expires. Shared by checks and post-charges.
    pub(in crate::memory) fn write_steps<'p>(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        index: Option<usize>,
        steps: impl Iterator<Item = (&'p Policy, Step)>,
        now: u64,
    ) -> Result<(), StoreError> {
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let apply = |entry: &mut Entry, names: &mut Names| {
            for (policy, step) in steps {
                if let Some(state) = step.new_state {
                    entry.write(names, policy, state, step.expires_at_us, hot);
                }
            }
            entry.refresh(names, now);
        };
        match index.and_then(|index| self.table.get_bucket_mut(index)) {
            Some(entry) => {
                apply(entry, &mut self.names);
                let expires_at_us = entry.expires_at_us(hot);
                self.note_expiry(expires_at_us);
            }
            None => {
                let mut entry = Entry::empty(key);
                apply(&mut entry, &mut self.names);
                self.insert(inner, hash, entry, now)?;
            }
        }
        Ok(())
    }

    #[inline(never)]
    pub(in crate::memory) fn insert(
        &mut self,
        inner: &Inner,
        hash: u64,
        entry: Entry,
        now: u64,
    ) -> Result<(), StoreError> {
        if !inner.admit_new() {
            if self.min_expires_at_us <= now {
                let freed = self.purge(now);
                inner.forget(freed);
            }
            // Evicting in place keeps the count: one entry out, this one in.
            // Only from a shard that holds at least half its share of the
            // bound, so that a shard holding a few heavy subjects is not
            // where a flood evicts; other shards are left to `make_room`,
            // which evicts from the fullest.
            let share = inner.max_keys.unwrap_or(usize::MAX) / inner.shards.len() / 2;
            let room = inner.admit_new()
                || (inner.when_full == WhenFull::EvictNearestFull
                    && self.table.len() >= share.max(1)
                    && self.evict_one(now));
            if !room {
                return Err(StoreError::Full {
                    // `admit_new` refuses only when a cap is set.
                    max_keys: inner.max_keys.unwrap_or(usize::MAX),
                    // Filled in by `make_room`, which sees every shard.
                    retry_after: std::time::Duration::ZERO,
                });
            }
        }
        if self.table.len() == self.table.capacity() {
            // The insert would grow the table: sweep first. If that frees
            // little, grow now so the next full sweep is far away.
            let freed = self.purge(now);
            inner.forget(freed);
            let len = self.table.len();
            if len > 0 && len >= self.table.capacity() / 8 * 7 {
                self.table.reserve(len, inner.rehash());
                self.cursor = 0;
            }
        }
        // A new entry has no hot slot.
        self.note_expiry(entry.expires_at_us(0));
        let rehash = inner.rehash();
        self.table.insert_unique(hash, entry, &rehash);
        Ok(())
    }

    /// Charges every policy (a charge is never denied), writes what
    /// changed, and answers the states after the charge as peeks.
    pub(in crate::memory) fn charge_many(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policies: &[Policy],
        now: u64,
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        // The time again, under the lock (as `check_many`).
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let steps: SmallVec<[Step; 2]> = policies
            .iter()
            .map(|policy| {
                let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
                let (state, rescaled) = match &live {
                    Some((state, rescaled)) => (Some(&**state), *rescaled),
                    None => (None, false),
                };
                // `validate_charge` refused the algorithms without a
                // charge; were one to come through, it is only peeked.
                let mut step = algorithms::charge(policy, state, now, cost)
                    .unwrap_or_else(|| algorithms::check(policy, state, now, 0));
                // A state read through a changed plan is written back in
                // the new units even by a charge of 0 (which changes
                // nothing else), as charge.lua does: read again later, the
                // old units would drain at the old rate.
                if rescaled && step.new_state.is_none() {
                    step.new_state = state.cloned();
                }
                step
            })
            .collect();
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        if !steps.iter().any(|step| step.new_state.is_some()) {
            self.tick(inner, now);
            return Ok(verdict);
        }
        self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        self.tick(inner, now);
        Ok(verdict)
    }

    /// The check with a plan: the record first (a live one answers at
    /// once), then every policy with its class reserve, written only if
    /// all admit, then the record.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::memory) fn check_with(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policies: &[Policy],
        now: u64,
        cost: u64,
        plan: &CheckPlan,
        record: Option<([u8; 32], u64, u32)>,
    ) -> Result<Checked, StoreError> {
        // The time again, under the lock (as `check_many`).
        let now = now.max(inner.clock.now_micros());
        if let Some((id, _, _)) = &record
            && let Some(verdict) = self.records.replay(key, id, now)
        {
            return Ok(Checked::new(verdict, true));
        }
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(std::sync::atomic::Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let state_of =
            |policy: &Policy| entry.and_then(|entry| entry.live_state(names, policy, now, hot));
        let mut steps: SmallVec<[Step; 2]> = policies
            .iter()
            .zip(plan.reserves())
            .map(|(policy, reserve)| {
                let state = state_of(policy);
                check_class(policy, state.as_deref(), now, cost, *reserve, check_fast)
            })
            .collect();
        if cost > 0 && steps.iter().any(|step| !step.decision.is_allowed()) {
            // Nothing is charged: the policies that would have admitted
            // report their state as a peek of their class does.
            for ((policy, reserve), step) in
                policies.iter().zip(plan.reserves()).zip(steps.iter_mut())
            {
                if step.decision.is_allowed() {
                    let state = state_of(policy);
                    *step = check_class(policy, state.as_deref(), now, 0, *reserve, check_fast);
                }
            }
        }
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        let write = cost > 0 && steps.iter().any(|step| step.new_state.is_some());
        if write {
            self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        }
        self.tick(inner, now);
        // Admissions only: a denial is never replayed, so a retry after its
        // `retry_after` is checked afresh.
        if let Some((id, window_us, free_replays)) = record
            && verdict.is_allowed()
            && free_replays > 0
        {
            let rec = Rec {
                id,
                expires_at_us: now.saturating_add(window_us),
                replays_left: free_replays,
                verdict: verdict.clone(),
            };
            self.records
                .insert(inner.max_keys, inner.shards.len(), key, rec, now);
        }
        Ok(Checked::new(verdict, false))
    }
}
