//! Why a policy could not be built ([`PolicyError`]).

use std::fmt;
use std::time::Duration;

use super::bounds::{MAX_POLICY_NAME_LEN, SLIDING_LOG_MAX_LIMIT};
use super::Algorithm;

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
    /// A priority class ([`PolicyBuilder::class`](crate::PolicyBuilder::class)) was refused: a bad or
    /// repeated name, a reserve of 100 % or more, a reserve that leaves no
    /// permit to the class, an algorithm without classes, or a
    /// [`default_class`](crate::PolicyBuilder::default_class) the policy does not
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
