//! Token reservations on a shard ([`Shard::reserve`], [`Shard::settle`],
//! [`Shard::renew`]),
//! each in one critical section under the shard's write lock: the
//! reservation record (`memory/reservations.rs`), the places in flight and
//! every policy of the budget decided and written together.
//!
//! The order of a reserve (the Redis script follows it): a live record of
//! the id answers a replay; then the places in flight; then room for the
//! record; then every policy (token policies at the estimate, request
//! policies at 1), written only if all admit.

use std::sync::atomic::Ordering;
use std::time::Duration;

use smallvec::SmallVec;

use super::general::checked;
use super::{Inner, Shard};
use crate::algorithms::{self, Step};
use crate::memory::reservations::{list_key, Held, NoRoom, MAX_PER_SUBJECT};
use crate::{
    Policy, Refusal, Reserved, SettleOutcome, Settlement, StoreError, TokenBudget, Verdict,
};

type Steps = SmallVec<[Step; 4]>;

impl Shard {
    /// Reserves `estimate` (validated) as reservation `id`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::memory) fn reserve(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        budget: &TokenBudget,
        estimate: u64,
        id: u128,
        now: u64,
    ) -> Result<Reserved, StoreError> {
        // The time again, under the lock (as `check_many`).
        let now = now.max(inner.clock.now_micros());
        let list = list_key(key, budget.name());
        let policies = budget.policies();
        let tokens = budget.token_policies().len();
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let step = |policy: &Policy, cost: u64| {
            let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
            checked(policy, live, now, cost)
        };
        let peeks = || -> Verdict { policies.iter().map(|p| step(p, 0).decision).collect() };
        let limited = budget.max_in_flight().is_some();
        let (open, first) = if limited {
            self.reservations.open(&list, now)
        } else {
            (0, None)
        };
        let until =
            |first: Option<u64>| first.map(|at| Duration::from_micros(at.saturating_sub(now)));
        if self.reservations.get(&list, id, now).is_some() {
            return Ok(Reserved::admitted(peeks(), open, true));
        }
        if let Some(max) = budget.max_in_flight()
            && open >= max
        {
            let refusal = Refusal::InFlight { max };
            return Ok(Reserved::refused(peeks(), refusal, open, until(first)));
        }
        match self
            .reservations
            .make_room(inner.max_keys, inner.shards.len(), &list, now)
        {
            Ok(()) => {}
            Err(NoRoom::Subject) => {
                let (_, first) = self.reservations.open(&list, now);
                let refusal = Refusal::InFlight {
                    max: MAX_PER_SUBJECT as u64,
                };
                return Ok(Reserved::refused(peeks(), refusal, open, until(first)));
            }
            Err(NoRoom::Shard(first)) => {
                return Err(StoreError::Full {
                    max_keys: inner.max_keys.unwrap_or(usize::MAX),
                    retry_after: Duration::from_micros(first.saturating_sub(now)),
                });
            }
        }
        let mut steps: Steps = policies
            .iter()
            .enumerate()
            .map(|(i, policy)| step(policy, if i < tokens { estimate } else { 1 }))
            .collect();
        if steps.iter().any(|s| !s.decision.is_allowed()) {
            // Nothing is charged: the policies that would have admitted
            // report peeks, and repairs and rescaled states are written
            // whatever the verdict, as `check_many` does (and the scripts).
            for (policy, s) in policies.iter().zip(steps.iter_mut()) {
                if s.decision.is_allowed() {
                    let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
                    let repair = live
                        .as_ref()
                        .filter(|(_, rescaled)| *rescaled)
                        .map(|(state, _)| state.clone().into_owned());
                    *s = checked(policy, live, now, 0);
                    if s.new_state.is_none() {
                        s.new_state = repair;
                    }
                }
            }
            let verdict: Verdict = steps.iter().map(|s| s.decision).collect();
            if steps.iter().any(|s| s.new_state.is_some()) {
                self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
            }
            self.tick(inner, now);
            return Ok(Reserved::refused_by_policy(verdict, open));
        }
        let verdict: Verdict = steps.iter().map(|s| s.decision).collect();
        self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        let expires_at_us = now.saturating_add(budget.reservation_ttl_micros());
        self.reservations
            .insert(&list, id, Held::Open { estimate }, expires_at_us);
        self.tick(inner, now);
        let in_flight = if limited { open + 1 } else { 0 };
        Ok(Reserved::admitted(verdict, in_flight, false))
    }

    /// Settles reservation `id` with `used` tokens.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::memory) fn settle(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        budget: &TokenBudget,
        id: u128,
        used: u64,
        now: u64,
    ) -> Result<Settlement, StoreError> {
        let now = now.max(inner.clock.now_micros());
        let list = list_key(key, budget.name());
        let policies = budget.token_policies();
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let peeks = || -> Verdict {
            policies
                .iter()
                .map(|p| {
                    let live = entry.and_then(|entry| entry.live(names, p, now, hot));
                    checked(p, live, now, 0).decision
                })
                .collect()
        };
        let estimate = match self.reservations.get(&list, id, now) {
            None => {
                let verdict = peeks();
                return Ok(Settlement::new(SettleOutcome::Unknown, 0, used, 0, verdict));
            }
            Some(Held::Settled {
                estimate,
                used,
                overage,
            }) => {
                let verdict = peeks();
                return Ok(Settlement::new(
                    SettleOutcome::Replayed,
                    estimate,
                    used,
                    overage,
                    verdict,
                ));
            }
            Some(Held::Open { estimate }) => estimate,
        };
        let overage = used.saturating_sub(estimate).min(budget.max_overage());
        let steps: Steps = policies
            .iter()
            .map(|policy| {
                let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
                let (state, rescaled) = match &live {
                    Some((state, rescaled)) => (Some(&**state), *rescaled),
                    None => (None, false),
                };
                let step = if used < estimate {
                    algorithms::refund(policy, state, now, estimate - used)
                } else {
                    algorithms::charge(policy, state, now, overage)
                };
                // `validate_reserve` refused other algorithms; were one to
                // come through, it is only peeked.
                let mut step = step.unwrap_or_else(|| algorithms::check(policy, state, now, 0));
                // A charge writes a state read through a changed plan in
                // the new units even when it charges nothing, as the
                // script's does (a refund of nothing writes nothing, as
                // there).
                if used >= estimate && rescaled && step.new_state.is_none() {
                    step.new_state = state.cloned();
                }
                step
            })
            .collect();
        let verdict: Verdict = steps.iter().map(|s| s.decision).collect();
        if steps.iter().any(|s| s.new_state.is_some()) {
            self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        }
        let held = Held::Settled {
            estimate,
            used,
            overage,
        };
        let expires_at_us = now.saturating_add(budget.reservation_ttl_micros());
        self.reservations.replace(&list, id, held, expires_at_us);
        self.tick(inner, now);
        Ok(Settlement::new(
            SettleOutcome::Settled,
            estimate,
            used,
            overage,
            verdict,
        ))
    }

    /// Keeps open reservation `id` for the budget's TTL from now; whether
    /// it was open.
    pub(in crate::memory) fn renew(
        &mut self,
        inner: &Inner,
        key: &[u8],
        budget: &TokenBudget,
        id: u128,
        now: u64,
    ) -> bool {
        let now = now.max(inner.clock.now_micros());
        let list = list_key(key, budget.name());
        let Some(Held::Open { estimate }) = self.reservations.get(&list, id, now) else {
            return false;
        };
        let expires_at_us = now.saturating_add(budget.reservation_ttl_micros());
        self.reservations
            .replace(&list, id, Held::Open { estimate }, expires_at_us)
    }
}
