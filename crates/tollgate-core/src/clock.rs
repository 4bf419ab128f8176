//! Time sources.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in microseconds since the Unix epoch.
///
/// Algorithms never read a clock themselves: a store reads one and passes the
/// time in. Fixed and sliding windows align to multiples of the period since
/// the epoch, which is why this is wall-clock time rather than an `Instant`.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Microseconds since 1970-01-01T00:00:00Z.
    fn now_micros(&self) -> u64;
}

/// The system's wall clock.
///
/// ```
/// use tollgate_core::{Clock, SystemClock};
/// assert!(SystemClock.now_micros() > 1_600_000_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        // A clock set before 1970 reads as the epoch rather than panicking.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to; clones share one time. For tests.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000_000);
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(shared.now_micros(), 2_500_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_micros` microseconds since the epoch.
    #[must_use]
    pub fn new(now_micros: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(now_micros)),
        }
    }

    /// Moves the clock forward (saturating at `u64::MAX`).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Sets the clock to `now_micros`, forwards or backwards.
    pub fn set(&self, now_micros: u64) {
        self.now.store(now_micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }
}
