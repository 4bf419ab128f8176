//! The result of a check.

use std::fmt;
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
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    // The three durations are kept as seconds and nanoseconds in separate
    // fields rather than as `Duration`s (16 bytes each with padding): a
    // decision is then 56 bytes instead of 72, and a two-decision `Verdict`
    // (returned by value on every check) 120 instead of 152, which the
    // compiler copies inline. The representation is lossless.
    limit: u64,
    remaining: u64,
    retry_after_secs: u64,
    reset_after_secs: u64,
    delay_secs: u64,
    /// `NO_RETRY` when allowed.
    retry_after_nanos: u32,
    reset_after_nanos: u32,
    delay_nanos: u32,
    allowed: bool,
}

/// `retry_after_nanos` of a decision without a retry-after (never a valid
/// sub-second part).
const NO_RETRY: u32 = 1_000_000_000;

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("retry_after", &self.retry_after())
            .field("reset_after", &self.reset_after())
            .field("delay", &self.delay())
            .finish()
    }
}

impl Decision {
    /// An admitting decision. Store implementations build decisions with
    /// this and [`Decision::denied`].
    #[must_use]
    pub const fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self {
            limit,
            remaining,
            retry_after_secs: 0,
            reset_after_secs: reset_after.as_secs(),
            delay_secs: 0,
            retry_after_nanos: NO_RETRY,
            reset_after_nanos: reset_after.subsec_nanos(),
            delay_nanos: 0,
            allowed: true,
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
            limit,
            remaining,
            retry_after_secs: retry_after.as_secs(),
            reset_after_secs: reset_after.as_secs(),
            delay_secs: 0,
            retry_after_nanos: retry_after.subsec_nanos(),
            reset_after_nanos: reset_after.subsec_nanos(),
            delay_nanos: 0,
            allowed: false,
        }
    }

    /// The same decision with a queueing delay (leaky bucket in queue mode).
    #[must_use]
    pub const fn with_delay(mut self, delay: Duration) -> Self {
        self.delay_secs = delay.as_secs();
        self.delay_nanos = delay.subsec_nanos();
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
        if self.retry_after_nanos == NO_RETRY {
            None
        } else {
            // The nanoseconds are below one second: no carry, no panic.
            Some(Duration::new(self.retry_after_secs, self.retry_after_nanos))
        }
    }

    /// How long until the key is back to full capacity.
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        Duration::new(self.reset_after_secs, self.reset_after_nanos)
    }

    /// For a leaky bucket in queue mode: how long the admitted request must
    /// wait for its turn. Zero otherwise.
    #[must_use]
    pub const fn delay(&self) -> Duration {
        Duration::new(self.delay_secs, self.delay_nanos)
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
    /// Verdicts from a store hold one decision per policy and stores refuse
    /// an empty policy list; for a hand-built empty verdict (which admits,
    /// like an empty `all`) this is an admitting decision with limit 0.
    #[must_use]
    pub fn binding(&self) -> &Decision {
        static EMPTY: Decision = Decision::allowed(0, 0, Duration::ZERO);
        let denied = self
            .decisions
            .iter()
            .filter(|d| !d.is_allowed())
            .max_by_key(|d| d.retry_after());
        denied
            .or_else(|| self.decisions.iter().min_by_key(|d| d.remaining))
            .unwrap_or(&EMPTY)
    }

    /// When denied, the longest `retry_after` among the denying policies.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.decisions.iter().filter_map(|d| d.retry_after()).max()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_survive_the_packed_representation() {
        let odd = Duration::new(12_345, 678_901_234);
        for retry in [Duration::ZERO, Duration::from_nanos(1), odd, Duration::MAX] {
            let denied = Decision::denied(7, 3, retry, odd).with_delay(Duration::MAX);
            assert_eq!(denied.retry_after(), Some(retry));
            assert_eq!(denied.reset_after(), odd);
            assert_eq!(denied.delay(), Duration::MAX);
            assert!(!denied.is_allowed());
        }
        let allowed = Decision::allowed(7, 3, Duration::MAX);
        assert_eq!(allowed.retry_after(), None);
        assert_eq!(allowed.reset_after(), Duration::MAX);
        assert_eq!(allowed.delay(), Duration::ZERO);
        assert_ne!(
            allowed,
            Decision::denied(7, 3, Duration::ZERO, Duration::MAX)
        );
        assert_eq!(std::mem::size_of::<Decision>(), 56);
    }

    #[test]
    fn debug_shows_durations() {
        let debug = format!(
            "{:?}",
            Decision::denied(10, 0, Duration::from_millis(250), Duration::from_secs(1))
        );
        assert_eq!(
            debug,
            "Decision { allowed: false, limit: 10, remaining: 0, retry_after: Some(250ms), reset_after: 1s, delay: 0ns }"
        );
    }
}
