//! The budgets of one store's subjects on this instance ([`Budget`]): a
//! sharded table of slots, each holding a subject's rate share (emission
//! slots charged in Redis, dispensed here on the GCRA schedule), what it
//! says of Redis' state (how long a denial holds), and its demand;
//! [`Budget::take`] says what a check does with it.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;
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

    /// The emission interval in µs (whole: the budget takes only such
    /// policies) and the capacity in µs (`capacity × interval`).
    fn interval_and_cap(self) -> (u64, u64) {
        let interval = (self.period_micros / self.limit.max(1)).max(1);
        (interval, self.capacity.saturating_mul(interval))
    }
}

/// What Redis answered a grant call: the rate share this instance holds.
#[derive(Clone, Copy)]
pub(crate) struct Share {
    /// Emission slots charged in Redis for this instance, in order.
    pub(crate) slots: u64,
    /// The state's lead over Redis' now before the call, in µs.
    pub(crate) lead: u64,
}

/// A subject's budget on this instance. Times are µs of [`ClockMode::budget_time`](crate::clock::ClockMode::budget_time).
struct Slot {
    /// The numbers of the policy the share was taken under.
    numbers: Numbers,
    /// Changes whenever the local answers are dropped (a reset, other
    /// numbers): a grant call sent before answers into nothing.
    generation: u64,
    /// The last share Redis granted: slot `j` (from 1) of it is due (its
    /// GCRA time has come) at `received + max(0, lead + j × interval -
    /// cap)`, and the first `used` are spent (admitted, or dropped when the
    /// next grant was asked). Redis' state after the call lay at least
    /// `lead + slots × interval` ahead of its now, which came after `sent`:
    /// so a cost `c` beyond the share cannot be admitted by Redis before
    /// `sent + lead + (slots + c) × interval - cap`.
    share: Share,
    used: u64,
    /// When the grant call was sent, and when its answer came.
    sent: u64,
    received: u64,
    /// No local answer at or after this: one grant period after the grant
    /// call was sent (a reset elsewhere is obeyed by then).
    expires: u64,
    /// The last share found the subject at its limit (slots not due at
    /// once, or none): checks while the next grant call is in flight are
    /// denied here rather than each sent to Redis.
    at_limit: bool,
    /// The demand (permits) of the current and the last grant period.
    period_start: u64,
    demand: u64,
    last_demand: u64,
    /// A grant call is in flight.
    granting: bool,
}

impl Slot {
    fn new(numbers: Numbers, generation: u64, now: u64) -> Self {
        Self {
            numbers,
            generation,
            share: Share { slots: 0, lead: 0 },
            used: 0,
            sent: now,
            received: now,
            expires: now,
            at_limit: false,
            period_start: now,
            demand: 0,
            last_demand: 0,
            granting: false,
        }
    }

    /// Drops the share and what it said, and takes `generation`, so that a
    /// grant call in flight answers into nothing. The demand stays: it is
    /// the subject's traffic, whatever the policy.
    fn drop_answers(&mut self, generation: u64) {
        self.generation = generation;
        self.share = Share { slots: 0, lead: 0 };
        self.used = 0;
        self.expires = 0;
        self.granting = false;
        self.at_limit = false;
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

    /// The answer from this instance alone, if it has one (counted in the
    /// demand, and spent, when it answers): the share's next slots when
    /// due; a denial until they are due, or until Redis could admit the
    /// cost beyond the share; a denial while a grant call is in flight
    /// after the last share found the subject at its limit.
    fn answer(&mut self, policy: &Policy, cost: u64, now: u64, grant: u64) -> Option<Verdict> {
        if self.numbers != Numbers::of(policy) {
            return None;
        }
        let (interval, cap) = self.numbers.interval_and_cap();
        let lead_of = |slots: u64| {
            self.share
                .lead
                .saturating_add(slots.saturating_mul(interval))
        };
        // Redis' state after the share, as far as this instance knows.
        let state_until = self.sent.saturating_add(lead_of(self.share.slots));
        let reset_after = Duration::from_micros(state_until.saturating_sub(now));
        let denied = |until: u64| {
            Decision::denied(
                policy.capacity(),
                0,
                Duration::from_micros(until.saturating_sub(now).max(1)),
                reset_after,
            )
        };
        let need = self.used.saturating_add(cost);
        let decision = if now < self.expires {
            let (due, own) = if need <= self.share.slots {
                (
                    self.received
                        .saturating_add(lead_of(need).saturating_sub(cap)),
                    true,
                )
            } else {
                let beyond = self.share.slots.saturating_add(cost);
                (
                    self.sent
                        .saturating_add(lead_of(beyond).saturating_sub(cap)),
                    false,
                )
            };
            if now < due {
                // Nothing this instance knows of can be admitted before
                // `due` (held no longer than the share lives).
                Some(denied(due.min(self.expires)))
            } else if own {
                self.used = need;
                // What Redis held when the share was taken, less what this
                // instance admitted since.
                let remaining =
                    (cap.saturating_sub(self.share.lead) / interval).saturating_sub(self.used);
                Some(Decision::allowed(policy.capacity(), remaining, reset_after))
            } else {
                None
            }
        } else {
            None
        };
        let decision = match decision {
            Some(decision) => decision,
            None if self.granting && self.at_limit => denied(now.saturating_add(interval)),
            None => return None,
        };
        self.count(cost, now, grant);
        Some(std::iter::once(decision).collect())
    }
}

/// What a check does with the budget.
pub(crate) enum Take {
    /// Answered from the share: admitted from its due slots, or denied
    /// while nothing this instance knows of can be admitted.
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

/// One shard: its subjects, how many new subjects may still be turned
/// away before a full shard is swept again (so a shard full of busy
/// subjects is not scanned for every new one), and when it was last swept.
#[derive(Default)]
struct Shard {
    slots: HashTable<Keyed>,
    sweep_after: usize,
    /// µs of [`ClockMode::budget_time`](crate::clock::ClockMode::budget_time).
    swept_at: u64,
}

/// A subject's slot under its key (the bytes of its Redis key).
struct Keyed {
    key: Box<[u8]>,
    slot: Slot,
}

impl Shard {
    /// The slot of `key`, whose hash is `hash`.
    fn get_mut(&mut self, hash: u64, key: &[u8]) -> Option<&mut Slot> {
        self.slots
            .find_mut(hash, |keyed| &*keyed.key == key)
            .map(|keyed| &mut keyed.slot)
    }
}

/// The budgets of the subjects of one store.
pub(crate) struct Budget {
    config: LocalBudget,
    shards: Box<[Mutex<Shard>]>,
    /// One hash of a key picks its shard and finds it there: foldhash,
    /// seeded per store as the coalescer's and the memory store's tables
    /// (keys carry client-chosen subjects).
    hasher: foldhash::fast::RandomState,
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
            hasher: foldhash::fast::RandomState::default(),
            generations: AtomicU64::new(0),
        }
    }

    pub(crate) fn takes(&self, policy: &Policy) -> bool {
        self.config.takes(policy)
    }

    /// The grant period: how long a share lives, and how far ahead of now
    /// its slots reach.
    pub(crate) fn period(&self) -> Duration {
        self.config.grant_period
    }

    /// A generation no slot had before.
    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// `key`'s hash and its shard, locked.
    fn shard(&self, key: &[u8]) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one(key);
        // Bits the shard's table does not index by (its low bits) nor tag
        // with (its top seven), so that a shard's keys spread over all of
        // its buckets.
        let index = ((hash >> 32) as usize) & (SHARDS - 1);
        // Every change under the lock leaves the table consistent.
        let shard = self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (hash, shard)
    }

    /// What the check of `cost` of the subject whose state is `key` does
    /// at `now` (µs of [`ClockMode::budget_time`](crate::clock::ClockMode::budget_time)).
    pub(crate) fn take(&self, key: &[u8], policy: &Policy, cost: u64, now: u64) -> Take {
        let grant = u64::try_from(self.config.grant_period.as_micros()).unwrap_or(u64::MAX);
        let limit_per_shard = self.config.max_subjects.div_ceil(SHARDS);
        let (hash, mut shard) = self.shard(key);
        let shard = &mut *shard;
        // One probe finds a known subject's slot; a new one is inserted
        // where that probe ended (after a sweep, when one is due).
        let slot = match shard.slots.find_entry(hash, |keyed| &*keyed.key == key) {
            Ok(found) => &mut found.into_mut().slot,
            Err(absent) => {
                let slots = absent.into_table();
                // Subjects idle for two grant periods are forgotten when a
                // new one finds the shard full, and otherwise at most once
                // per two grant periods: the table then holds about the
                // subjects of the last two periods, where a large
                // population's quiet subjects (each seen once) would fill it
                // to its bound.
                let idle = grant.saturating_mul(2);
                let full = slots.len() >= limit_per_shard;
                let due = now.saturating_sub(shard.swept_at) >= idle;
                if full && !due && shard.sweep_after > 0 {
                    shard.sweep_after -= 1;
                    return Take::Exact;
                }
                if full || due {
                    slots.retain(|keyed| {
                        keyed.slot.granting || now.saturating_sub(keyed.slot.period_start) < idle
                    });
                    shard.swept_at = now;
                    if slots.len() >= limit_per_shard {
                        // Still full: the next eighth of a shard's worth of
                        // new subjects are checked exactly without a sweep,
                        // so a sweep costs O(1) per new subject, amortized.
                        shard.sweep_after = limit_per_shard.div_ceil(8);
                        return Take::Exact;
                    }
                }
                let generation = self.next_generation();
                let inserted = slots.insert_unique(
                    hash,
                    Keyed {
                        key: key.into(),
                        slot: Slot::new(Numbers::of(policy), generation, now),
                    },
                    |keyed| self.hasher.hash_one(&*keyed.key),
                );
                &mut inserted.into_mut().slot
            }
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
        let want = slot
            .last_demand
            .min(self.config.max_permits)
            .min(self.config.grant_worth(policy));
        if want <= cost || slot.granting {
            return Take::Exact;
        }
        // Slots of the share too few for this cost, or past its life:
        // dropped (one share at a time per instance: the bound).
        slot.used = slot.share.slots;
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
    pub(crate) fn forget(&self, key: &[u8]) {
        let (hash, mut shard) = self.shard(key);
        if let Some(slot) = shard.get_mut(hash, key) {
            slot.drop_answers(self.next_generation());
        }
    }

    /// The answer of this instance alone for a check of `cost` of `key` at
    /// `now`, when it has one (see `Slot::answer`); `None` changes nothing.
    pub(crate) fn local(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u64,
        now: u64,
    ) -> Option<Verdict> {
        let grant = u64::try_from(self.config.grant_period.as_micros()).unwrap_or(u64::MAX);
        let (hash, mut shard) = self.shard(key);
        shard.get_mut(hash, key)?.answer(policy, cost, now, grant)
    }

    /// A grant call for `key` asked as `ask`, sent at `sent` and answered
    /// at `received` (µs of [`ClockMode::budget_time`](crate::clock::ClockMode::budget_time)),
    /// ended: Redis charged `share` (None: it failed, or was answered
    /// otherwise), of which the asking check of `cost` took its first
    /// `cost` slots when `admitted`.
    pub(super) fn grant_ended(
        &self,
        key: &[u8],
        ask: Ask,
        cost: u64,
        share: Option<Share>,
        admitted: bool,
        (sent, received): (u64, u64),
    ) {
        let (hash, mut shard) = self.shard(key);
        let Some(slot) = shard
            .get_mut(hash, key)
            .filter(|slot| slot.generation == ask.generation)
        else {
            // Reset, or the numbers changed, since it was sent.
            return;
        };
        slot.granting = false;
        let Some(share) = share else {
            return;
        };
        let grant = u64::try_from(self.config.grant_period.as_micros()).unwrap_or(u64::MAX);
        let (interval, cap) = slot.numbers.interval_and_cap();
        slot.share = share;
        slot.used = if admitted { cost.min(share.slots) } else { 0 };
        slot.sent = sent;
        slot.received = received.max(sent);
        slot.expires = sent.saturating_add(grant);
        slot.at_limit = share
            .lead
            .saturating_add(share.slots.max(1).saturating_mul(interval))
            > cap;
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
