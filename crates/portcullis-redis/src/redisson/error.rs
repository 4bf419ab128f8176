//! [`RateLimiterError`]: why a [`RateLimiter`](super::RateLimiter) call
//! failed, each message saying what to do.

use std::fmt;

use portcullis_core::{PolicyError, StoreError};

/// Why a [`RateLimiter`](super::RateLimiter) call failed. Each message says what to do.
///
/// ```
/// use portcullis::redis::RedisStore;
/// use portcullis::redis::redisson::RateLimiterError;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = RedisStore::builder().url("redis://127.0.0.1").lazy_connect(true).build().await?;
/// let limiter = store.rate_limiter("exports");
/// // Zero permits are refused before anything is sent.
/// let error = limiter.try_acquire(0).await.unwrap_err();
/// assert!(matches!(error, RateLimiterError::ZeroPermits));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RateLimiterError {
    /// No rate is set for this limiter (never set, deleted, or unused for
    /// its keep-alive time).
    NotInitialized {
        /// The limiter's name.
        name: String,
    },
    /// More permits were asked for than the rate: they could never be
    /// granted.
    PermitsAboveRate {
        /// Permits asked for.
        permits: u64,
        /// The limiter's rate.
        rate: u64,
    },
    /// Zero permits were asked for.
    ZeroPermits,
    /// The rate and interval do not make a valid policy (zero, or too
    /// large to compute exactly).
    InvalidRate(PolicyError),
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for RateLimiterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInitialized { name } => write!(f, "rate limiter {name:?} has no rate: call try_set_rate (or set_rate) first"),
            Self::PermitsAboveRate { permits, rate } => write!(f, "{permits} permits were asked for but the rate is {rate}: they could never be granted; ask for at most {rate}"),
            Self::ZeroPermits => f.write_str("0 permits were asked for: ask for at least 1 (available_permits reads without acquiring)"),
            Self::InvalidRate(_) => f.write_str("the rate and interval do not make a valid policy (the cause says which and what to change)"),
            // Transparent: the store error's own text; its `source()` is
            // this error's.
            Self::Store(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for RateLimiterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidRate(error) => Some(error),
            Self::Store(error) => std::error::Error::source(error),
            _ => None,
        }
    }
}

impl From<StoreError> for RateLimiterError {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}
