//! [`ClockMode`]: where a store reads the time (Redis's `TIME`, or a
//! client clock), and the two clocks derived from it: the time argument a
//! call passes, and the local budget's clock.

use std::fmt;
use std::sync::Arc;

use portcullis_core::Clock;

/// Where a [`RedisStore`](crate::RedisStore) reads the time.
///
/// A client clock must agree with Redis's: keys expire on Redis's clock at
/// the times the client computed, so a clock behind Redis's writes keys
/// that are already expired and the limiter admits everything.
/// [`build`](crate::RedisStoreBuilder::build) compares a client clock with
/// Redis's `TIME` and refuses one further than
/// [`client_clock_tolerance`](crate::RedisStoreBuilder::client_clock_tolerance)
/// (one second by default).
///
/// ```
/// use std::sync::Arc;
/// use portcullis::{Clock, ManualClock, SystemClock};
/// use portcullis::redis::ClockMode;
///
/// let production = ClockMode::Redis; // the default
/// // A test clock starts at the wall clock's time (which NTP keeps close
/// // to Redis's), never at a fixed date: `build()` would refuse it.
/// let tests = ClockMode::Client(Arc::new(ManualClock::new(SystemClock.now_micros())));
/// assert!(matches!(production, ClockMode::Redis));
/// assert!(matches!(tests, ClockMode::Client(_)));
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ClockMode {
    /// The script reads Redis' `TIME` (the default): every app instance sees
    /// one clock, whatever its own clock says. Scripts that read `TIME` and
    /// then write need effect replication (the default since Redis 5), and
    /// a write is one `SET … PXAT` (Redis 6.2), so the store needs Redis 6.2
    /// or later, as the crate docs say.
    #[default]
    Redis,
    /// The time comes from this clock, read by the client at each call. For
    /// tests (with a [`ManualClock`](portcullis_core::ManualClock)) and for
    /// setups whose clocks are known to agree.
    ///
    /// Keys still expire on Redis' clock, at the client's `expires_at`
    /// (`PXAT`): a client clock that lags Redis' makes keys expire early
    /// (the limiter then forgets and admits more; far behind, it admits
    /// everything), one that runs ahead keeps them longer than needed. So
    /// `build()` refuses a clock further from Redis's `TIME` than
    /// [`client_clock_tolerance`](crate::RedisStoreBuilder::client_clock_tolerance);
    /// a test clock moved far from the wall clock on purpose takes
    /// `client_clock_tolerance(Duration::MAX)`. The check runs once: a
    /// [`ManualClock`](portcullis_core::ManualClock) stands still while
    /// Redis's clock moves on.
    Client(Arc<dyn Clock>),
}

impl fmt::Debug for ClockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redis => f.write_str("Redis"),
            Self::Client(clock) => f.debug_tuple("Client").field(clock).finish(),
        }
    }
}

impl ClockMode {
    /// The time a call passes: `None` for Redis `TIME`, else the client
    /// clock's now, in microseconds.
    pub(crate) fn call_time(&self) -> Option<u64> {
        match self {
            Self::Redis => None,
            Self::Client(clock) => Some(clock.now_micros()),
        }
    }

    /// The local budget's clock, in µs: the client clock in
    /// [`ClockMode::Client`] (so that grants end in the time the scripts
    /// charge in), else a monotonic clock of this process.
    pub(crate) fn budget_time(&self) -> u64 {
        match self {
            Self::Client(clock) => clock.now_micros(),
            Self::Redis => {
                static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
                let epoch = EPOCH.get_or_init(std::time::Instant::now);
                u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
            }
        }
    }
}
