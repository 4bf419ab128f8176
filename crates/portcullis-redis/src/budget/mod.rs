//! The local budget ([`LocalBudget`], opt-in): for a busy subject, an
//! instance takes a rate share from Redis in one call (the next emission
//! slots of the subject's GCRA state over one grant period, up to
//! `max_permits`, charged in Redis at once) and dispenses them locally on
//! the GCRA schedule, each no earlier than the exact check would admit it,
//! until the share is spent or the grant period ends; what is left is
//! dropped, never given back. While it knows nothing can be admitted (its
//! next slot not yet due, or Redis' state ahead), it denies locally. The
//! size of the next share follows the subject's demand on this instance
//! over the last grant period, so a quiet subject (at most one check per
//! period) is never granted: each of its checks goes to Redis and is exact.
//!
//! Every slot dispensed was charged in Redis, distinct from every other
//! permit, and is dispensed no earlier than its GCRA time and less than one
//! grant period after it; that gives the bound the docs state
//! ([`LocalBudget::overshoot_bound`]). A subject's state in Redis can move
//! back (a `reset()`, a policy changed under the same name), so no local
//! answer outlives one grant period, each is tied to the policy's numbers,
//! and `reset()` drops this instance's answers for the subject at once.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::Policy;

mod grant;
mod table;

pub(crate) use grant::grant;
pub(crate) use table::{Ask, Budget, Share, Take};

/// A local budget: busy subjects are admitted from rate shares taken from
/// Redis, so a hot subject costs Redis a fraction of a call per request,
/// under its limit or flooding far past it, at the price of a stated
/// overshoot. Give it to
/// [`RedisStoreBuilder::local_budget`](crate::RedisStoreBuilder::local_budget).
///
/// It applies to checks of one GCRA policy whose emission interval is a
/// whole number of microseconds (the Redis fast path; `per_second(1000)`,
/// `per_minute(600)`), with a cost of at least 1, on either call path (a
/// grant is one `FCALL` of the library's `gcra_take`, or one `EVALSHA` of
/// the same code as a script where Redis refuses Functions); other checks
/// are exact as always. [`LocalBudget::policies`] limits it to policies by
/// name.
///
/// **Rate shares.** A grant call charges, in one call, the subject's next
/// emission slots whose GCRA times (when the exact check would admit each)
/// fall within the next grant period: what is left of the burst, due at
/// once, then one slot per emission interval; at most `min(max_permits,
/// ⌈limit × grant / period⌉)` and no more than the demand this instance
/// saw over the last grant period. The instance admits slot `j` no earlier
/// than its GCRA time and denies the checks in between locally (with the
/// time to the next slot as the retry-after). When its share is spent it
/// still knows Redis' state was at least that far ahead, so it denies
/// until Redis could admit the next permit; a share of none (the other
/// instances hold the period) holds the denial for the grant period; and
/// while its next grant call is in flight for a subject at its limit, its
/// checks are denied here rather than sent to Redis. So a subject flooding
/// past its limit costs each instance one Redis call per `min(max_permits
/// × interval, grant period)`, whatever the offered load.
///
/// **The bound.** Slots charged in Redis are distinct across instances
/// and each is dispensed no earlier than its GCRA time and before one
/// grant period after it; at most `min(max_permits, ⌈limit × grant /
/// period⌉)` slots charged and not yet dispensed wait on one instance at a
/// time. So over any interval, the subject is admitted at most
/// `min(instances × max_permits, ⌈limit × grant / period⌉)` permits more
/// than the exact policy would admit in that interval
/// ([`LocalBudget::overshoot_bound`]; the permits dispensed late in it,
/// or those whose GCRA times fell in the grant period before it); over a
/// whole run, no more than Redis charged. Slots not dispensed within the
/// grant period (demand dropped), the rest of a share when the next is
/// taken, and the share of an instance that stopped are lost: the subject
/// gets fewer, never more, the other instances are held back by at most
/// that share, and the state recovers at the policy's rate. A slow policy
/// (at most one permit per grant period) is never granted: each of its
/// checks is exact. ALGORITHMS.md ("The local budget's bound") has the
/// proof.
///
/// **Resets and policy changes.** Every local answer (a share's slots,
/// or a held denial) ends one grant period after its call to Redis was
/// sent. So after [`Store::reset`](portcullis_core::Store::reset)
/// returns, the instance that called it answers from Redis at once (its
/// local answers for the subject are dropped, and a grant call in flight
/// is ignored), and every other instance within one grant period. A check
/// whose policy has other numbers (limit, period or burst) than the one a
/// local answer was taken under, as after a plan change under the same
/// name, never gets that answer: it goes to Redis, on every instance, from
/// its first check under the new numbers. A reset forgives the slots
/// charged before it with the rest of the state: in the grant period after
/// a reset, the overshoot is at most `instances × min(max_permits,
/// ⌈limit × grant / period⌉)` (the undispensed shares).
///
/// **Headers.** A locally admitted request reports `remaining` as this
/// instance sees it: what Redis held when the share was taken, less what
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
///     .grant_period(Duration::from_millis(100))
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
    grant_period: Duration,
    max_subjects: usize,
    policies: Option<Arc<[Box<str>]>>,
}

impl fmt::Debug for LocalBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBudget")
            .field("max_permits", &self.max_permits)
            .field("grant_period", &self.grant_period)
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
pub(crate) const DEFAULT_MAX_PERMITS: u64 = 64;
/// Default [`LocalBudget::grant_period`].
pub(crate) const DEFAULT_GRANT_PERIOD: Duration = Duration::from_millis(100);
/// Default [`LocalBudget::max_subjects`].
pub(crate) const DEFAULT_BUDGET_SUBJECTS: usize = 65_536;

impl LocalBudget {
    /// Grants of at most 64 permits, each for 100 ms, for every policy the
    /// budget can take, tracking at most 65 536 subjects.
    pub fn new() -> Self {
        Self {
            max_permits: DEFAULT_MAX_PERMITS,
            grant_period: DEFAULT_GRANT_PERIOD,
            max_subjects: DEFAULT_BUDGET_SUBJECTS,
            policies: None,
        }
    }

    /// The most slots one share takes (at least 1; 1 turns granting off).
    /// Larger shares save more calls and widen the bound. A share takes no
    /// more than one grant period's worth of the policy's rate either.
    /// Default: 64.
    pub fn max_permits(mut self, max_permits: u64) -> Self {
        self.max_permits = max_permits.max(1);
        self
    }

    /// How long a share's slots may be dispensed, and how far ahead of now
    /// they reach (must be positive; checked at `build()`; the reach is cut
    /// to the capacity's time or 1 s, whichever is longer). Shorter periods
    /// tighten the bound, lose fewer slots when demand drops, and make
    /// other instances obey a `reset()` sooner: within one grant period;
    /// longer ones cost a flooding subject fewer calls. Default: 100 ms.
    pub fn grant_period(mut self, period: Duration) -> Self {
        self.grant_period = period;
        self
    }

    /// How many subjects the budget tracks at once (at least 1); a subject
    /// that finds no room is checked exactly. Default: 65 536. A subject
    /// idle for two grant periods is forgotten, at the latest two grant
    /// periods later (or when a new subject finds its part of the table
    /// full), so the budget holds about the subjects seen in the last few
    /// grant periods, however many there are in all.
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
    /// interval, `min(instances × max_permits, ⌈limit × grant / period⌉)`,
    /// for every interval that starts one grant period or more after the
    /// subject's last reset (the type's docs say what holds closer to a
    /// reset).
    #[must_use]
    pub fn overshoot_bound(&self, policy: &Policy, instances: u64) -> u64 {
        let by_grants = instances.saturating_mul(self.max_permits);
        by_grants.min(self.grant_worth(policy))
    }

    /// One grant period's worth of `policy`'s rate, `⌈limit × grant /
    /// period⌉`: the most permits one grant takes.
    pub(crate) fn grant_worth(&self, policy: &Policy) -> u64 {
        let grant = u128::from(u64::try_from(self.grant_period.as_micros()).unwrap_or(u64::MAX));
        let by_rate =
            (u128::from(policy.limit()) * grant).div_ceil(u128::from(policy.period_micros()));
        u64::try_from(by_rate).unwrap_or(u64::MAX)
    }

    pub(crate) fn period(&self) -> Duration {
        self.grant_period
    }

    pub(crate) fn takes(&self, policy: &Policy) -> bool {
        self.max_permits > 1
            && self
                .policies
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| &**n == policy.name()))
    }
}
