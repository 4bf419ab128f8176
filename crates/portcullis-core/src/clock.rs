//! Time sources.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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
/// use portcullis::{Clock, SystemClock};
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

/// The system's wall clock, read cheaply: the CPU's timestamp counter
/// (through [`quanta`]) between re-readings of the [`SystemClock`], taken at
/// least every [`FastClock::RESYNC`] of elapsed time.
///
/// Reading [`SystemClock`] costs a `clock_gettime` call; this clock costs a
/// counter read and a multiplication. It is what
/// [`MemoryStore::new`](crate::MemoryStore::new) reads on every check. (In
/// `cargo xtask bench core`, the `+sys` column, the store reading
/// [`SystemClock`], is about 30 ns per check slower than with this clock
/// on the 2-core CI machine.)
///
/// It stays within the counter's calibration error of the system clock
/// (which accumulates for at most [`FastClock::RESYNC`]), and follows a
/// step of the system clock at the next re-reading. It never panics; a
/// re-reading may move it back by that error, which every algorithm
/// tolerates (an earlier time never admits more). Where the CPU has no
/// invariant timestamp counter, quanta reads the monotonic clock instead.
/// All `FastClock`s share one process-wide state, so they read the same.
///
/// ```
/// use portcullis::{Clock, FastClock, SystemClock};
///
/// let before = SystemClock.now_micros();
/// let now = FastClock.now_micros();
/// let after = SystemClock.now_micros();
/// // Within the counter's drift between two re-readings, far below a second.
/// assert!(now + 1_000_000 > before && now < after + 1_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FastClock;

impl FastClock {
    /// The most time between two re-readings of the [`SystemClock`].
    pub const RESYNC: Duration = Duration::from_millis(100);
}

impl Clock for FastClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        Counter::global().now_micros()
    }
}

/// The process-wide state behind [`FastClock`] (the memory store holds a
/// reference, so that reading it checks no `OnceLock`).
#[derive(Debug)]
pub(crate) struct Counter {
    clock: quanta::Clock,
    /// The counter's reading at creation; elapsed time is measured from it.
    origin: u64,
    /// Microseconds per 2^42 counter ticks, from quanta's calibration:
    /// elapsed time is one multiplication and a shift (quanta's own
    /// conversion gives nanoseconds, which would then be divided).
    micros_per_2_42_ticks: u64,
    /// Wall-clock microseconds minus elapsed microseconds (wrapping): the
    /// wall clock is `elapsed + offset`.
    offset_us: AtomicU64,
    /// Elapsed microseconds after which the next reading re-reads the
    /// system clock.
    resync_at_us: AtomicU64,
}

impl Counter {
    pub(crate) fn global() -> &'static Self {
        static COUNTER: OnceLock<Counter> = OnceLock::new();
        COUNTER.get_or_init(|| {
            let clock = quanta::Clock::new();
            let origin = clock.raw();
            // 2^42 ticks are over 10 minutes at 6 GHz: at least 2^29 µs,
            // so the rounding below is under 2 ppb.
            let micros_per_2_42_ticks = clock.delta_as_nanos(0, 1 << 42) / 1_000;
            let counter = Counter {
                clock,
                origin,
                micros_per_2_42_ticks,
                offset_us: AtomicU64::new(0),
                resync_at_us: AtomicU64::new(0),
            };
            counter.resync(0, 0);
            counter
        })
    }

    #[inline]
    pub(crate) fn now_micros(&self) -> u64 {
        // A counter behind its origin (never, with an invariant counter)
        // reads as the origin, as in quanta.
        let ticks = self.clock.raw().saturating_sub(self.origin);
        // Below 2^64 · 2^33 >> 42 = 2^55: the cast is exact.
        let elapsed_us =
            ((u128::from(ticks) * u128::from(self.micros_per_2_42_ticks)) >> 42) as u64;
        let resync_at_us = self.resync_at_us.load(Ordering::Relaxed);
        if elapsed_us >= resync_at_us {
            self.resync(elapsed_us, resync_at_us);
        }
        elapsed_us.wrapping_add(self.offset_us.load(Ordering::Relaxed))
    }

    /// Re-reads the system clock, unless another thread already does.
    #[cold]
    #[inline(never)]
    fn resync(&self, elapsed_us: u64, seen_resync_at_us: u64) {
        let next = elapsed_us.saturating_add(RESYNC_US);
        if self
            .resync_at_us
            .compare_exchange(
                seen_resync_at_us,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            let wall_us = SystemClock.now_micros();
            self.offset_us
                .store(wall_us.wrapping_sub(elapsed_us), Ordering::Relaxed);
        }
    }
}

/// [`FastClock::RESYNC`] in microseconds (100 000: the cast is exact).
const RESYNC_US: u64 = FastClock::RESYNC.as_micros() as u64;

/// A clock that moves only when told to; clones share one time. For tests.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{Clock, ManualClock};
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_clock_follows_the_system_clock_across_resyncs() {
        // Far beyond any counter drift over 100 ms, far below a unit
        // mistake (a reading in nanoseconds or milliseconds).
        const TOLERANCE_US: u64 = 50_000;
        let mut last = 0;
        for _ in 0..8 {
            let before = SystemClock.now_micros();
            let fast = FastClock.now_micros();
            let after = SystemClock.now_micros();
            assert!(
                fast + TOLERANCE_US >= before && fast <= after + TOLERANCE_US,
                "{fast} is not between {before} and {after}"
            );
            assert!(
                fast + TOLERANCE_US >= last,
                "went back from {last} to {fast}"
            );
            last = fast;
            // Past a re-synchronisation between readings.
            std::thread::sleep(FastClock::RESYNC / 2 + Duration::from_millis(10));
        }
    }
}
