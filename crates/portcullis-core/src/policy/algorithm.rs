//! The algorithms a policy may use ([`Algorithm`], [`LeakyMode`]): their
//! names and which take a burst. What each computes is in
//! `crate::algorithms`.

use std::fmt;

/// How a leaky bucket treats a request that fits in the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeakyMode {
    /// Admit at once while the bucket has room, reject when it is full.
    Meter,
    /// Admit while the queue has room and report in
    /// [`Decision::delay`](crate::Decision::delay) how long the request must
    /// wait for its turn; reject when the queue is full.
    Queue,
}

/// The algorithm a [`Policy`](crate::Policy) uses.
///
/// | algorithm | state per key | pick it when |
/// |---|---|---|
/// | `Gcra` (default) | one timestamp | a smooth rate with a burst; the cheapest; redis-cell compatible |
/// | `TokenBucket` | tokens and a time | you think in tokens refilled over time (the same decisions as GCRA) |
/// | `LeakyBucket(Meter)` | a level and a time | a bucket that rejects when full |
/// | `LeakyBucket(Queue)` | one timestamp | smoothing: admit, and say how long to wait ([`Decision::delay`](crate::Decision::delay)) |
/// | `FixedWindow` | one counter | "N per calendar minute or day": quotas that reset at a known time; up to 2N across a boundary |
/// | `SlidingWindow` | two counters | window semantics without the boundary burst (an estimate) |
/// | `SlidingLog` | one entry per permit | an exact rolling window for small limits (at most [`SLIDING_LOG_MAX_LIMIT`](crate::SLIDING_LOG_MAX_LIMIT)) |
///
/// ```
/// use portcullis::{Algorithm, Policy};
///
/// let daily = Policy::per_day(10_000).algorithm(Algorithm::FixedWindow).build()?;
/// assert_eq!(daily.algorithm(), Algorithm::FixedWindow);
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm (the default): one timestamp per key,
    /// smooth rate with an optional burst, denials write nothing.
    #[default]
    Gcra,
    /// Token bucket: `burst` tokens, refilled at `limit` per `period`.
    TokenBucket,
    /// Leaky bucket of `burst` capacity draining `limit` per `period`.
    LeakyBucket(LeakyMode),
    /// At most `limit` per window; windows aligned to multiples of `period`
    /// since the Unix epoch.
    FixedWindow,
    /// Two-counter estimate of a window sliding over time.
    SlidingWindow,
    /// Exact log of admitted permits; at most [`SLIDING_LOG_MAX_LIMIT`](crate::SLIDING_LOG_MAX_LIMIT).
    SlidingLog,
}

impl Algorithm {
    /// Every algorithm, the leaky bucket in both modes.
    pub const ALL: [Self; 7] = [
        Self::Gcra,
        Self::TokenBucket,
        Self::LeakyBucket(LeakyMode::Meter),
        Self::LeakyBucket(LeakyMode::Queue),
        Self::FixedWindow,
        Self::SlidingWindow,
        Self::SlidingLog,
    ];

    /// A short, stable name: `gcra`, `token_bucket`, `leaky_meter`,
    /// `leaky_queue`, `fixed_window`, `sliding_window`, `sliding_log`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Gcra => "gcra",
            Self::TokenBucket => "token_bucket",
            Self::LeakyBucket(LeakyMode::Meter) => "leaky_meter",
            Self::LeakyBucket(LeakyMode::Queue) => "leaky_queue",
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingLog => "sliding_log",
        }
    }

    /// The algorithm named `name`: one of [`as_str`](Self::as_str)'s
    /// names, or `leaky_bucket` (the meter). What limits files and the
    /// Envoy service's configuration read.
    ///
    /// ```
    /// use portcullis::{Algorithm, LeakyMode};
    ///
    /// assert_eq!(Algorithm::from_name("sliding_log"), Some(Algorithm::SlidingLog));
    /// assert_eq!(Algorithm::from_name("leaky_bucket"), Some(Algorithm::LeakyBucket(LeakyMode::Meter)));
    /// assert_eq!(Algorithm::from_name("GCRA"), None);
    /// ```
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == name)
            .or(match name {
                "leaky_bucket" => Some(Self::LeakyBucket(LeakyMode::Meter)),
                _ => None,
            })
    }

    /// Whether the algorithm has a burst (bucket capacity) separate from its
    /// limit.
    #[must_use]
    pub const fn has_burst(self) -> bool {
        matches!(self, Self::Gcra | Self::TokenBucket | Self::LeakyBucket(_))
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
