//! Time sources.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// The default clock: the wall clock's time when the process first reads
/// it, carried forward by a monotonic clock, so that it never goes back and
/// never jumps when the system clock is stepped.
///
/// It is built on two parts. The *anchor* is one reading of the
/// [`SystemClock`], taken the first time any `FastClock` is read; from then
/// on, time moves only as the operating system's monotonic clock does
/// ([`std::time::Instant`]: `CLOCK_MONOTONIC` on Linux,
/// `mach_absolute_time` on macOS, `QueryPerformanceCounter` on Windows;
/// Rust guarantees it never decreases). So a backward step of the system
/// clock (a manual change, an NTP step after a suspend, a VM restored from
/// a snapshot) neither re-admits subjects that are at their limit nor holds
/// a subject denied for the length of the step, and a forward step does not
/// refill every bucket at once. NTP's gradual rate correction still reaches
/// it, through the monotonic clock.
///
/// Between readings of the monotonic clock, taken at least every
/// [`FastClock::RESYNC`] of elapsed time, it counts with the CPU's timestamp
/// counter (through [`quanta`]): a counter read and a multiplication
/// instead of a system call. (In `cargo xtask bench core`, the `+sys`
/// column, the store reading [`SystemClock`] on every check, is about 30 ns
/// per check slower on the 2-core CI machine.) Where the CPU has no
/// invariant timestamp counter, quanta reads the monotonic clock itself.
/// Each re-reading corrects the counter's calibration error accumulated
/// since the last (microseconds at most); a correction backwards is
/// absorbed by holding the reading where it was until the corrected time
/// passes it, so no reading is earlier than one taken before it (readers
/// racing the correction itself, on other threads, within the few
/// nanoseconds it takes to publish, aside).
///
/// What it gives up: after the system clock is stepped, this clock and the
/// wall clock disagree by the step until the process restarts. Fixed and
/// sliding windows then turn over at multiples of their period on this
/// clock rather than the corrected wall clock. Use [`SystemClock`] (through
/// `MemoryStore::builder().clock(…)`) to follow the wall clock instead.
/// All `FastClock`s share one process-wide state, so they read the same.
///
/// ```
/// use portcullis::{Clock, FastClock, SystemClock};
///
/// let before = SystemClock.now_micros();
/// let now = FastClock.now_micros();
/// let after = SystemClock.now_micros();
/// // Unless the system clock was stepped since the first reading, within
/// // the monotonic clock's drift from the wall clock: far below a second.
/// assert!(now + 1_000_000 > before && now < after + 1_000_000);
/// // Never backwards.
/// assert!(FastClock.now_micros() >= now);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FastClock;

impl FastClock {
    /// The most time between two readings of the monotonic clock.
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
///
/// A reading is `max(elapsed + offset, floor)`, where `elapsed` counts the
/// timestamp counter's ticks since `origin` in µs. Each re-synchronisation
/// sets the offset so that `elapsed + offset` equals `anchor + monotonic
/// elapsed`; when that moves it back, `floor` first takes the reading the
/// old offset gave, so readings stand still until the corrected time
/// passes it.
#[derive(Debug)]
pub(crate) struct Counter {
    clock: quanta::Clock,
    /// The counter's reading at creation; elapsed time is measured from it.
    origin: u64,
    /// Microseconds per 2^42 counter ticks, from quanta's calibration:
    /// elapsed time is one multiplication and a shift (quanta's own
    /// conversion gives nanoseconds, which would then be divided).
    micros_per_2_42_ticks: u64,
    /// The monotonic clock at creation.
    started: Instant,
    /// The wall clock at creation, in µs since the epoch.
    anchor_us: u64,
    /// The reading minus the counter's elapsed µs (wrapping).
    offset_us: AtomicU64,
    /// No reading is below this: the reading before a backward correction.
    floor_us: AtomicU64,
    /// Elapsed microseconds after which the next reading re-reads the
    /// monotonic clock.
    resync_at_us: AtomicU64,
}

impl Counter {
    pub(crate) fn global() -> &'static Self {
        static COUNTER: OnceLock<Counter> = OnceLock::new();
        COUNTER.get_or_init(|| Counter::anchored_at(SystemClock.now_micros()))
    }

    /// A counter whose time starts at `anchor_us` now.
    fn anchored_at(anchor_us: u64) -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        // 2^42 ticks are over 10 minutes at 6 GHz: at least 2^29 µs,
        // so the rounding below is under 2 ppb.
        let micros_per_2_42_ticks = clock.delta_as_nanos(0, 1 << 42) / 1_000;
        Counter {
            clock,
            origin,
            micros_per_2_42_ticks,
            started: Instant::now(),
            anchor_us,
            offset_us: AtomicU64::new(anchor_us),
            floor_us: AtomicU64::new(0),
            resync_at_us: AtomicU64::new(RESYNC_US),
        }
    }

    /// The counter's elapsed µs since its origin.
    #[inline]
    fn elapsed_us(&self) -> u64 {
        // A counter behind its origin (never, with an invariant counter)
        // reads as the origin, as in quanta.
        let ticks = self.clock.raw().saturating_sub(self.origin);
        // Below 2^64 · 2^33 >> 42 = 2^55: the cast is exact.
        ((u128::from(ticks) * u128::from(self.micros_per_2_42_ticks)) >> 42) as u64
    }

    #[inline]
    pub(crate) fn now_micros(&self) -> u64 {
        let elapsed_us = self.elapsed_us();
        let resync_at_us = self.resync_at_us.load(Ordering::Relaxed);
        if elapsed_us >= resync_at_us {
            self.resync(elapsed_us, resync_at_us);
        }
        // Acquire: a reader that sees a corrected offset sees its floor.
        let reading = elapsed_us.wrapping_add(self.offset_us.load(Ordering::Acquire));
        reading.max(self.floor_us.load(Ordering::Relaxed))
    }

    /// Re-reads the monotonic clock, unless another thread already does.
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
            let monotonic_us =
                u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
            let target = self.anchor_us.saturating_add(monotonic_us);
            // The counter read again after the monotonic clock: a reader
            // still on the old offset reads at most a few ns past `before`.
            let elapsed_us = self.elapsed_us();
            let old_offset = self.offset_us.load(Ordering::Relaxed);
            let before = elapsed_us.wrapping_add(old_offset);
            if target < before {
                self.floor_us.fetch_max(before, Ordering::Relaxed);
            }
            self.offset_us
                .store(target.wrapping_sub(elapsed_us), Ordering::Release);
        }
    }
}

/// [`FastClock::RESYNC`] in microseconds (100 000: the cast is exact).
const RESYNC_US: u64 = FastClock::RESYNC.as_micros() as u64;

/// Any clock's time at creation, carried forward by the monotonic clock
/// ([`std::time::Instant`]): it reads `source` once, in [`new`](Self::new),
/// and never again, so steps of that clock after it cannot reach the
/// stores. [`FastClock`] is this, on the [`SystemClock`], read through the
/// timestamp counter.
///
/// Use it to give a store a clock of your own that must not go back, or in
/// a test, to show that a step of the wall clock changes no decision:
///
/// ```
/// use std::time::Duration;
/// use portcullis::{Clock, ManualClock, MemoryStore, MonotonicClock, Policy, Store};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let wall = ManualClock::new(1_700_000_000_000_000);
/// let store = MemoryStore::builder().clock(MonotonicClock::new(&wall)).build();
/// let policies = [Policy::per_minute(1).name("api").build()?];
/// assert!(store.check("acme", &policies, 1).await?.is_allowed());
///
/// wall.set(1_700_000_000_000_000 - 3_600_000_000); // an hour back
/// let denied = store.check("acme", &policies, 1).await?;
/// // Still the policy's minute at most, not an hour more.
/// assert!(denied.retry_after().is_some_and(|r| r <= Duration::from_secs(60)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    anchor_us: u64,
    started: Instant,
}

impl MonotonicClock {
    /// Reads `source` now, and from then on counts on the monotonic clock.
    #[must_use]
    pub fn new(source: &impl Clock) -> Self {
        Self {
            anchor_us: source.now_micros(),
            started: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now_micros(&self) -> u64 {
        let elapsed = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.anchor_us.saturating_add(elapsed)
    }
}

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
    fn fast_clock_follows_the_monotonic_clock_across_resyncs_and_never_goes_back() {
        // Far beyond any counter drift over 100 ms, far below a unit
        // mistake (a reading in nanoseconds or milliseconds).
        const TOLERANCE_US: u64 = 50_000;
        let counter = Counter::anchored_at(1_000_000_000);
        let started = Instant::now();
        let mut last = 0;
        for _ in 0..8 {
            for _ in 0..1_000 {
                let now = counter.now_micros();
                assert!(now >= last, "went back from {last} to {now}");
                last = now;
            }
            let expected = 1_000_000_000 + u64::try_from(started.elapsed().as_micros()).unwrap();
            assert!(
                last + TOLERANCE_US >= expected && last <= expected + TOLERANCE_US,
                "{last} is not near {expected}"
            );
            // Past a re-synchronisation between readings.
            std::thread::sleep(FastClock::RESYNC / 2 + Duration::from_millis(10));
        }
    }

    #[test]
    fn a_backward_correction_holds_the_reading_instead_of_going_back() {
        let counter = Counter::anchored_at(5_000_000);
        let first = counter.now_micros();
        // The counter runs a second ahead of the monotonic clock; the next
        // re-synchronisation corrects it by a second backwards.
        counter.offset_us.fetch_add(1_000_000, Ordering::Relaxed);
        let ahead = counter.now_micros();
        assert!(ahead >= first + 1_000_000);
        let seen = counter.resync_at_us.load(Ordering::Relaxed);
        counter.resync(counter.elapsed_us().max(seen), seen);
        let after = counter.now_micros();
        assert!(after >= ahead, "went back from {ahead} to {after}");
        // Corrected underneath: the offset is back near the anchor's.
        assert!(counter.offset_us.load(Ordering::Relaxed) < 5_000_000 + 500_000);
    }

    #[test]
    fn a_monotonic_clock_ignores_its_source_after_creation() {
        let wall = ManualClock::new(10_000_000);
        let clock = MonotonicClock::new(&wall);
        let first = clock.now_micros();
        wall.set(0);
        let after_back = clock.now_micros();
        wall.set(u64::MAX);
        let after_forward = clock.now_micros();
        assert!(first >= 10_000_000 && after_back >= first && after_forward >= after_back);
        // Only real elapsed time moved it: far less than the steps.
        assert!(after_forward < 10_000_000 + 60_000_000);
    }
}
