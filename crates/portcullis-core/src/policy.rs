//! Policies: what is limited, how fast, and with which algorithm.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Largest magnitude any integer an algorithm keeps may reach: the limit, the
/// burst, the period in microseconds, and every product the arithmetic forms
/// (for example `burst × period` for a bucket).
///
/// Every algorithm works in integers. The Redis scripts run in Lua, whose
/// numbers are IEEE doubles and exact only up to 2^53; keeping every product
/// at most 2^52 leaves room for a sum of two, so the in-memory and Redis
/// stores compute bit-identical results. Larger quotas are still accepted:
/// a bucket rounds its emission interval up, and a sliding window weighs
/// in a coarser time unit, as `ALGORITHMS.md` ("Magnitudes") describes.
pub const MAX_MAGNITUDE: u64 = 1 << 52;

/// The smallest emission-interval numerator a bucket policy whose
/// `burst × period` passes [`MAX_MAGNITUDE`] may round to: its rate is then
/// lowered by less than one part in `MIN_ROUNDED_INCREMENT` (0.0016 %),
/// never raised.
pub(crate) const MIN_ROUNDED_INCREMENT: u64 = 1 << 16;

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

/// The algorithm a [`Policy`] uses.
///
/// | algorithm | state per key | pick it when |
/// |---|---|---|
/// | `Gcra` (default) | one timestamp | a smooth rate with a burst; the cheapest; redis-cell compatible |
/// | `TokenBucket` | tokens and a time | you think in tokens refilled over time (the same decisions as GCRA) |
/// | `LeakyBucket(Meter)` | a level and a time | a bucket that rejects when full |
/// | `LeakyBucket(Queue)` | one timestamp | smoothing: admit, and say how long to wait ([`Decision::delay`](crate::Decision::delay)) |
/// | `FixedWindow` | one counter | "N per calendar minute or day": quotas that reset at a known time; up to 2N across a boundary |
/// | `SlidingWindow` | two counters | window semantics without the boundary burst (an estimate) |
/// | `SlidingLog` | one entry per permit | an exact rolling window for small limits (at most [`SLIDING_LOG_MAX_LIMIT`]) |
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
/// use portcullis::{Algorithm, Policy};
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
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    name: Arc<str>,
    algorithm: Algorithm,
    limit: u64,
    period_us: u64,
    burst: Option<u64>,
    /// `burst` or else `limit` (read on every check).
    capacity: u64,
    /// Bucket algorithms: time is counted in units of `1 / scale` µs and a
    /// permit costs `increment` units (`scale = limit`, `increment = period`
    /// when exact). Window algorithms: `scale = limit`,
    /// `increment = period`, unused.
    scale: u64,
    increment: u64,
    /// Sliding window: the unit (µs, a power of ten dividing the period) in
    /// which the previous window's weight is counted; 1 when exact.
    weight_unit_us: u64,
    /// Derived from the fields above: what the memory store's GCRA hot
    /// path needs so that it divides by nothing.
    gcra: GcraConsts,
    /// Priority classes and their reserves (`classes.rs`).
    pub(crate) classes: crate::classes::Classes,
}

/// A bucket policy's magnitudes split into whole microseconds and
/// remainders in units of `1 / scale` µs (ALGORITHMS.md, "MemoryStore's
/// GCRA fast path"), computed once when the policy is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct GcraConsts {
    /// `increment / scale`: the emission interval's whole microseconds.
    pub(crate) interval_us: u64,
    /// `increment % scale`: its fraction, in units.
    pub(crate) interval_rem: u64,
    /// `full = capacity × increment` (at most 2^52 for a bucket policy).
    pub(crate) full: u64,
    /// `full / scale` and `full % scale`.
    pub(crate) full_us: u64,
    pub(crate) full_rem: u64,
    /// `ceil(full / scale)` and the clock tolerance beyond it,
    /// `max(ceil(full / scale), 1 s)`: a TAT further ahead than their sum
    /// is clamped by the reference.
    pub(crate) full_ceil_us: u64,
    pub(crate) tolerance_us: u64,
}

impl GcraConsts {
    fn of(scale: u64, increment: u64, capacity: u64) -> Self {
        // `scale` is at least 1; the product saturates only for policies
        // that are not buckets (which never use these).
        let full = capacity.saturating_mul(increment);
        let full_ceil_us = full.div_ceil(scale);
        Self {
            interval_us: increment / scale,
            interval_rem: increment % scale,
            full,
            full_us: full / scale,
            full_rem: full % scale,
            full_ceil_us,
            tolerance_us: full_ceil_us.max(1_000_000),
        }
    }
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
            classes: Vec::new(),
            default_class: None,
        }
    }

    /// The policy's name, used in Redis keys and in `RateLimit-Policy`
    /// headers.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The GCRA fast path's precomputed magnitudes.
    #[inline(always)]
    pub(crate) const fn gcra_consts(&self) -> &GcraConsts {
        &self.gcra
    }

    /// How the bucket algorithms (GCRA, token bucket, leaky bucket) count
    /// time: `(scale, increment)`, meaning one permit takes `increment /
    /// scale` microseconds. When [`Policy::is_exact`] this is `(limit,
    /// period)`, exactly `period / limit`; otherwise the interval is rounded
    /// up (ALGORITHMS.md, "Magnitudes"), lowering the rate by less than one
    /// part in `increment`. Window algorithms return `(limit, period)`.
    ///
    /// Public as [`algorithms::emission_interval`](crate::algorithms::emission_interval).
    #[must_use]
    pub(crate) const fn emission_interval(&self) -> (u64, u64) {
        (self.scale, self.increment)
    }

    /// The unit, in microseconds, in which a sliding window weighs its
    /// previous window: 1 when exact, else the smallest power of ten that
    /// divides the period and keeps `limit × period / unit` within
    /// [`MAX_MAGNITUDE`] (the weight is then rounded up, never down). 1 for
    /// other algorithms.
    /// Public as [`algorithms::weight_unit_micros`](crate::algorithms::weight_unit_micros).
    #[must_use]
    pub(crate) const fn weight_unit_micros(&self) -> u64 {
        self.weight_unit_us
    }

    /// Whether every figure is computed without rounding: a bucket whose
    /// `burst × period` and a sliding window whose `limit × period` are at
    /// most [`MAX_MAGNITUDE`], and every fixed window and sliding log.
    /// Otherwise a bucket's emission interval is rounded up (never admitting
    /// more than the limit; the rate is lower by less than one part in
    /// 65 536) and a sliding window weighs in a coarser unit (ALGORITHMS.md,
    /// "Magnitudes").
    ///
    /// ```
    /// use portcullis::Policy;
    ///
    /// assert!(Policy::per_second(3).build()?.is_exact());
    /// // u32::MAX per day: about 20.1 µs per permit, rounded up.
    /// assert!(!Policy::per_day(u64::from(u32::MAX)).build()?.is_exact());
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn is_exact(&self) -> bool {
        self.scale == self.limit && self.increment == self.period_us && self.weight_unit_us == 1
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

    /// Permits per period, as the policy was built (`per_second(10)`: 10):
    /// the rate of a bucket algorithm (GCRA, token and leaky bucket), the
    /// limit per window of a window algorithm.
    ///
    /// A [`Decision::limit`](crate::Decision::limit) reports
    /// [`capacity`](Self::capacity) instead, the most permits admitted at
    /// once (the size of the bucket or window its `remaining` counts down
    /// from): for a bucket with a [`burst`](Self::burst) that is the burst,
    /// not this rate.
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
        self.capacity
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
    /// Priority classes as given: name and reserve in percent (`classes.rs`).
    pub(crate) classes: Vec<(String, u8)>,
    /// The class of a request that names none, or one the policy does not
    /// define (`classes.rs`); `None`: the most reserved class.
    pub(crate) default_class: Option<String>,
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
    /// whole number of microseconds, when a value is too large for the
    /// algorithm to compute exactly (ALGORITHMS.md, "Magnitudes": the
    /// error names the policy and the largest value accepted), or when the
    /// name is empty, too long or uses other characters than ASCII letters,
    /// digits, `_`, `-` and `.`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::Policy;
    ///
    /// // Quotas as they are sold: a million a day, 10^9 per 30 days.
    /// let daily = Policy::per_day(1_000_000).name("daily").build()?;
    /// let monthly = Policy::per(1_000_000_000, Duration::from_secs(30 * 86_400)).build()?;
    /// assert_eq!((daily.limit(), monthly.capacity()), (1_000_000, 1_000_000_000));
    ///
    /// // Out of range: the error names the policy and what would fit.
    /// let err = Policy::per_second(1 << 40).name("burst").build().unwrap_err();
    /// assert!(err.to_string().starts_with("policy \"burst\": limit"));
    /// assert!(err.to_string().contains("the largest limit accepted is"));
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    pub fn build(self) -> Result<Policy, PolicyError> {
        let Self {
            name,
            algorithm,
            limit,
            period,
            burst,
            classes,
            default_class,
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
        if let Some(burst) = burst {
            if !algorithm.has_burst() {
                return Err(PolicyError::BurstNotSupported { algorithm });
            }
            if burst == 0 {
                return Err(PolicyError::ZeroBurst);
            }
        }
        // Named first, so that a size error can say which policy it is.
        let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        let name = match name {
            Some(name) => {
                validate_name(&name)?;
                name
            }
            None => default_name(algorithm, limit, period_us),
        };
        let too_large = |field: &'static str, value: u64, max: u64| PolicyError::TooLarge {
            policy: name.clone(),
            algorithm,
            field,
            value,
            max,
        };
        if period_us >= MAX_MAGNITUDE {
            return Err(too_large("period", period_us, MAX_MAGNITUDE - 1));
        }
        if algorithm == Algorithm::SlidingLog && limit > SLIDING_LOG_MAX_LIMIT {
            return Err(PolicyError::SlidingLogLimit {
                policy: name,
                limit,
            });
        }
        let magnitudes = Magnitudes::of(algorithm, limit, period_us, burst).map_err(|field| {
            // The largest value of the field that is accepted, all else
            // equal (found by bisection: acceptance shrinks as the field
            // grows).
            let accepts = |value: u64| match field {
                "burst" => Magnitudes::of(algorithm, limit, period_us, Some(value)).is_ok(),
                _ => Magnitudes::of(algorithm, value, period_us, burst).is_ok(),
            };
            let value = if field == "burst" {
                burst.unwrap_or(limit)
            } else {
                limit
            };
            too_large(field, value, largest_accepted(accepts, value))
        })?;
        let Magnitudes {
            scale,
            increment,
            weight_unit_us,
        } = magnitudes;
        let classes = crate::classes::Classes::build(
            &name,
            algorithm,
            burst.unwrap_or(limit),
            classes,
            default_class,
        )?;
        Ok(Policy {
            classes,
            name: name.into(),
            algorithm,
            limit,
            period_us,
            burst,
            capacity: burst.unwrap_or(limit),
            scale,
            increment,
            weight_unit_us,
            // `scale` is at least 1 here.
            gcra: GcraConsts::of(scale, increment, burst.unwrap_or(limit)),
        })
    }
}

/// The derived magnitudes of a policy (ALGORITHMS.md, "Magnitudes").
struct Magnitudes {
    scale: u64,
    increment: u64,
    weight_unit_us: u64,
}

impl Magnitudes {
    /// The magnitudes, or the field that is too large. `period_us` is at
    /// least 1 and below [`MAX_MAGNITUDE`]; `limit` and `burst` at least 1.
    fn of(
        algorithm: Algorithm,
        limit: u64,
        period_us: u64,
        burst: Option<u64>,
    ) -> Result<Self, &'static str> {
        if limit > MAX_MAGNITUDE {
            return Err("limit");
        }
        let exact = Self {
            scale: limit,
            increment: period_us,
            weight_unit_us: 1,
        };
        match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingLog => Ok(exact),
            Algorithm::SlidingWindow => {
                let weight_unit_us = sliding_weight_unit(limit, period_us).ok_or("limit")?;
                Ok(Self {
                    weight_unit_us,
                    ..exact
                })
            }
            _ => {
                let capacity = burst.unwrap_or(limit);
                if capacity > MAX_MAGNITUDE {
                    return Err("burst");
                }
                let (scale, increment) = bucket_scale(limit, period_us, capacity)
                    .ok_or(if burst.is_some() { "burst" } else { "limit" })?;
                Ok(Self {
                    scale,
                    increment,
                    weight_unit_us: 1,
                })
            }
        }
    }
}

/// `(scale, increment)` of a bucket policy (ALGORITHMS.md, "Magnitudes"):
/// `(limit, period)` when `capacity × period ≤ 2^52`; else `scale = 2^k` for
/// the largest `k` with `limit × 2^k ≤ 2^53` and `capacity × increment ≤
/// 2^52`, where `increment = ceil(period × 2^k / limit)`, provided the
/// increment is at least [`MIN_ROUNDED_INCREMENT`]. The Lua prelude computes
/// the same.
fn bucket_scale(limit: u64, period_us: u64, capacity: u64) -> Option<(u64, u64)> {
    let max = u128::from(MAX_MAGNITUDE);
    let (limit_w, period_w, capacity_w) = (
        u128::from(limit),
        u128::from(period_us),
        u128::from(capacity),
    );
    if capacity_w * period_w <= max {
        return Some((limit, period_us));
    }
    let mut best = None;
    for k in 0..=53 {
        let scale = 1_u128 << k;
        if limit_w * scale > 2 * max {
            break;
        }
        let increment = (period_w * scale).div_ceil(limit_w);
        if capacity_w * increment > max {
            break;
        }
        best = Some((scale, increment));
    }
    let (scale, increment) = best?;
    if increment < u128::from(MIN_ROUNDED_INCREMENT) {
        return None;
    }
    // Both are at most 2^53 here.
    Some((u64::try_from(scale).ok()?, u64::try_from(increment).ok()?))
}

/// The sliding window's weight unit: 1 when `limit × period ≤ 2^52`, else
/// the smallest power of ten that divides the period with `limit × (period
/// / unit) ≤ 2^52`, if any.
fn sliding_weight_unit(limit: u64, period_us: u64) -> Option<u64> {
    let mut unit = 1_u64;
    loop {
        if !period_us.is_multiple_of(unit) {
            return None;
        }
        if u128::from(limit) * u128::from(period_us / unit) <= u128::from(MAX_MAGNITUDE) {
            return Some(unit);
        }
        unit = unit.checked_mul(10)?;
    }
}

/// The largest `value` at most `refused` for which `accepts` holds (1 when
/// none does; acceptance is assumed to shrink as the value grows).
fn largest_accepted(accepts: impl Fn(u64) -> bool, refused: u64) -> u64 {
    let (mut good, mut bad) = (0_u64, refused);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if accepts(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

pub(crate) fn validate_name(name: &str) -> Result<(), PolicyError> {
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
        /// The policy's name.
        policy: String,
        /// The limit given.
        limit: u64,
    },
    /// A value was too large for the policy's algorithm to compute exactly
    /// (or, for a bucket, with its interval rounded up by less than one
    /// part in 65 536); ALGORITHMS.md, "Magnitudes".
    TooLarge {
        /// The policy's name.
        policy: String,
        /// The policy's algorithm.
        algorithm: Algorithm,
        /// The field to change: `limit`, `burst` or `period`.
        field: &'static str,
        /// The value given (the period in microseconds).
        value: u64,
        /// The largest value of the field accepted, the others unchanged
        /// (0 when none is).
        max: u64,
    },
    /// The name was empty, too long, or had characters other than ASCII
    /// letters, digits, `_`, `-` and `.`.
    InvalidName {
        /// The name given (at most 80 characters of it).
        name: String,
    },
    /// A priority class ([`PolicyBuilder::class`]) was refused: a bad or
    /// repeated name, a reserve of 100 % or more, a reserve that leaves no
    /// permit to the class, an algorithm without classes, or a
    /// [`default_class`](PolicyBuilder::default_class) the policy does not
    /// define.
    InvalidClass {
        /// The policy's name.
        policy: String,
        /// The class's name (at most 80 characters of it).
        class: String,
        /// What is wrong and what to do.
        reason: String,
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
            Self::SlidingLogLimit { policy, limit } => write!(f, "policy {policy:?}: limit {limit} is above the sliding log's cap of {SLIDING_LOG_MAX_LIMIT}: the log keeps one entry per permit; use sliding_window or gcra for large limits"),
            Self::TooLarge { policy, field: "period", value, max, .. } => write!(f, "policy {policy:?}: period of {value} µs is too long: the largest period accepted is {max} µs (about 142 years)"),
            Self::TooLarge { policy, algorithm, field, value, max } => {
                write!(f, "policy {policy:?}: {field} {value} is too large for {algorithm} with this period: ")?;
                if *max == 0 {
                    f.write_str("no value is accepted with this period; use a period that is a whole number of milliseconds (see ALGORITHMS.md, \"Magnitudes\")")
                } else {
                    write!(f, "the largest {field} accepted is {max} (see ALGORITHMS.md, \"Magnitudes\")")
                }
            }
            Self::InvalidName { name } => write!(f, "policy name {name:?} is invalid: use 1 to {MAX_POLICY_NAME_LEN} ASCII letters, digits, '_', '-' or '.'"),
            Self::InvalidClass { policy, class, reason } => write!(f, "policy {policy:?}: priority class {class:?}: {reason}"),
        }
    }
}

impl std::error::Error for PolicyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emission_interval_is_exact_or_rounded_up() {
        let exact = Policy::per_second(3).build().unwrap();
        assert_eq!(exact.emission_interval(), (3, 1_000_000));
        // u32::MAX per day: about 20.1 µs per permit, rounded up to a
        // multiple of 2^-15 µs, never down.
        let daily = Policy::per_day(u64::from(u32::MAX)).build().unwrap();
        assert!(!daily.is_exact());
        let (scale, increment) = daily.emission_interval();
        assert_eq!(scale, 1 << 15);
        assert!(u128::from(increment) * u128::from(u32::MAX) >= 86_400_000_000 * u128::from(scale));
    }
}
