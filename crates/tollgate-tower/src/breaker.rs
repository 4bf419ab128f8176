//! A circuit breaker in front of the store: after repeated failures, stop
//! asking for a short pause so requests do not each wait out the timeout.

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

    pub(crate) fn success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failure; returns whether this one opened the breaker.
    pub(crate) fn failure(&self) -> bool {
        if self.threshold == 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
