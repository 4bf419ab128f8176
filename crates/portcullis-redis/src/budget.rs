//! The local budget ([`LocalBudget`], opt-in): for a busy subject, an
//! instance takes a slice of its allowance from Redis in one call (a lease
//! of up to `max_permits` permits, charged in Redis at once) and admits
//! from it locally until the slice is spent or the lease ends; what is
//! left when the lease ends is dropped, never given back. The size of the
//! next lease follows the subject's demand on this instance over the last
//! lease period, so a quiet subject (at most one check per period) is
//! never leased: each of its checks goes to Redis and is exact.
//!
//! Every permit admitted was charged in Redis before, at most one lease
//! period earlier; that gives the bound the docs state
//! ([`LocalBudget::overshoot_bound`]). A subject's state in Redis can move
//! back (a `reset()`, a policy changed under the same name), so no local
//! answer outlives one lease period, each is tied to the policy's numbers,
//! and `reset()` drops this instance's answers for the subject at once.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use portcullis_core::{Decision, Policy, StoreError, Verdict};
use redis::Value;

use crate::store::{self, ClockMode, Inner};

/// Shards of the table of subjects (a power of two).
const SHARDS: usize = 16;

/// A local budget: busy subjects are admitted from leases of permits
/// taken from Redis, so a hot subject costs Redis a fraction of a call per
/// request, at the price of a stated overshoot. Give it to
/// [`RedisStoreBuilder::local_budget`](crate::RedisStoreBuilder::local_budget).
///
/// It applies to checks of one GCRA policy whose emission interval is a
/// whole number of microseconds (the Redis fast path; `per_second(1000)`,
/// `per_minute(600)`), with a cost of at least 1, on the Redis Functions
/// path; other checks are exact as always. [`LocalBudget::policies`]
/// limits it to policies by name.
///
/// **The bound.** Every permit an instance admits locally was charged in
/// Redis when it was leased, at most one lease period earlier, and at
/// most `min(max_permits, ⌈limit × lease / period⌉)` leased permits (one
/// lease period's worth of the rate) wait unspent on one instance at a
/// time. So over any interval, the subject is admitted at most
/// `min(instances × max_permits, ⌈limit × lease / period⌉)` permits more
/// than the exact policy would admit in that interval
/// ([`LocalBudget::overshoot_bound`]); over any period-long stretch once
/// leases have ended, no more than the policy's own allowance. Permits
/// left when a lease ends (or held by an instance that stopped) are lost:
/// the subject gets fewer, never more, and its state in Redis recovers at
/// the policy's rate. A slow policy (at most one permit per lease period)
/// is never leased: each of its checks is exact.
///
/// **Resets and policy changes.** Every local answer (a lease's permits,
/// or a denial Redis gave, repeated) ends one lease period after its call
/// to Redis was sent, and a denial is repeated no longer than its own
/// retry-after. So after [`Store::reset`](portcullis_core::Store::reset)
/// returns, the instance that called it answers from Redis at once (its
/// local answers for the subject are dropped, and a lease call in flight
/// is ignored), and every other instance within one lease period. A check
/// whose policy has other numbers (limit, period or burst) than the one a
/// local answer was taken under, as after a plan change under the same
/// name, never gets that answer: it goes to Redis, on every instance, from
/// its first check under the new numbers. A reset forgives the permits
/// leased before it with the rest of the state: in the lease period after
/// a reset, the overshoot is at most `instances × min(max_permits,
/// ⌈limit × lease / period⌉)` (the unspent leases).
///
/// **Headers.** A locally admitted request reports `remaining` as this
/// instance sees it: what Redis held when the lease was taken, less what
/// this instance admitted since. Other instances' use is not in it.
///
/// ```no_run
/// use std::time::Duration;
/// use portcullis::Policy;
/// use portcullis::redis::{LocalBudget, RedisStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let budget = LocalBudget::new()
///     .max_permits(32)
///     .lease(Duration::from_millis(100))
///     .policies(["api"]);
/// let policy = Policy::per_second(1_000).name("api").build()?;
/// // Three instances: at most min(3 × 32, 1000 × 0.1) = 96 permits over.
/// assert_eq!(budget.overshoot_bound(&policy, 3), 96);
/// let store = RedisStore::builder()
///     .url("redis://127.0.0.1:6379")
///     .local_budget(budget)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
#[must_use]
pub struct LocalBudget {
    max_permits: u64,
    lease: Duration,
    max_subjects: usize,
    policies: Option<Arc<[Box<str>]>>,
}

impl fmt::Debug for LocalBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBudget")
            .field("max_permits", &self.max_permits)
            .field("lease", &self.lease)
            .field("max_subjects", &self.max_subjects)
            .field("policies", &self.policies)
            .finish()
    }
}

impl Default for LocalBudget {
    fn default() -> Self {
        Self::new()
    }
}

/// Default [`LocalBudget::max_permits`].
pub const DEFAULT_MAX_PERMITS: u64 = 64;
/// Default [`LocalBudget::lease`].
pub const DEFAULT_LEASE: Duration = Duration::from_millis(100);
/// Default [`LocalBudget::max_subjects`].
pub const DEFAULT_BUDGET_SUBJECTS: usize = 65_536;

impl LocalBudget {
    /// Leases of at most [`DEFAULT_MAX_PERMITS`] permits, each for
    /// [`DEFAULT_LEASE`], for every policy the budget can take.
    pub fn new() -> Self {
        Self {
            max_permits: DEFAULT_MAX_PERMITS,
            lease: DEFAULT_LEASE,
            max_subjects: DEFAULT_BUDGET_SUBJECTS,
            policies: None,
        }
    }

    /// The most permits one lease takes (at least 1; 1 turns leasing off).
    /// Larger leases save more calls and widen the bound. A lease takes no
    /// more than one lease period's worth of the policy's rate either.
    pub fn max_permits(mut self, max_permits: u64) -> Self {
        self.max_permits = max_permits.max(1);
        self
    }

    /// How long a lease's permits may be spent (must be positive; checked
    /// at `build()`). Shorter leases tighten the bound, lose fewer permits
    /// when demand drops, and make other instances obey a `reset()`
    /// sooner: within one lease period.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How many subjects the budget tracks at once (at least 1); a subject
    /// that finds no room is checked exactly.
    pub fn max_subjects(mut self, max_subjects: usize) -> Self {
        self.max_subjects = max_subjects.max(1);
        self
    }

    /// Only the policies with these names take the budget; others stay
    /// exact.
    pub fn policies<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.policies = Some(names.into_iter().map(|n| n.as_ref().into()).collect());
        self
    }

    /// The most permits `instances` instances with this budget admit for
    /// one subject of `policy` beyond what the exact policy admits in an
    /// interval, `min(instances × max_permits, ⌈limit × lease / period⌉)`,
    /// for every interval that starts one lease period or more after the
    /// subject's last reset (the type's docs say what holds closer to a
    /// reset).
    #[must_use]
    pub fn overshoot_bound(&self, policy: &Policy, instances: u64) -> u64 {
        let by_leases = instances.saturating_mul(self.max_permits);
        by_leases.min(self.lease_worth(policy))
    }

    /// One lease period's worth of `policy`'s rate, `⌈limit × lease /
    /// period⌉`: the most permits one lease takes.
    fn lease_worth(&self, policy: &Policy) -> u64 {
        let lease = u128::from(u64::try_from(self.lease.as_micros()).unwrap_or(u64::MAX));
        let by_rate =
            (u128::from(policy.limit()) * lease).div_ceil(u128::from(policy.period_micros()));
        u64::try_from(by_rate).unwrap_or(u64::MAX)
    }

    pub(crate) fn lease_time(&self) -> Duration {
        self.lease
    }

    fn takes(&self, policy: &Policy) -> bool {
        self.max_permits > 1
            && self
                .policies
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| &**n == policy.name()))
    }
}

/// The budget's clock, in µs: the store's client clock in
/// [`ClockMode::Client`] (so that leases end in the time the scripts
/// charge in), else a monotonic clock of this process.
pub(crate) fn now_us(clock: &ClockMode) -> u64 {
    match clock {
        ClockMode::Client(clock) => clock.now_micros(),
        ClockMode::Redis => {
            static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            let epoch = EPOCH.get_or_init(std::time::Instant::now);
            u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
        }
    }
}

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

/// A subject's budget on this instance. Times are µs of [`now_us`].
struct Slot {
    /// The numbers of the policy the lease and the denial were taken
    /// under.
    numbers: Numbers,
    /// Changes whenever the local answers are dropped (a reset, other
    /// numbers): a lease call sent before answers into nothing.
    generation: u64,
    /// Leased permits not yet admitted.
    permits: u64,
    /// When the lease's permits may no longer be spent: one lease period
    /// after the lease call was sent, so no earlier than one period after
    /// Redis charged them.
    expires: u64,
    /// `remaining` as this instance sees it.
    remaining: u64,
    reset_after: Duration,
    /// The demand (permits) of the current and the last lease period.
    period_start: u64,
    demand: u64,
    last_demand: u64,
    /// A lease call is in flight (checks meanwhile go to Redis, exact).
    leasing: bool,
    /// Redis denied a cost of `denied_cost`, with a retry-after ending no
    /// later than one lease period after the call was sent, at
    /// `denied_until`: until then costs at least that large are denied
    /// here. Redis would deny them too unless the state moved back (a
    /// reset elsewhere), which the lease period bounds.
    denied_until: u64,
    denied_cost: u64,
    denied_reset: u64,
}

impl Slot {
    /// Drops the lease and the denial, and takes `generation`, so that a
    /// lease call in flight answers into nothing. The demand stays: it is
    /// the subject's traffic, whatever the policy.
    fn drop_answers(&mut self, generation: u64) {
        self.generation = generation;
        self.permits = 0;
        self.leasing = false;
        self.denied_until = 0;
        self.denied_cost = 0;
        self.denied_reset = 0;
    }

    /// Counts `cost` in the demand of the lease period that holds `now`.
    fn count(&mut self, cost: u64, now: u64, lease: u64) {
        let since = now.saturating_sub(self.period_start);
        if since >= lease {
            self.last_demand = if since < lease.saturating_mul(2) {
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
    /// gave that still holds, or permits of a live lease (counted in the
    /// demand, and spent, when it answers).
    fn answer(&mut self, policy: &Policy, cost: u64, now: u64, lease: u64) -> Option<Verdict> {
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
        self.count(cost, now, lease);
        Some(std::iter::once(decision).collect())
    }
}

/// What a check does with the budget.
pub(crate) enum Plan {
    /// Admitted from the lease.
    Local(Verdict),
    /// Take a lease (this check's cost first).
    Lease(Ask),
    /// Check in Redis as always.
    Exact,
}

/// A lease to ask Redis for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    /// At most this many permits.
    permits: u64,
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
    /// at `now` (µs of [`now_us`]).
    pub(crate) fn plan(&self, key: &str, policy: &Policy, cost: u64, now: u64) -> Plan {
        let lease = u64::try_from(self.config.lease.as_micros()).unwrap_or(u64::MAX);
        let limit_per_shard = self.config.max_subjects.div_ceil(SHARDS);
        let mut shard = self.shard(key);
        let shard = &mut *shard;
        if !shard.slots.contains_key(key) {
            if shard.slots.len() >= limit_per_shard {
                if shard.sweep_after > 0 {
                    shard.sweep_after -= 1;
                    return Plan::Exact;
                }
                // Forget subjects idle for two lease periods.
                shard.slots.retain(|_, slot| {
                    slot.leasing || now.saturating_sub(slot.period_start) < lease.saturating_mul(2)
                });
                if shard.slots.len() >= limit_per_shard {
                    // Still full: the next eighth of a shard's worth of new
                    // subjects are checked exactly without a sweep, so a
                    // sweep costs O(1) per new subject, amortized.
                    shard.sweep_after = limit_per_shard.div_ceil(8);
                    return Plan::Exact;
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
                    leasing: false,
                    denied_until: 0,
                    denied_cost: 0,
                    denied_reset: 0,
                },
            );
        }
        let Some(slot) = shard.slots.get_mut(key) else {
            return Plan::Exact;
        };
        if slot.numbers != Numbers::of(policy) {
            // A plan changed under the same name: what was taken under the
            // old numbers is dropped (a lease call in flight included).
            slot.drop_answers(self.next_generation());
            slot.numbers = Numbers::of(policy);
        }
        if let Some(verdict) = slot.answer(policy, cost, now, lease) {
            return Plan::Local(verdict);
        }
        slot.count(cost, now, lease);
        // Leftovers too few for this cost, or past the lease: dropped.
        slot.permits = 0;
        let want = slot
            .last_demand
            .min(self.config.max_permits)
            .min(policy.capacity())
            .min(self.config.lease_worth(policy));
        if want <= cost || slot.leasing {
            return Plan::Exact;
        }
        slot.leasing = true;
        Plan::Lease(Ask {
            permits: want,
            generation: slot.generation,
        })
    }

    /// `reset()` of the subject whose state is `key` has answered: this
    /// instance's leases and denials for it are dropped, and a lease call
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
        let lease = u64::try_from(self.config.lease.as_micros()).unwrap_or(u64::MAX);
        self.shard(key)
            .slots
            .get_mut(key)?
            .answer(policy, cost, now, lease)
    }

    /// A lease call for `key` asked as `ask`, sent at `sent` (µs of
    /// [`now_us`]), ended: `granted` permits were charged (this check's
    /// `cost` among them) at `decision` (None: it failed).
    fn leased(
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
        slot.leasing = false;
        let lease = u64::try_from(self.config.lease.as_micros()).unwrap_or(u64::MAX);
        if let Some(retry) = decision.and_then(Decision::retry_after) {
            // Measured from when the call was sent, which is no later than
            // when Redis decided: the local denial ends no later than
            // Redis' would, and no later than one lease period after the
            // call (a reset elsewhere is obeyed by then).
            let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            slot.denied_until = sent.saturating_add(micros(retry).min(lease));
            slot.denied_cost = cost;
            slot.denied_reset =
                decision.map_or(sent, |d| sent.saturating_add(micros(d.reset_after())));
            return;
        }
        if let Some(decision) = decision.filter(|d| d.is_allowed() && granted >= cost) {
            slot.permits = granted - cost;
            slot.expires = sent.saturating_add(lease);
            slot.remaining = decision.remaining();
            slot.reset_after = decision.reset_after();
        }
    }
}

/// Clears the subject's `leasing` mark if the lease call's future is
/// dropped before it ends.
struct Leasing {
    inner: Arc<Inner>,
    key: String,
    ask: Ask,
    cost: u64,
    sent: u64,
    done: bool,
}

impl Drop for Leasing {
    fn drop(&mut self) {
        if !self.done {
            if let Some(budget) = &self.inner.budget {
                budget.leased(&self.key, self.ask, self.cost, 0, self.sent, None);
            }
        }
    }
}

/// The lease call: up to `want.permits` permits of `policy` for `key`,
/// this check's `cost` first.
pub(crate) async fn lease(
    inner: Arc<Inner>,
    key: String,
    policy: Policy,
    cost: u64,
    want: Ask,
) -> Result<Verdict, StoreError> {
    let mut guard = Leasing {
        sent: now_us(&inner.clock),
        inner: Arc::clone(&inner),
        key,
        ask: want,
        cost,
        done: false,
    };
    let script = inner.scripts.library().take_function();
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(script.sha())
        .arg(1)
        .arg(guard.key.as_str())
        .arg(format!(
            "{}:{}:{}",
            policy.limit(),
            policy.period_micros(),
            policy.capacity()
        ));
    store::push_time(&mut cmd, inner.now());
    cmd.arg(cost).arg(want.permits);
    let answer = store::run(&inner, script, &cmd, &guard.key).await;
    let (granted, verdict) = match answer {
        Ok(Value::Array(items)) => match store::ints::<2>(&items)? {
            [granted, ahead] if granted > 0 => {
                let granted = granted.unsigned_abs();
                (granted, crate::fast::verdict(&policy, ahead, cost)?)
            }
            [_, ahead] => (0, crate::fast::verdict(&policy, -1 - ahead, cost)?),
        },
        // A state only the general check reads, or a refused function:
        // this check alone, exactly; the next lease finds the state read.
        Ok(Value::SimpleString(status)) if status == "GENERAL" => {
            (0, exact(&inner, &guard.key, &policy, cost).await?)
        }
        Ok(other) => {
            return Err(store::protocol(format!(
                "a lease of permits answered {other:?}"
            )))
        }
        Err(error) if inner.scripts.path().refused(&error) => {
            (0, exact(&inner, &guard.key, &policy, cost).await?)
        }
        Err(error) => return Err(error),
    };
    if let Some(budget) = &inner.budget {
        budget.leased(
            &guard.key,
            want,
            cost,
            granted,
            guard.sent,
            Some(verdict.binding()),
        );
    }
    guard.done = true;
    Ok(verdict)
}

/// One check of `cost`, as the general script decides it (`EVALSHA`).
#[cold]
async fn exact(
    inner: &Inner,
    key: &str,
    policy: &Policy,
    cost: u64,
) -> Result<Verdict, StoreError> {
    let general = format!(
        "{}:{}:{}",
        policy.limit(),
        policy.period_micros(),
        policy.capacity()
    );
    let algorithm = std::iter::once(policy.algorithm());
    let value =
        store::evalsha_check(inner, algorithm, &[key], inner.now(), cost, &[&general]).await?;
    store::parse_verdict(value, &[policy.capacity()])
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
