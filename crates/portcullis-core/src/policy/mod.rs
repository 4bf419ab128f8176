//! Policies: what is limited, how fast, and with which algorithm.
//!
//! [`Policy`] (its constructors and accessors) is here; the rest by
//! concern, top-down: `builder.rs` ([`PolicyBuilder`] and its validation)
//! above `classes.rs` (priority classes) and `magnitudes.rs` (the derived
//! magnitudes and their bound), above `name.rs`, `algorithm.rs`
//! ([`Algorithm`], [`LeakyMode`]) and `error.rs` ([`PolicyError`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

mod algorithm;
mod bounds;
mod builder;
mod classes;
mod error;
mod magnitudes;
mod name;

pub use self::algorithm::{Algorithm, LeakyMode};
pub use self::bounds::{MAX_POLICY_NAME_LEN, SLIDING_LOG_MAX_LIMIT};
pub use self::builder::PolicyBuilder;
use self::classes::Classes;
pub use self::error::PolicyError;
pub use self::magnitudes::MAX_MAGNITUDE;
pub(crate) use self::name::validate_name;

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
    classes: Classes,
    /// `<limit>:<period_us>:<capacity>`, the policy as the Redis store's
    /// scripts take it and as its bucket states record their units, written
    /// once here rather than on every call.
    shape_argument: Arc<str>,
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
    /// `full_ceil_us + tolerance_us`: the furthest ahead of now a TAT is
    /// read as it is (further, the reference clamps it).
    pub(crate) clamp_after_us: u64,
    /// Whether the emission interval is a whole number of microseconds
    /// (`interval_rem == 0`, so `full_rem == 0` too): a state this policy
    /// writes then never holds a fraction, and the hot path takes its
    /// whole-µs branch (no remainders, no carries).
    pub(crate) whole: bool,
    /// The capacity for a GCRA policy, 0 for any other algorithm: the
    /// memory store's hot path takes a charge of `cost` when
    /// `cost - 1 < charge_capacity` (wrapping), one comparison for "GCRA,
    /// and `1 <= cost <= capacity`".
    pub(crate) charge_capacity: u64,
}

impl GcraConsts {
    fn of(algorithm: Algorithm, scale: u64, increment: u64, capacity: u64) -> Self {
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
            clamp_after_us: full_ceil_us.saturating_add(full_ceil_us.max(1_000_000)),
            whole: increment.is_multiple_of(scale),
            charge_capacity: if algorithm == Algorithm::Gcra {
                capacity
            } else {
                0
            },
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

    /// `<limit>:<period_us>:<capacity>`, computed when the policy was built:
    /// what the Redis store sends for it. Shared by the family's stores, not
    /// API.
    #[doc(hidden)]
    #[must_use]
    pub fn shape_argument(&self) -> &Arc<str> {
        &self.shape_argument
    }
}

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
