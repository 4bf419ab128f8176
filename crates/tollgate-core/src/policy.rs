//! Policies: what is limited, how fast, and with which algorithm.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Largest product of two policy magnitudes (for example `limit × period` in
/// microseconds) that a policy may reach.
///
/// Every algorithm works in integer microseconds. The Redis scripts run in
/// Lua, whose numbers are IEEE doubles and exact only up to 2^53; keeping every
/// product below 2^52 leaves room for a timestamp on top, so the in-memory and
/// Redis stores compute bit-identical results.
pub const MAX_MAGNITUDE: u64 = 1 << 52;

/// Largest limit a [`Algorithm::SlidingLog`] policy accepts.
///
/// A sliding log remembers every admitted permit until it leaves the window, so
/// its memory grows with the limit. Above this cap, use
/// [`Algorithm::SlidingWindow`] (two counters) or [`Algorithm::Gcra`] (one
/// integer) instead.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 10_000;

/// Longest policy name accepted by [`PolicyBuilder::name`].
pub const MAX_POLICY_NAME_LEN: usize = 64;

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

/// The algorithm a [`Policy`] uses. See the crate docs for when to pick which.
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
    /// Exact log of admitted permits; at most [`SLIDING_LOG_MAX_LIMIT`].
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

/// A validated rate-limiting policy: a name, an algorithm, a limit per period
/// and, for bucket algorithms, a burst.
///
/// Build one with [`Policy::per_second`], [`Policy::per_minute`],
/// [`Policy::per_hour`], [`Policy::per_day`] or [`Policy::per`]; they read as
/// people speak, so `per_second(10)` is ten per second.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Algorithm, Policy};
///
/// // 10 per second, up to 20 at once, with the default algorithm (GCRA).
/// let api = Policy::per_second(10).burst(20).name("api").build()?;
/// assert_eq!(api.limit(), 10);
/// assert_eq!(api.capacity(), 20);
///
/// // 1000 per day in fixed windows aligned to midnight UTC.
/// let daily = Policy::per_day(1000)
///     .algorithm(Algorithm::FixedWindow)
///     .name("daily")
///     .build()?;
/// assert_eq!(daily.period(), Duration::from_secs(86_400));
///
/// // Invalid values are refused with an error naming the field.
/// let err = Policy::per_second(0).build().unwrap_err();
/// assert!(err.to_string().contains("limit"));
/// # Ok::<(), tollgate_core::PolicyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    name: Arc<str>,
    algorithm: Algorithm,
    limit: u64,
    period_us: u64,
    burst: Option<u64>,
    /// `period_us / limit` when that is a whole number of microseconds,
    /// else 0 (derived from the fields above; the memory store's GCRA hot
    /// path needs no division with it).
    interval_us: u64,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &&*self.name)
            .field("algorithm", &self.algorithm)
            .field("limit", &self.limit)
            .field("period", &self.period())
            .field("burst", &self.burst)
            .finish()
    }
}

impl Policy {
    /// `limit` per second.
    pub fn per_second(limit: u64) -> PolicyBuilder {
        Self::per(limit, Duration::from_secs(1))
    }

    /// `limit` per minute.
    pub fn per_minute(limit: u64) -> PolicyBuilder {
        Self::per(limit, Duration::from_secs(60))
    }

    /// `limit` per hour.
    pub fn per_hour(limit: u64) -> PolicyBuilder {
        Self::per(limit, Duration::from_secs(3_600))
    }

    /// `limit` per day (86 400 seconds).
    pub fn per_day(limit: u64) -> PolicyBuilder {
        Self::per(limit, Duration::from_secs(86_400))
    }

    /// `limit` per `period`. The period must be a whole number of
    /// microseconds, at least one.
    pub fn per(limit: u64, period: Duration) -> PolicyBuilder {
        PolicyBuilder {
            name: None,
            algorithm: Algorithm::default(),
            limit,
            period,
            burst: None,
        }
    }

    /// The policy's name, used in Redis keys and in `RateLimit-Policy`
    /// headers.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The time between two permits in whole microseconds, when it is one.
    pub(crate) const fn whole_interval_micros(&self) -> Option<u64> {
        if self.interval_us == 0 {
            None
        } else {
            Some(self.interval_us)
        }
    }

    /// The name, shared: the memory store keeps this `Arc` rather than a
    /// copy, and compares names by pointer first.
    pub(crate) fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// The algorithm.
    #[must_use]
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Permits per period (the rate, or the window's limit).
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    #[must_use]
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds.
    #[must_use]
    pub const fn period_micros(&self) -> u64 {
        self.period_us
    }

    /// The burst set with [`PolicyBuilder::burst`], if any.
    #[must_use]
    pub const fn burst(&self) -> Option<u64> {
        self.burst
    }

    /// The most permits the policy can ever admit at once: the burst for
    /// bucket algorithms (defaulting to the limit), the limit for window
    /// algorithms. A cost above this is an error, never a silent denial.
    #[must_use]
    pub const fn capacity(&self) -> u64 {
        match self.burst {
            Some(burst) => burst,
            None => self.limit,
        }
    }
}

/// Builder for a [`Policy`]; finish with [`PolicyBuilder::build`].
#[derive(Debug, Clone)]
#[must_use = "a PolicyBuilder does nothing until .build() is called"]
pub struct PolicyBuilder {
    name: Option<String>,
    algorithm: Algorithm,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
}

impl PolicyBuilder {
    /// Names the policy: 1 to 64 ASCII letters, digits, `_`, `-` or `.`.
    /// Without a name the policy is called after its algorithm, limit and
    /// period, for example `gcra-10-per-1s`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Chooses the algorithm (default [`Algorithm::Gcra`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Sets the burst (bucket capacity) of a bucket algorithm: how many
    /// permits may be taken at once after an idle spell. Defaults to the
    /// limit. Window algorithms have no burst and refuse one.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Validates the policy.
    ///
    /// # Errors
    ///
    /// A [`PolicyError`] naming the field when the limit, period or burst is
    /// zero, when a window algorithm is given a burst, when a sliding log's
    /// limit is above [`SLIDING_LOG_MAX_LIMIT`], when the period is not a
    /// whole number of microseconds, when a product of the values exceeds
    /// [`MAX_MAGNITUDE`], or when the name is empty, too long or uses other
    /// characters than ASCII letters, digits, `_`, `-` and `.`.
    pub fn build(self) -> Result<Policy, PolicyError> {
        let Self {
            name,
            algorithm,
            limit,
            period,
            burst,
        } = self;
        if limit == 0 {
            return Err(PolicyError::ZeroLimit);
        }
        if period.is_zero() {
            return Err(PolicyError::ZeroPeriod);
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(PolicyError::SubMicrosecondPeriod { period });
        }
        let period_us = u64::try_from(period.as_micros())
            .ok()
            .filter(|p| *p < MAX_MAGNITUDE)
            .ok_or(PolicyError::TooLarge {
                field: "period",
                detail: "the period in microseconds must stay below 2^52 (about 142 years)",
            })?;
        if let Some(burst) = burst {
            if !algorithm.has_burst() {
                return Err(PolicyError::BurstNotSupported { algorithm });
            }
            if burst == 0 {
                return Err(PolicyError::ZeroBurst);
            }
        }
        if algorithm == Algorithm::SlidingLog && limit > SLIDING_LOG_MAX_LIMIT {
            return Err(PolicyError::SlidingLogLimit { limit });
        }
        let capacity = burst.unwrap_or(limit);
        if limit
            .checked_mul(period_us)
            .is_none_or(|p| p > MAX_MAGNITUDE)
        {
            return Err(PolicyError::TooLarge {
                field: "limit",
                detail: "limit × period in microseconds must not exceed 2^52; use a shorter period with a proportionally smaller limit",
            });
        }
        if capacity
            .checked_mul(period_us)
            .is_none_or(|p| p > MAX_MAGNITUDE)
        {
            return Err(PolicyError::TooLarge {
                field: "burst",
                detail: "burst × period in microseconds must not exceed 2^52; use a smaller burst",
            });
        }
        let name = match name {
            Some(name) => {
                validate_name(&name)?;
                name
            }
            None => default_name(algorithm, limit, period_us),
        };
        Ok(Policy {
            name: name.into(),
            algorithm,
            limit,
            period_us,
            burst,
            // `limit` is at least 1 here.
            interval_us: if period_us % limit == 0 {
                period_us / limit
            } else {
                0
            },
        })
    }
}

fn validate_name(name: &str) -> Result<(), PolicyError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_POLICY_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(PolicyError::InvalidName {
            name: name.chars().take(80).collect(),
        })
    }
}

fn default_name(algorithm: Algorithm, limit: u64, period_us: u64) -> String {
    let period = if period_us.is_multiple_of(86_400_000_000) {
        format!("{}d", period_us / 86_400_000_000)
    } else if period_us.is_multiple_of(3_600_000_000) {
        format!("{}h", period_us / 3_600_000_000)
    } else if period_us.is_multiple_of(60_000_000) {
        format!("{}m", period_us / 60_000_000)
    } else if period_us.is_multiple_of(1_000_000) {
        format!("{}s", period_us / 1_000_000)
    } else if period_us.is_multiple_of(1_000) {
        format!("{}ms", period_us / 1_000)
    } else {
        format!("{period_us}us")
    };
    format!(
        "{}-{limit}-per-{period}",
        algorithm.as_str().replace('_', "-")
    )
}

/// Why a policy could not be built. Each message names the field and says
/// what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The limit was zero.
    ZeroLimit,
    /// The period was zero.
    ZeroPeriod,
    /// The burst was zero.
    ZeroBurst,
    /// The period had a fraction of a microsecond.
    SubMicrosecondPeriod {
        /// The period given.
        period: Duration,
    },
    /// A window algorithm was given a burst.
    BurstNotSupported {
        /// The algorithm.
        algorithm: Algorithm,
    },
    /// A sliding log's limit was above [`SLIDING_LOG_MAX_LIMIT`].
    SlidingLogLimit {
        /// The limit given.
        limit: u64,
    },
    /// A value, or a product of values, was too large to compute exactly.
    TooLarge {
        /// The field to change.
        field: &'static str,
        /// The bound that was crossed.
        detail: &'static str,
    },
    /// The name was empty, too long, or had characters other than ASCII
    /// letters, digits, `_`, `-` and `.`.
    InvalidName {
        /// The name given (at most 80 characters of it).
        name: String,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroLimit => f.write_str("policy limit is 0: a policy must admit at least 1 permit per period (to block everything, do not route to the service)"),
            Self::ZeroPeriod => f.write_str("policy period is 0: give a period of at least 1 microsecond"),
            Self::ZeroBurst => f.write_str("policy burst is 0: give a burst of at least 1, or leave it unset to default to the limit"),
            Self::SubMicrosecondPeriod { period } => write!(f, "policy period {period:?} has a fraction of a microsecond: give a whole number of microseconds"),
            Self::BurstNotSupported { algorithm } => write!(f, "policy burst is not supported by {algorithm}: window algorithms admit `limit` per window; remove .burst(..) or choose gcra, token_bucket or leaky_bucket"),
            Self::SlidingLogLimit { limit } => write!(f, "policy limit {limit} is above the sliding log's cap of {SLIDING_LOG_MAX_LIMIT}: the log keeps one entry per permit; use sliding_window or gcra for large limits"),
            Self::TooLarge { field, detail } => write!(f, "policy {field} is too large: {detail}"),
            Self::InvalidName { name } => write!(f, "policy name {name:?} is invalid: use 1 to {MAX_POLICY_NAME_LEN} ASCII letters, digits, '_', '-' or '.'"),
        }
    }
}

impl std::error::Error for PolicyError {}
