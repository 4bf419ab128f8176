//! redis-cell compatibility: `CL.THROTTLE` without the module.

use std::fmt;
use std::time::Duration;

use tollgate_core::algorithms::{throttle, ThrottleError, ThrottleReply};
use tollgate_core::{Algorithm, Policy, Store, StoreError};

use crate::RedisStore;

/// The policy name [`RedisStore::throttle`] stores its state under.
pub const THROTTLE_POLICY_NAME: &str = "throttle";

/// Why [`RedisStore::throttle`] failed.
///
/// ```
/// use tollgate_redis::{RedisStore, ThrottleCallError};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = RedisStore::builder().url("redis://127.0.0.1").build().await?;
/// // A count of 0 is refused before anything is sent, as CL.THROTTLE does.
/// let error = store.throttle("user123", 15, 0, 60, 1).await.unwrap_err();
/// assert!(matches!(error, ThrottleCallError::Arguments(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ThrottleCallError {
    /// The arguments were refused, as `CL.THROTTLE` refuses them.
    Arguments(ThrottleError),
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for ThrottleCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Arguments(error) => error.fmt(f),
            Self::Store(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for ThrottleCallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Arguments(error) => Some(error),
            Self::Store(error) => Some(error),
        }
    }
}

impl From<StoreError> for ThrottleCallError {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

impl From<ThrottleError> for ThrottleCallError {
    fn from(error: ThrottleError) -> Self {
        Self::Arguments(error)
    }
}

impl RedisStore {
    /// redis-cell's `CL.THROTTLE key max_burst count period quantity`: the
    /// same five integers, computed by the GCRA script, so no module is
    /// needed (managed Redis and Valkey cannot load one).
    ///
    /// `count` requests per `period` seconds, bursts of up to
    /// `max_burst + 1`, for a request of cost `quantity` (0 peeks). The
    /// state lives at `<prefix>:{<key>}:throttle`; it is the state of a GCRA
    /// [`Policy`] named [`THROTTLE_POLICY_NAME`] with `limit = count`,
    /// `period = period` seconds and `burst = max_burst + 1`, so
    /// `throttle` and [`Store::check`] with that policy share it.
    ///
    /// A `quantity` above `max_burst + 1` can never succeed: the reply is
    /// limited with a retry-after of -1 and nothing is charged. One
    /// deliberate difference from redis-cell: it compares its "too early"
    /// margin in whole seconds and so admits up to a second early with
    /// sub-second emission intervals; tollgate compares exactly.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = tollgate_redis::RedisStore::builder().url("redis://127.0.0.1").build().await?;
    /// // CL.THROTTLE user123 15 30 60 1
    /// let reply = store.throttle("user123", 15, 30, 60, 1).await?;
    /// assert_eq!(reply.to_array(), [0, 16, 15, -1, 2]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ThrottleCallError::Arguments`] when `count` or `period` is 0 or the
    /// arguments are too large to compute exactly;
    /// [`ThrottleCallError::Store`] when Redis fails.
    pub async fn throttle(
        &self,
        key: &str,
        max_burst: u64,
        count: u64,
        period: u64,
        quantity: u64,
    ) -> Result<ThrottleReply, ThrottleCallError> {
        // The arguments are checked exactly as the in-memory throttle checks
        // them (the computation on no state is thrown away).
        throttle(None, 0, max_burst, count, period, quantity)?;
        let burst = max_burst + 1; // cannot overflow: checked above
        let policy = Policy::per(count, Duration::from_secs(period))
            .algorithm(Algorithm::Gcra)
            .burst(burst)
            .name(THROTTLE_POLICY_NAME)
            .build()
            .map_err(ThrottleError::Policy)?;
        let never = quantity > burst;
        let cost = if never { 0 } else { quantity };
        let verdict = self.check(key, std::slice::from_ref(&policy), cost).await?;
        // One policy, so its decision is the binding one (the reply was
        // checked to hold exactly one).
        let decision = *verdict.binding();
        let limited = never || (quantity > 0 && !decision.is_allowed());
        let retry_after_secs = match decision.retry_after() {
            Some(retry) if limited && !never => seconds(retry),
            _ => -1,
        };
        Ok(ThrottleReply {
            limited,
            limit: i64::try_from(burst).unwrap_or(i64::MAX),
            remaining: i64::try_from(decision.remaining()).unwrap_or(i64::MAX),
            retry_after_secs,
            reset_after_secs: seconds(decision.reset_after()),
        })
    }
}

fn seconds(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}
