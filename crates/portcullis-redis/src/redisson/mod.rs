//! A Redisson-style named rate limiter whose configuration lives in Redis
//! ([`RateLimiter`], from [`RedisStore::rate_limiter`](crate::RedisStore::rate_limiter)):
//! a second product beside the [`Store`](portcullis_core::Store), for code
//! that moves from Redisson's `RRateLimiter`. It shares the store's
//! connection and prefix, and runs its own script (lua/limiter.lua).

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use portcullis_core::{Algorithm, Policy, StoreError};
use redis::{Cmd, Value};
use tokio::time::Instant;

use crate::call::reply::{ints, protocol};
use crate::call::{push_time, Caller};
use crate::connection;
use crate::scripts::{self, LuaScript};

mod error;

pub use error::RateLimiterError;

/// The limiter's script, composed once per process.
fn limiter_script() -> &'static LuaScript {
    static SCRIPT: std::sync::OnceLock<LuaScript> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(scripts::limiter)
}

/// How long a limiter's configuration stays in Redis without an admitted
/// acquisition or a rate change: [`RateLimiter::keep_alive`].
pub(crate) const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Who shares a [`RateLimiter`]'s permits (Redisson's `RateType`).
///
/// ```
/// use portcullis::redis::redisson::RateType;
///
/// let shared = RateType::Overall; // one limit for every client
/// let own = RateType::PerClient; // one limit per RateLimiter handle
/// assert_ne!(shared, own);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateType {
    /// One limit shared by every client of the limiter.
    Overall,
    /// One limit per client: per [`RateLimiter`] handle, each with its own
    /// [`client_id`](RateLimiter::client_id).
    PerClient,
}

impl RateType {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Overall => "overall",
            Self::PerClient => "per_client",
        }
    }
}

/// A limiter's configuration: `rate` permits per `interval`, for
/// `rate_type`, as [`RateLimiter::config`] reads it.
///
/// ```
/// use std::time::Duration;
/// use portcullis::redis::redisson::{RateLimiterConfig, RateType};
///
/// let config = RateLimiterConfig {
///     rate_type: RateType::Overall,
///     rate: 100,
///     interval: Duration::from_secs(60),
/// };
/// assert_eq!(config.interval / config.rate as u32, Duration::from_millis(600));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimiterConfig {
    /// Who shares the permits.
    pub rate_type: RateType,
    /// Permits per interval; also the most that may be taken at once.
    pub rate: u64,
    /// The interval (whole microseconds).
    pub interval: Duration,
}

/// A named rate limiter whose configuration lives in Redis, like Redisson's
/// `RRateLimiter`, without its flaws: the time is Redis' `TIME` (or the
/// store's [`ClockMode`](crate::ClockMode)), [`set_rate`](Self::set_rate)
/// keeps the current state, a denied attempt charges nothing and no call is
/// replayed, and every key has a TTL.
///
/// Built on GCRA with `limit = burst = rate`: `rate` permits may be taken
/// at once, and they come back smoothly, one every `interval / rate`.
///
/// Keys (one Cluster slot per limiter, through the hash tag):
/// `<prefix>:limiter:{<name>}:config` (a hash: `rate`, `interval_us`,
/// `type`), `<prefix>:limiter:{<name>}:state` (the shared GCRA state) and
/// `<prefix>:limiter:{<name>}:client:<client id>` (per-client states).
///
/// ```no_run
/// use std::time::Duration;
/// use portcullis::redis::RedisStore;
/// use portcullis::redis::redisson::RateType;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder().url("redis://127.0.0.1:6379").build().await?;
/// let limiter = store.rate_limiter("emails");
/// // First writer wins: every instance may call this at startup.
/// limiter.try_set_rate(RateType::Overall, 100, Duration::from_secs(60)).await?;
///
/// if limiter.try_acquire(1).await? {
///     // send one e-mail
/// }
/// // Wait up to 2 s for 5 permits (sleeps for the retry-after; no polling).
/// let sent = limiter.try_acquire_within(5, Duration::from_secs(2)).await?;
/// println!("{} permits left", limiter.available_permits().await?);
/// # let _ = sent;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    caller: Arc<Caller>,
    name: Arc<str>,
    client_id: Arc<str>,
    config_key: Arc<str>,
    state_key: Arc<str>,
    client_key: Arc<str>,
    keep_alive: Duration,
    known: Arc<Mutex<Option<RateLimiterConfig>>>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("name", &&*self.name)
            .field("client_id", &&*self.client_id)
            .field("config_key", &&*self.config_key)
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

/// What one acquisition attempt returned.
struct Attempt {
    allowed: bool,
    remaining: u64,
    retry_after: Duration,
}

impl RateLimiter {
    /// The limiter `name` on the store whose calls `caller` makes.
    pub(crate) fn new(caller: Arc<Caller>, name: &str) -> Self {
        let tag = portcullis_core::subject::encode_subject(name, false);
        let base = format!("{}:limiter:{{{tag}}}", caller.keys.prefix());
        let client_id: Arc<str> = new_client_id().into();
        Self {
            caller,
            name: name.into(),
            config_key: format!("{base}:config").into(),
            state_key: format!("{base}:state").into(),
            client_key: format!("{base}:client:{client_id}").into(),
            client_id,
            keep_alive: DEFAULT_KEEP_ALIVE,
            known: Arc::new(Mutex::new(None)),
        }
    }
}

fn new_client_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut id = String::with_capacity(32);
    // RandomState is seeded from the OS's randomness once per thread and
    // moves on for every instance.
    for salt in 0..2_u8 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u8(salt);
        hasher.write_u64(count);
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        id.push_str(&format!("{:016x}", hasher.finish()));
    }
    id
}

fn policy_for(rate: u64, interval: Duration) -> Result<Policy, RateLimiterError> {
    Policy::per(rate, interval)
        .algorithm(Algorithm::Gcra)
        .burst(rate)
        .name("limiter")
        .build()
        .map_err(RateLimiterError::InvalidRate)
}

fn millis_ceil(duration: Duration) -> u128 {
    duration.as_micros().div_ceil(1000).max(1)
}

impl RateLimiter {
    /// The limiter's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This handle's client id: its key for [`RateType::PerClient`].
    #[must_use]
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// How long the configuration stays in Redis after the last rate change
    /// or admitted acquisition, so no key is immortal. Default: 7 days. A handle that has seen the configuration (it set
    /// it, or acquired with it) restores it if it expired.
    #[must_use]
    pub fn keep_alive(mut self, keep_alive: Duration) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    fn remember(&self, config: Option<RateLimiterConfig>) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        *known = config;
    }

    fn known(&self) -> Option<RateLimiterConfig> {
        *self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn set(
        &self,
        op: &str,
        rate_type: RateType,
        rate: u64,
        interval: Duration,
    ) -> Result<bool, RateLimiterError> {
        let policy = policy_for(rate, interval)?;
        let mut cmd = self.limiter_cmd(op);
        cmd.arg(rate)
            .arg(policy.period_micros())
            .arg(rate_type.as_str())
            .arg(millis_ceil(self.keep_alive));
        let value = self.eval(&cmd).await?;
        match value {
            Value::Int(1) => {
                self.remember(Some(RateLimiterConfig {
                    rate_type,
                    rate,
                    interval: policy.period(),
                }));
                Ok(true)
            }
            Value::Int(0) => Ok(false),
            other => Err(protocol(format!("the limiter's {op} answered {other:?}")).into()),
        }
    }

    /// Sets the rate if none is set yet: the first writer wins, so every
    /// instance may call this at startup. Returns whether this call set it.
    ///
    /// # Errors
    ///
    /// [`RateLimiterError::InvalidRate`] for a zero or too large rate or
    /// interval; [`RateLimiterError::Store`] when Redis fails.
    pub async fn try_set_rate(
        &self,
        rate_type: RateType,
        rate: u64,
        interval: Duration,
    ) -> Result<bool, RateLimiterError> {
        self.set("try_set", rate_type, rate, interval).await
    }

    /// Sets the rate, replacing any other. Unlike Redisson's, the current
    /// state is kept: permits already taken stay taken (GCRA's theoretical
    /// arrival time carries over; see `ALGORITHMS.md`).
    ///
    /// # Errors
    ///
    /// As [`try_set_rate`](Self::try_set_rate).
    pub async fn set_rate(
        &self,
        rate_type: RateType,
        rate: u64,
        interval: Duration,
    ) -> Result<(), RateLimiterError> {
        self.set("set", rate_type, rate, interval).await.map(|_| ())
    }

    /// The configuration stored in Redis, if any.
    ///
    /// # Errors
    ///
    /// [`RateLimiterError::Store`] when Redis fails or the stored hash is
    /// malformed.
    pub async fn config(&self) -> Result<Option<RateLimiterConfig>, RateLimiterError> {
        let inner = &*self.caller;
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&*self.config_key)
            .arg("rate")
            .arg("interval_us")
            .arg("type");
        let value = connection::query(&inner.pool, inner.timeout, &cmd).await?;
        let fields = match value {
            Value::Array(fields) if fields.len() == 3 => fields,
            other => return Err(protocol(format!("HMGET answered {other:?}")).into()),
        };
        if fields.iter().all(|f| matches!(f, Value::Nil)) {
            return Ok(None);
        }
        let text = |value: &Value| match value {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let malformed = || {
            protocol(format!(
                "the limiter's configuration is malformed: {fields:?}"
            ))
        };
        let rate = text(&fields[0])
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(malformed)?;
        let interval_us = text(&fields[1])
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(malformed)?;
        let rate_type = match text(&fields[2]).as_deref() {
            Some("overall") => RateType::Overall,
            Some("per_client") => RateType::PerClient,
            _ => return Err(malformed().into()),
        };
        Ok(Some(RateLimiterConfig {
            rate_type,
            rate,
            interval: Duration::from_micros(interval_us),
        }))
    }

    /// `EVALSHA` of the limiter script on this limiter's three keys, with
    /// the operation `op` as the first argument.
    fn limiter_cmd(&self, op: &str) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(limiter_script().sha())
            .arg(3)
            .arg(&*self.config_key)
            .arg(&*self.state_key)
            .arg(&*self.client_key)
            .arg(op);
        cmd
    }

    /// Runs a command built by [`limiter_cmd`](Self::limiter_cmd).
    async fn eval(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        let inner = &*self.caller;
        connection::eval(
            &inner.pool,
            inner.timeout,
            limiter_script(),
            cmd,
            &self.config_key,
        )
        .await
    }

    async fn attempt(&self, permits: u64) -> Result<Attempt, RateLimiterError> {
        let mut cmd = self.limiter_cmd("acquire");
        push_time(&mut cmd, self.caller.now());
        cmd.arg(permits).arg(millis_ceil(self.keep_alive));
        // A read never writes, so it never restores a configuration.
        let restore = if permits > 0 { self.known() } else { None };
        if let Some(config) = restore {
            cmd.arg(config.rate)
                .arg(u64::try_from(config.interval.as_micros()).unwrap_or(u64::MAX))
                .arg(config.rate_type.as_str());
        }
        let numbers: [i64; 7] = match self.eval(&cmd).await? {
            Value::Array(items) if items.len() == 7 => ints(&items)?,
            other => {
                return Err(protocol(format!("the limiter answered {other:?}")).into());
            }
        };
        let [status, remaining, retry_after, _reset_after, rate, interval_us, kind] = numbers;
        let non_negative = |n: i64| {
            u64::try_from(n).map_err(|_| protocol(format!("the limiter answered {numbers:?}")))
        };
        match status {
            -1 => {
                self.remember(None);
                return Err(RateLimiterError::NotInitialized {
                    name: self.name.to_string(),
                });
            }
            -2 => {
                return Err(RateLimiterError::PermitsAboveRate {
                    permits,
                    rate: non_negative(rate)?,
                })
            }
            0 | 1 => {}
            _ => return Err(protocol(format!("the limiter answered {numbers:?}")).into()),
        }
        let rate_type = match kind {
            1 => RateType::Overall,
            2 => RateType::PerClient,
            _ => return Err(protocol(format!("the limiter answered {numbers:?}")).into()),
        };
        self.remember(Some(RateLimiterConfig {
            rate_type,
            rate: non_negative(rate)?,
            interval: Duration::from_micros(non_negative(interval_us)?),
        }));
        Ok(Attempt {
            allowed: status == 1,
            remaining: non_negative(remaining)?,
            retry_after: if status == 1 {
                Duration::ZERO
            } else {
                Duration::from_micros(non_negative(retry_after)?)
            },
        })
    }

    /// Takes `permits` if they are available now; a denied attempt
    /// changes nothing.
    ///
    /// # Errors
    ///
    /// [`RateLimiterError::NotInitialized`] without a rate,
    /// [`RateLimiterError::PermitsAboveRate`] /
    /// [`RateLimiterError::ZeroPermits`] for an impossible request,
    /// [`RateLimiterError::Store`] when Redis fails (never retried).
    pub async fn try_acquire(&self, permits: u64) -> Result<bool, RateLimiterError> {
        if permits == 0 {
            return Err(RateLimiterError::ZeroPermits);
        }
        Ok(self.attempt(permits).await?.allowed)
    }

    /// Takes `permits`, waiting up to `timeout` for them. Between attempts
    /// it sleeps for the retry-after Redis returned (no polling), and gives
    /// up at once when that is past the timeout. Denied attempts charge
    /// nothing, so waiting never costs permits.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_acquire_within(
        &self,
        permits: u64,
        timeout: Duration,
    ) -> Result<bool, RateLimiterError> {
        // A timeout too long to add to now is no deadline.
        self.acquire_until(permits, Instant::now().checked_add(timeout))
            .await
    }

    /// Takes `permits`, waiting as long as it takes (sleeping for each
    /// retry-after, no polling). With [`ClockMode::Client`](crate::ClockMode)
    /// the client's clock must move on while it sleeps (a manual clock that
    /// stands still never grants the permits; use
    /// [`try_acquire_within`](Self::try_acquire_within) in tests).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, permits: u64) -> Result<(), RateLimiterError> {
        self.acquire_until(permits, None).await.map(|_| ())
    }

    /// Takes `permits`, sleeping for each retry-after, until they are
    /// granted (`true`) or the next attempt would come after `deadline`
    /// (`false`).
    async fn acquire_until(
        &self,
        permits: u64,
        deadline: Option<Instant>,
    ) -> Result<bool, RateLimiterError> {
        if permits == 0 {
            return Err(RateLimiterError::ZeroPermits);
        }
        loop {
            let attempt = self.attempt(permits).await?;
            if attempt.allowed {
                return Ok(true);
            }
            let wake = Instant::now().checked_add(attempt.retry_after);
            if let Some(deadline) = deadline
                && wake.is_none_or(|wake| wake > deadline)
            {
                return Ok(false);
            }
            match wake {
                Some(wake) => tokio::time::sleep_until(wake).await,
                None => tokio::time::sleep(attempt.retry_after).await,
            }
        }
    }

    /// Permits available right now (for this client, with
    /// [`RateType::PerClient`]). A read: it writes nothing and does not
    /// change the next decision.
    ///
    /// # Errors
    ///
    /// [`RateLimiterError::NotInitialized`] without a rate;
    /// [`RateLimiterError::Store`] when Redis fails.
    pub async fn available_permits(&self) -> Result<u64, RateLimiterError> {
        Ok(self.attempt(0).await?.remaining)
    }

    /// Deletes the configuration, the shared state and this client's state
    /// (other clients' states expire on their own). Returns whether
    /// anything was deleted.
    ///
    /// # Errors
    ///
    /// [`RateLimiterError::Store`] when Redis fails.
    pub async fn delete(&self) -> Result<bool, RateLimiterError> {
        self.remember(None);
        let inner = &*self.caller;
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&*self.config_key)
            .arg(&*self.state_key)
            .arg(&*self.client_key);
        match connection::query(&inner.pool, inner.timeout, &cmd).await? {
            Value::Int(n) => Ok(n > 0),
            other => Err(protocol(format!("DEL answered {other:?}")).into()),
        }
    }
}
