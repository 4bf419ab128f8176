//! The result of a check.

use std::fmt;
use std::time::Duration;

/// What one policy decided for one check.
///
/// Durations are kept in whole microseconds, the precision every algorithm
/// computes in (the constructors round a finer [`Duration`] up); rounding to
/// whole seconds happens only at the HTTP edge, and upward. Longer durations
/// than `u64::MAX` microseconds (584,000 years) are kept as that, except a
/// `retry_after` that long, which stays [`Duration::MAX`]: algorithms use it
/// for "never".
///
/// ```
/// use std::time::Duration;
/// use portcullis::Decision;
///
/// let denied = Decision::denied(10, 0, Duration::from_millis(250), Duration::from_secs(1));
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(250)));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    // Microseconds rather than `Duration`s (16 bytes each with padding): a
    // decision is 40 bytes, and stores build one on every check.
    limit: u64,
    remaining: u64,
    /// `NO_RETRY` when allowed: a decision denies exactly when it has one.
    retry_after_us: u64,
    reset_after_us: u64,
    delay_us: u64,
}

/// `retry_after_us` of an admitting decision.
const NO_RETRY: u64 = u64::MAX;
/// A `retry_after_us` that reads as [`Duration::MAX`].
const NEVER_RETRY: u64 = NO_RETRY - 1;
/// Where `reset_after_us` and `delay_us` saturate.
const NEVER: u64 = u64::MAX;

/// `duration` in microseconds, rounded up, saturating at `max`.
const fn micros_up(duration: Duration, max: u64) -> u64 {
    let micros = duration.as_micros() + !duration.subsec_nanos().is_multiple_of(1_000) as u128;
    if micros > max as u128 {
        max
    } else {
        // `micros <= max`, so the cast is exact.
        micros as u64
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.is_allowed())
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
        Self::allowed_us(limit, remaining, micros_up(reset_after, NEVER))
    }

    /// A denying decision. A `retry_after` beyond 584,000 years is kept as
    /// that.
    #[must_use]
    pub const fn denied(
        limit: u64,
        remaining: u64,
        retry_after: Duration,
        reset_after: Duration,
    ) -> Self {
        Self::denied_us(
            limit,
            remaining,
            micros_up(retry_after, NEVER_RETRY),
            micros_up(reset_after, NEVER),
        )
    }

    /// [`Decision::allowed`] in microseconds.
    #[inline]
    pub(crate) const fn allowed_us(limit: u64, remaining: u64, reset_after_us: u64) -> Self {
        Self {
            limit,
            remaining,
            retry_after_us: NO_RETRY,
            reset_after_us,
            delay_us: 0,
        }
    }

    /// [`Decision::denied`] in microseconds (`retry_after_us` below
    /// `u64::MAX`).
    #[inline]
    pub(crate) const fn denied_us(
        limit: u64,
        remaining: u64,
        retry_after_us: u64,
        reset_after_us: u64,
    ) -> Self {
        Self {
            limit,
            remaining,
            retry_after_us,
            reset_after_us,
            delay_us: 0,
        }
    }

    /// The same decision with `remaining` replaced: how a store reports
    /// what a priority class may still spend (the shared remaining less the
    /// class's reserve).
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::Decision;
    ///
    /// let decision = Decision::allowed(10, 7, Duration::from_secs(3));
    /// assert_eq!(decision.with_remaining(2).remaining(), 2);
    /// ```
    #[must_use]
    pub const fn with_remaining(mut self, remaining: u64) -> Self {
        self.remaining = remaining;
        self
    }

    /// The same decision with a queueing delay (leaky bucket in queue mode).
    #[must_use]
    pub const fn with_delay(mut self, delay: Duration) -> Self {
        self.delay_us = micros_up(delay, NEVER);
        self
    }

    /// Whether the request was admitted.
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        self.retry_after_us == NO_RETRY
    }

    /// The policy's capacity ([`Policy::capacity`](crate::Policy::capacity)):
    /// the most permits it admits at once, the number [`remaining`](Self::remaining)
    /// counts down from. For bucket algorithms (GCRA, token and leaky
    /// bucket) that is the burst, which defaults to the limit; for window
    /// algorithms, the limit per window.
    ///
    /// It is not [`Policy::limit`](crate::Policy::limit), the rate
    /// (permits per period): a decision describes one subject's bucket or
    /// window, whose size is the capacity, so `remaining <= limit()`
    /// always holds. The two differ only for a bucket with a burst other
    /// than its limit.
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let policy = Policy::per_second(10).burst(20).build()?;
    /// let verdict = MemoryStore::new().check("alice", &[policy.clone()], 1).await?;
    /// let decision = verdict.decisions()[0];
    /// assert_eq!(policy.limit(), 10); // the rate: 10 per second
    /// assert_eq!(decision.limit(), 20); // the capacity: 20 at once
    /// assert_eq!(decision.remaining(), 19);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
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
        if self.is_allowed() {
            None
        } else {
            Some(if self.retry_after_us == NEVER_RETRY {
                Duration::MAX
            } else {
                Duration::from_micros(self.retry_after_us)
            })
        }
    }

    /// How long until the key is back to full capacity.
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }

    /// [`Decision::reset_after`] in microseconds.
    #[inline]
    pub(crate) const fn reset_after_us(&self) -> u64 {
        self.reset_after_us
    }

    /// For a leaky bucket in queue mode: how long the admitted request must
    /// wait for its turn. Zero otherwise.
    #[must_use]
    pub const fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us)
    }
}

/// The outcome of checking one or several policies at once: all admit, or
/// none is charged.
///
/// Decisions are in the order the policies were given.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{Decision, Verdict};
///
/// let verdict = Verdict::from_iter([
///     Decision::allowed(10, 9, Duration::from_millis(100)),
///     Decision::denied(1000, 0, Duration::from_secs(30), Duration::from_secs(60)),
/// ]);
/// assert!(!verdict.is_allowed());
/// assert_eq!(verdict.retry_after(), Some(Duration::from_secs(30)));
/// assert_eq!(verdict.binding().limit(), 1000);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Verdict {
    decisions: Decisions,
}

/// A verdict's decisions: one (the common case, 48 bytes with no
/// allocation, which stores return on every check), or any other number.
#[derive(Clone, PartialEq, Eq)]
enum Decisions {
    One(Decision),
    /// Never one decision. Whether all admit is kept, not recomputed:
    /// callers ask on every request.
    Many {
        decisions: Vec<Decision>,
        allowed: bool,
    },
}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdict")
            .field("decisions", &self.decisions())
            .field("allowed", &self.is_allowed())
            .finish()
    }
}

impl FromIterator<Decision> for Verdict {
    fn from_iter<I: IntoIterator<Item = Decision>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let decisions = match (iter.next(), iter.next()) {
            (Some(one), None) => Decisions::One(one),
            (first, second) => {
                let mut decisions: Vec<Decision> = first.into_iter().chain(second).collect();
                decisions.extend(iter);
                Decisions::Many {
                    allowed: decisions.iter().all(Decision::is_allowed),
                    decisions,
                }
            }
        };
        Self { decisions }
    }
}

impl Verdict {
    /// A verdict of one decision, built without an iterator (the memory
    /// store's hot path).
    #[inline]
    pub(crate) const fn from_one(decision: Decision) -> Self {
        Self {
            decisions: Decisions::One(decision),
        }
    }

    /// Whether every policy admitted the request (and so all were charged).
    #[must_use]
    #[inline]
    pub fn is_allowed(&self) -> bool {
        match &self.decisions {
            Decisions::One(decision) => decision.is_allowed(),
            Decisions::Many { allowed, .. } => *allowed,
        }
    }

    /// One decision per policy, in the order the policies were given.
    #[must_use]
    #[inline]
    pub fn decisions(&self) -> &[Decision] {
        match &self.decisions {
            Decisions::One(decision) => std::slice::from_ref(decision),
            Decisions::Many { decisions, .. } => decisions,
        }
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
            .decisions()
            .iter()
            .filter(|d| !d.is_allowed())
            .max_by_key(|d| d.retry_after());
        denied
            .or_else(|| self.decisions().iter().min_by_key(|d| d.remaining))
            .unwrap_or(&EMPTY)
    }

    /// When denied, the longest `retry_after` among the denying policies.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.decisions()
            .iter()
            .filter_map(|d| d.retry_after())
            .max()
    }

    /// The longest queueing delay among the policies (zero unless a leaky
    /// bucket in queue mode is involved).
    #[must_use]
    #[inline]
    pub fn delay(&self) -> Duration {
        match &self.decisions {
            // Asked on every admitted request: no iterator for one policy.
            Decisions::One(decision) => decision.delay(),
            Decisions::Many { decisions, .. } => decisions
                .iter()
                .map(Decision::delay)
                .max()
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_kept_in_microseconds_rounded_up() {
        let odd = Duration::new(12_345, 678_901_234);
        let odd_up = Duration::new(12_345, 678_902_000);
        for (retry, kept) in [
            (Duration::ZERO, Duration::ZERO),
            (Duration::from_nanos(1), Duration::from_micros(1)),
            (Duration::from_micros(7), Duration::from_micros(7)),
            (odd, odd_up),
            // The largest countable retry, and "never" beyond it.
            (
                Duration::from_micros(u64::MAX - 2),
                Duration::from_micros(u64::MAX - 2),
            ),
            (Duration::from_micros(u64::MAX - 1), Duration::MAX),
            (Duration::MAX, Duration::MAX),
        ] {
            let denied = Decision::denied(7, 3, retry, odd).with_delay(Duration::MAX);
            assert_eq!(denied.retry_after(), Some(kept));
            assert_eq!(denied.reset_after(), odd_up);
            assert_eq!(denied.delay(), Duration::from_micros(u64::MAX));
            assert!(!denied.is_allowed());
        }
        let allowed = Decision::allowed(7, 3, Duration::MAX);
        assert!(allowed.is_allowed());
        assert_eq!(allowed.retry_after(), None);
        assert_eq!(allowed.reset_after(), Duration::from_micros(u64::MAX));
        assert_eq!(allowed.delay(), Duration::ZERO);
        assert_ne!(
            allowed,
            Decision::denied(7, 3, Duration::ZERO, Duration::MAX)
        );
        assert_eq!(std::mem::size_of::<Decision>(), 40);
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
