//! redis-cell compatibility: [`RedisStore::throttle`] answers
//! `CL.THROTTLE` without the module; [`ThrottleCallError`] is its error.

use std::fmt;

use portcullis_core::algorithms::{throttle_policy, throttle_reply, ThrottleError, ThrottleReply};
use portcullis_core::{Store, StoreError};

use super::RedisStore;

/// The policy name [`RedisStore::throttle`] stores its state under.
pub use portcullis_core::algorithms::THROTTLE_POLICY_NAME;

/// Why [`RedisStore::throttle`] failed.
///
/// ```
/// use portcullis::redis::{RedisStore, ThrottleCallError};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = RedisStore::builder().url("redis://127.0.0.1").lazy_connect(true).build().await?;
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

// Transparent: each variant prints its error's text and has its error's
// `source()`, so a chain walker prints every cause once.
impl std::error::Error for ThrottleCallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Arguments(error) => std::error::Error::source(error),
            Self::Store(error) => std::error::Error::source(error),
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
    /// [`Policy`](portcullis_core::Policy) named [`THROTTLE_POLICY_NAME`] with `limit = count`,
    /// `period = period` seconds and `burst = max_burst + 1`, so
    /// `throttle` and [`Store::check`] with that policy share it.
    ///
    /// A `quantity` above `max_burst + 1` can never succeed: the reply is
    /// limited with a retry-after of -1 and nothing is charged. Seconds are
    /// rounded as redis-cell 0.5 rounds them: up to the next whole second
    /// when at least a millisecond remains.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = portcullis::redis::RedisStore::builder().url("redis://127.0.0.1").build().await?;
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
        // The same policy, and so the same refusals, as the in-memory
        // throttle.
        let policy = throttle_policy(max_burst, count, period)?;
        // A quantity above the burst is never admitted: peek for the figures
        // (the store refuses a cost above the capacity).
        let cost = if quantity > policy.capacity() {
            0
        } else {
            quantity
        };
        let verdict = self.check(key, std::slice::from_ref(&policy), cost).await?;
        // One policy, so its decision is the binding one (the reply was
        // checked to hold exactly one).
        Ok(throttle_reply(verdict.binding(), &policy, quantity))
    }
}
