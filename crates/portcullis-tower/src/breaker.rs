//! A circuit breaker in front of the store: after repeated store-wide
//! failures ([`StoreError::is_store_wide`](portcullis_core::StoreError::is_store_wide)),
//! stop asking for a short pause so requests do not each wait out the
//! timeout. Also the rate-limited log of requests let through undecided.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub(crate) struct Breaker {
    /// Consecutive failures that open the breaker; 0 disables it.
    threshold: u32,
    pause: Duration,
    failures: AtomicU32,
    /// Microseconds since `base` until which the breaker is open.
    open_until: AtomicU64,
    base: Instant,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, pause: Duration) -> Self {
        Self {
            threshold,
            pause,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    fn now_micros(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// How long the breaker stays open.
    pub(crate) fn pause(&self) -> Duration {
        self.pause
    }

    fn pause_micros(&self) -> u64 {
        u64::try_from(self.pause.as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether a request may ask the store. While open, no; once the pause
    /// is over, exactly one request probes the store (the others keep
    /// skipping it until the probe succeeds or the next pause ends).
    pub(crate) fn allow(&self) -> bool {
        if self.threshold == 0 || self.failures.load(Ordering::Relaxed) < self.threshold {
            return true;
        }
        let until = self.open_until.load(Ordering::Acquire);
        let now = self.now_micros();
        if now < until {
            return false;
        }
        self.open_until
            .compare_exchange(
                until,
                now.saturating_add(self.pause_micros()),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Records a success; returns whether the breaker was open (this
    /// success closes it).
    pub(crate) fn success(&self) -> bool {
        let failures = self.failures.load(Ordering::Relaxed);
        if failures == 0 {
            return false;
        }
        self.failures.swap(0, Ordering::Relaxed) >= self.threshold && self.threshold > 0
    }

    /// Whether a store-wide failure was recorded since the last success:
    /// the store is in an outage (with the breaker disabled too).
    #[inline]
    pub(crate) fn failing(&self) -> bool {
        self.failures.load(Ordering::Relaxed) > 0
    }

    /// Records a failure; returns whether this one opened the breaker.
    pub(crate) fn failure(&self) -> bool {
        if self.threshold == 0 {
            // Never opens; remembered for `failing`.
            self.failures.store(1, Ordering::Relaxed);
            return false;
        }
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if failures >= self.threshold {
            let until = self.now_micros().saturating_add(self.pause_micros());
            self.open_until.store(until, Ordering::Release);
            return failures == self.threshold;
        }
        false
    }
}

/// When the store answers after store-wide failures: the requests let
/// through undecided and the store errors counted since the last warning
/// (due at most once a second), for the layer to log, so the last ones of
/// a short outage are reported. `None` when there was no outage (one
/// atomic load) or nothing is pending. Both layers call this.
pub(crate) fn outage_counts(
    breaker: &Breaker,
    undecided: &UndecidedLog,
    errors: &UndecidedLog,
) -> Option<(u64, u64)> {
    if !breaker.failing() {
        return None;
    }
    let undecided = undecided.flush();
    let errors = errors.flush();
    (undecided.is_some() || errors.is_some()).then(|| (undecided.unwrap_or(0), errors.unwrap_or(0)))
}

/// Counts events (requests let through undecided, store errors) so that
/// they are logged at `warn` at most once per second, with the count since
/// the last log.
#[derive(Debug)]
pub(crate) struct UndecidedLog {
    /// Passes not yet logged.
    pending: AtomicU64,
    /// Microseconds since `base` of the last log, plus one (0: never).
    last: AtomicU64,
    /// The same for the last [`flush`](Self::flush) that logged.
    last_flush: AtomicU64,
    base: Instant,
}

/// The shortest time between two logs of undecided passes.
const UNDECIDED_LOG_EVERY: Duration = Duration::from_secs(1);

impl UndecidedLog {
    pub(crate) fn new() -> Self {
        Self {
            pending: AtomicU64::new(0),
            last: AtomicU64::new(0),
            last_flush: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    /// Counts one pass; returns the number of passes to log now, if a log
    /// is due (the first pass, then at most once per second).
    pub(crate) fn record(&self) -> Option<u64> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let now = self.now();
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < every() {
            return None;
        }
        self.last
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(self.pending.swap(0, Ordering::AcqRel))
    }

    /// At the end of an outage (the store answered): the passes counted
    /// since the last log, if any, to log now, so that the last passes of
    /// a short outage are reported rather than waiting for a next one.
    /// Flushes log at most once per second too (a store that fails every
    /// other request answers as often as it fails): what a flush leaves is
    /// logged by the next `record` or `flush` that is due. Costs one atomic
    /// load when nothing is pending.
    pub(crate) fn flush(&self) -> Option<u64> {
        if self.pending.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = self.now();
        let last = self.last_flush.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < every() {
            return None;
        }
        self.last_flush
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        // A `record` from now on counts from this log.
        self.last.store(now, Ordering::Release);
        Some(self.pending.swap(0, Ordering::AcqRel)).filter(|&count| count > 0)
    }

    /// Microseconds since `base`, plus one (so 0 means never).
    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }
}

/// [`UNDECIDED_LOG_EVERY`] in microseconds.
fn every() -> u64 {
    u64::try_from(UNDECIDED_LOG_EVERY.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn undecided_passes_are_logged_at_most_once_per_second_with_their_count() {
        let log = UndecidedLog::new();
        assert_eq!(log.record(), Some(1), "the first pass is logged at once");
        for _ in 0..9 {
            assert_eq!(log.record(), None);
        }
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(log.record(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(log.record(), Some(11), "the ten since, and this one");
        assert_eq!(log.record(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_logs_what_is_pending_at_most_once_per_second() {
        let log = UndecidedLog::new();
        assert_eq!(log.flush(), None, "nothing pending");
        assert_eq!(log.record(), Some(1));
        assert_eq!(log.record(), None);
        assert_eq!(log.record(), None);
        assert_eq!(log.flush(), Some(2), "the two not logged yet");
        assert_eq!(log.flush(), None, "nothing pending");
        assert_eq!(log.record(), None, "a record right after a flush waits");
        assert_eq!(log.flush(), None, "a second flush within the second waits");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(log.flush(), Some(1), "what the waiting flush left");
    }

    #[tokio::test(start_paused = true)]
    async fn success_says_when_it_closes_an_open_breaker() {
        let breaker = Breaker::new(2, Duration::from_secs(1));
        assert!(!breaker.success());
        breaker.failure();
        assert!(!breaker.success(), "one failure did not open it");
        breaker.failure();
        breaker.failure();
        assert!(breaker.success(), "closed");
        assert!(!breaker.success());
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_threshold_then_probes_once() {
        let breaker = Breaker::new(3, Duration::from_secs(1));
        assert!(breaker.allow());
        assert!(!breaker.failure());
        assert!(!breaker.failure());
        assert!(breaker.allow());
        assert!(breaker.failure(), "the third failure opens it");
        assert!(!breaker.allow());
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!breaker.allow());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(breaker.allow(), "one probe");
        assert!(!breaker.allow(), "only one");
        breaker.success();
        assert!(breaker.allow());
        assert!(breaker.allow());
    }

    #[test]
    fn zero_threshold_never_opens() {
        let breaker = Breaker::new(0, Duration::from_secs(1));
        for _ in 0..100 {
            assert!(!breaker.failure());
        }
        assert!(breaker.allow());
        assert!(breaker.failing(), "an outage all the same");
        assert!(!breaker.success(), "no breaker to close");
        assert!(!breaker.failing());
    }
}
