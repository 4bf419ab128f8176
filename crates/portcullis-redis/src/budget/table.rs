//! The budgets of one store's subjects on this instance ([`Budget`]): a
//! sharded table of slots, each holding a subject's grant (permits
//! charged in Redis, spent here), a denial Redis gave, and its demand;
//! [`Budget::take`] says what a check does with it.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use portcullis_core::{Decision, Policy, Verdict};

use super::LocalBudget;

/// Shards of the table of subjects (a power of two).
const SHARDS: usize = 16;

/// What identifies a policy's GCRA: a local answer taken under other
/// numbers is never given (a plan changed under the same name).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Numbers {
    limit: u64,
    period_micros: u64,
    capacity: u64,
}

impl Numbers {
    fn of(policy: &Policy) -> Self {
        Self {
            limit: policy.limit(),
            period_micros: policy.period_micros(),
            capacity: policy.capacity(),
        }
    }
}

/// A subject's budget on this instance. Times are µs of [`ClockMode::budget_time`](crate::clock::ClockMode::budget_time).
struct Slot {
    /// The numbers of the policy the grant and the denial were taken
    /// under.
    numbers: Numbers,
    /// Changes whenever the local answers are dropped (a reset, other
    /// numbers): a grant call sent before answers into nothing.
    generation: u64,
    /// Granted permits not yet admitted.
    permits: u64,
    /// When the grant's permits may no longer be spent: one grant period
    /// after the grant call was sent, so no earlier than one period after
    /// Redis charged them.
    expires: u64,
    /// `remaining` as this instance sees it.
    remaining: u64,
    reset_after: Duration,
    /// The demand (permits) of the current and the last grant period.
    period_start: u64,
    demand: u64,
    last_demand: u64,
    /// A grant call is in flight (checks meanwhile go to Redis, exact).
    granting: bool,
    /// Redis denied a cost of `denied_cost`, with a retry-after ending no
    /// later than one grant period after the call was sent, at
    /// `denied_until`: until then costs at least that large are denied
    /// here. Redis would deny them too unless the state moved back (a
    /// reset elsewhere), which the grant period bounds.
    denied_until: u64,
    denied_cost: u64,
    denied_reset: u64,
}

impl Slot {
    /// Drops the grant and the denial, and takes `generation`, so that a
    /// grant call in flight answers into nothing. The demand stays: it is
    /// the subject's traffic, whatever the policy.
    fn drop_answers(&mut self, generation: u64) {
        self.generation = generation;
        self.permits = 0;
        self.granting = false;
        self.denied_until = 0;
        self.denied_cost = 0;
        self.denied_reset = 0;
    }

    /// Counts `cost` in the demand of the grant period that holds `now`.
    fn count(&mut self, cost: u64, now: u64, grant: u64) {
        let since = now.saturating_sub(self.period_start);
        if since >= grant {
            self.last_demand = if since < grant.saturating_mul(2) {
                self.demand
            } else {
                0
            };
            self.demand = 0;
            self.period_start = now;
        }
        self.demand = self.demand.saturating_add(cost);
    }

    /// The answer from this instance alone, if it has one: a denial Redis
    /// gave that still holds, or permits of a live grant (counted in the
    /// demand, and spent, when it answers).
    fn answer(&mut self, policy: &Policy, cost: u64, now: u64, grant: u64) -> Option<Verdict> {
        if self.numbers != Numbers::of(policy) {
            return None;
        }
        let decision = if now < self.denied_until && cost >= self.denied_cost {
            Decision::denied(
                policy.capacity(),
                0,
                Duration::from_micros(self.denied_until - now),
                Duration::from_micros(self.denied_reset.saturating_sub(now)),
            )
        } else if self.permits >= cost && now < self.expires {
            self.permits -= cost;
            self.remaining = self.remaining.saturating_sub(cost);
            Decision::allowed(policy.capacity(), self.remaining, self.reset_after)
        } else {
            return None;
        };
        self.count(cost, now, grant);
        Some(std::iter::once(decision).collect())
    }
}

/// What a check does with the budget.
pub(crate) enum Take {
    /// Admitted from the grant.
    Local(Verdict),
    /// Take a grant (this check's cost first).
    Grant(Ask),
    /// Check in Redis as always.
    Exact,
}

/// A grant to ask Redis for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    /// At most this many permits.
    pub(super) permits: u64,
    /// The slot's generation when it was asked: its answer is kept only
    /// if the slot still has it.
    generation: u64,
}

/// One shard: its subjects, and how many new subjects may still be
/// turned away before a full shard is swept again (so a shard full of
/// busy subjects is not scanned for every new one).
#[derive(Default)]
struct Shard {
    slots: HashMap<Box<str>, Slot>,
    sweep_after: usize,
}

/// The budgets of the subjects of one store.
pub(crate) struct Budget {
    config: LocalBudget,
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
    /// The last generation given to a slot.
    generations: AtomicU64,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl Budget {
    pub(crate) fn new(config: LocalBudget) -> Self {
        Self {
            config,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            generations: AtomicU64::new(0),
        }
    }

    pub(crate) fn takes(&self, policy: &Policy) -> bool {
        self.config.takes(policy)
    }

    /// A generation no slot had before.
    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(key) as usize) & (SHARDS - 1);
        // Every change under the lock leaves the table consistent.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// What the check of `cost` of the subject whose state is `key` does
    /// at `now` (µs of [`ClockMode::budget_time`](crate::clock::ClockMode::budget_time)).
    pub(crate) fn take(&self, key: &str, policy: &Policy, cost: u64, now: u64) -> Take {
        let grant = u64::try_from(self.config.grant_period.as_micros()).unwrap_or(u64::MAX);
        let limit_per_shard = self.config.max_subjects.div_ceil(SHARDS);
        let mut shard = self.shard(key);
        let shard = &mut *shard;
        if !shard.slots.contains_key(key) {
            if shard.slots.len() >= limit_per_shard {
                if shard.sweep_after > 0 {
                    shard.sweep_after -= 1;
                    return Take::Exact;
                }
                // Forget subjects idle for two grant periods.
                shard.slots.retain(|_, slot| {
                    slot.granting || now.saturating_sub(slot.period_start) < grant.saturating_mul(2)
                });
                if shard.slots.len() >= limit_per_shard {
                    // Still full: the next eighth of a shard's worth of new
                    // subjects are checked exactly without a sweep, so a
                    // sweep costs O(1) per new subject, amortized.
                    shard.sweep_after = limit_per_shard.div_ceil(8);
                    return Take::Exact;
                }
            }
            let generation = self.next_generation();
            shard.slots.insert(
                key.into(),
                Slot {
                    numbers: Numbers::of(policy),
                    generation,
                    permits: 0,
                    expires: now,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    period_start: now,
                    demand: 0,
                    last_demand: 0,
                    granting: false,
                    denied_until: 0,
                    denied_cost: 0,
                    denied_reset: 0,
                },
            );
        }
        let Some(slot) = shard.slots.get_mut(key) else {
            return Take::Exact;
        };
        if slot.numbers != Numbers::of(policy) {
            // A plan changed under the same name: what was taken under the
            // old numbers is dropped (a grant call in flight included).
            slot.drop_answers(self.next_generation());
            slot.numbers = Numbers::of(policy);
        }
        if let Some(verdict) = slot.answer(policy, cost, now, grant) {
            return Take::Local(verdict);
        }
        slot.count(cost, now, grant);
        // Leftovers too few for this cost, or past the grant: dropped.
        slot.permits = 0;
        let want = slot
            .last_demand
            .min(self.config.max_permits)
            .min(policy.capacity())
            .min(self.config.grant_worth(policy));
        if want <= cost || slot.granting {
            return Take::Exact;
        }
        slot.granting = true;
        Take::Grant(Ask {
            permits: want,
            generation: slot.generation,
        })
    }

    /// `reset()` of the subject whose state is `key` has answered: this
    /// instance's grants and denials for it are dropped, and a grant call
    /// in flight (sent before the reset, so maybe charged or denied by the
    /// state it removed) answers into nothing.
    pub(crate) fn forget(&self, key: &str) {
        if let Some(slot) = self.shard(key).slots.get_mut(key) {
            slot.drop_answers(self.next_generation());
        }
    }

    /// The answer of this instance alone for a check of `cost` of `key` at
    /// `now`, when it has one (see `Slot::answer`); `None` changes nothing.
    pub(crate) fn local(&self, key: &str, policy: &Policy, cost: u64, now: u64) -> Option<Verdict> {
        let grant = u64::try_from(self.config.grant_period.as_micros()).unwrap_or(u64::MAX);
        self.shard(key)
            .slots
            .get_mut(key)?
            .answer(policy, cost, now, grant)
    }

    /// A grant call for `key` asked as `ask`, sent at `sent` (µs of
    /// [`ClockMode::budget_time`](crate::clock::ClockMode::budget_time)), ended: `granted` permits were charged (this check's
    /// `cost` among them) at `decision` (None: it failed).
    pub(super) fn grant_ended(
        &self,
        key: &str,
        ask: Ask,
        cost: u64,
        granted: u64,
        sent: u64,
        decision: Option<&Decision>,
    ) {
        let mut shard = self.shard(key);
        let Some(slot) = shard
            .slots
            .get_mut(key)
            .filter(|slot| slot.generation == ask.generation)
        else {
            // Reset, or the numbers changed, since it was sent.
            return;
        };
        slot.granting = false;
        let grant = u64::try_from(self.config.grant_period.as_micros()).unwrap_or(u64::MAX);
        if let Some(retry) = decision.and_then(Decision::retry_after) {
            // Measured from when the call was sent, which is no later than
            // when Redis decided: the local denial ends no later than
            // Redis' would, and no later than one grant period after the
            // call (a reset elsewhere is obeyed by then).
            let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            slot.denied_until = sent.saturating_add(micros(retry).min(grant));
            slot.denied_cost = cost;
            slot.denied_reset =
                decision.map_or(sent, |d| sent.saturating_add(micros(d.reset_after())));
            return;
        }
        if let Some(decision) = decision.filter(|d| d.is_allowed() && granted >= cost) {
            slot.permits = granted - cost;
            slot.expires = sent.saturating_add(grant);
            slot.remaining = decision.remaining();
            slot.reset_after = decision.reset_after();
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
