//! The result of a check.

use std::time::Duration;

use smallvec::SmallVec;

/// What one policy decided for one check.
///
/// Durations keep microsecond precision; rounding to whole seconds happens
/// only at the HTTP edge, and upward.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::Decision;
///
/// let denied = Decision::denied(10, 0, Duration::from_millis(250), Duration::from_secs(1));
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(250)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after: Option<Duration>,
    reset_after: Duration,
    delay: Duration,
}

impl Decision {
    /// An admitting decision. Store implementations build decisions with
    /// this and [`Decision::denied`].
    #[must_use]
    pub const fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            retry_after: None,
            reset_after,
            delay: Duration::ZERO,
        }
    }

    /// A denying decision.
    #[must_use]
    pub const fn denied(
        limit: u64,
        remaining: u64,
        retry_after: Duration,
        reset_after: Duration,
    ) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            retry_after: Some(retry_after),
            reset_after,
            delay: Duration::ZERO,
        }
    }

    /// The same decision with a queueing delay (leaky bucket in queue mode).
    #[must_use]
    pub const fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Whether the request was admitted.
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The most permits the policy admits at once (its capacity).
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// Permits of cost 1 still available right now, after this request.
    #[must_use]
    pub const fn remaining(&self) -> u64 {
        self.remaining
    }

    /// When denied: how long until the same request would be admitted, if
    /// nothing else arrives. `None` when allowed.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// How long until the key is back to full capacity.
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// For a leaky bucket in queue mode: how long the admitted request must
    /// wait for its turn. Zero otherwise.
    #[must_use]
    pub const fn delay(&self) -> Duration {
        self.delay
    }
}

/// The outcome of checking one or several policies at once: all admit, or
/// none is charged.
///
/// Decisions are in the order the policies were given.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Decision, Verdict};
///
/// let verdict = Verdict::from_iter([
///     Decision::allowed(10, 9, Duration::from_millis(100)),
///     Decision::denied(1000, 0, Duration::from_secs(30), Duration::from_secs(60)),
/// ]);
/// assert!(!verdict.is_allowed());
/// assert_eq!(verdict.retry_after(), Some(Duration::from_secs(30)));
/// assert_eq!(verdict.binding().limit(), 1000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    decisions: SmallVec<[Decision; 2]>,
}

impl FromIterator<Decision> for Verdict {
    fn from_iter<I: IntoIterator<Item = Decision>>(iter: I) -> Self {
        // Pushing one by one: `SmallVec`'s own `collect` costs several times
        // more for the one or two decisions a verdict holds, and stores
        // build a verdict on every check.
        let mut decisions = SmallVec::new();
        for decision in iter {
            decisions.push(decision);
        }
        Self { decisions }
    }
}

impl Verdict {
    /// A verdict of one decision, built without an iterator (the memory
    /// store's hot path).
    #[inline]
    pub(crate) fn from_one(decision: Decision) -> Self {
        let mut decisions = SmallVec::new();
        decisions.push(decision);
        Self { decisions }
    }

    /// Whether every policy admitted the request (and so all were charged).
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        self.decisions.iter().all(Decision::is_allowed)
    }

    /// One decision per policy, in the order the policies were given.
    #[must_use]
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// The decision that matters most: when denied, the denying decision
    /// with the longest `retry_after`; when allowed, the one with the fewest
    /// `remaining`.
    ///
    /// # Panics
    ///
    /// Never for verdicts returned by a store, which hold one decision per
    /// policy and refuse an empty policy list; a hand-built empty verdict
    /// panics.
    #[must_use]
    pub fn binding(&self) -> &Decision {
        let denied = self
            .decisions
            .iter()
            .filter(|d| !d.is_allowed())
            .max_by_key(|d| d.retry_after);
        denied
            .or_else(|| self.decisions.iter().min_by_key(|d| d.remaining))
            .expect("a verdict holds at least one decision")
    }

    /// When denied, the longest `retry_after` among the denying policies.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.decisions.iter().filter_map(|d| d.retry_after).max()
    }

    /// The longest queueing delay among the policies (zero unless a leaky
    /// bucket in queue mode is involved).
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.decisions
            .iter()
            .map(Decision::delay)
            .max()
            .unwrap_or_default()
    }
}
