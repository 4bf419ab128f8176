//! The check at `build()` that a client clock ([`ClockMode::Client`]) agrees
//! with Redis's `TIME`: a clock behind Redis's writes keys that expire at
//! once (every check admitted), one ahead keeps keys alive past their time.

use std::time::Duration;

use portcullis_core::Clock;
use redis::Value;

use crate::clock::ClockMode;
use crate::connection;
use crate::errors::BuildError;
use crate::store::RedisStore;

/// Default for [`RedisStoreBuilder::client_clock_tolerance`](super::RedisStoreBuilder::client_clock_tolerance):
/// one second. Hosts kept by NTP agree with each other within milliseconds,
/// so this never refuses a healthy setup, yet it catches a clock that is
/// wrong (a time zone error, a dead RTC battery, a test clock left at a
/// fixed date). What a skew below it costs: keys expire up to that much
/// early (a clock behind) or late (ahead), so a key can forget at most one
/// second's worth of its state before its time. Not API (the value is
/// documented on the setter); public, hidden, for the workspace's tests.
#[doc(hidden)]
pub const DEFAULT_CLIENT_CLOCK_TOLERANCE: Duration = Duration::from_secs(1);

/// How far a client clock is from Redis's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Skew {
    /// The distance (zero when Redis's reading falls between the client's
    /// readings before and after the call).
    pub(crate) by: Duration,
    /// Whether the client clock is ahead of Redis's (else behind).
    pub(crate) ahead: bool,
}

/// Refuses `store` when its client clock is more than `tolerance` from
/// Redis's `TIME`. Nothing to do on Redis's own clock.
pub(super) async fn check(
    store: &RedisStore,
    tolerance: Duration,
    timeout: Duration,
) -> Result<(), BuildError> {
    let ClockMode::Client(clock) = &store.inner.caller.clock else {
        return Ok(());
    };
    let before = clock.now_micros();
    let reply = connection::query(&store.inner.caller.pool, timeout, &redis::cmd("TIME"))
        .await
        .map_err(|source| BuildError::Check { source })?;
    let after = clock.now_micros();
    let Some(redis_now) = time_micros(&reply) else {
        return Err(BuildError::Unsupported {
            detail: format!(
                "the server answered TIME with {reply:?}, not [seconds, microseconds]: use a Redis-compatible server, or ClockMode::Redis"
            ),
        });
    };
    let skew = skew(before, after, redis_now);
    if skew.by > tolerance {
        return Err(BuildError::ClientClockSkew {
            skew: skew.by,
            ahead: skew.ahead,
            tolerance,
        });
    }
    Ok(())
}

/// The skew of a client clock that read `before` and `after` around a
/// `TIME` that read `redis_now` (microseconds since the epoch). Redis read
/// its clock between the two, so only what lies outside them is skew, not
/// the round trip.
pub(crate) fn skew(before: u64, after: u64, redis_now: u64) -> Skew {
    let (earliest, latest) = (before.min(after), before.max(after));
    if redis_now < earliest {
        Skew {
            by: Duration::from_micros(earliest - redis_now),
            ahead: true,
        }
    } else {
        Skew {
            by: Duration::from_micros(redis_now.saturating_sub(latest)),
            ahead: false,
        }
    }
}

/// Microseconds since the epoch from a `TIME` reply (`[seconds,
/// microseconds]` as bulk strings).
fn time_micros(reply: &Value) -> Option<u64> {
    let number = |value: &Value| -> Option<u64> {
        match value {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
            Value::SimpleString(text) => text.parse().ok(),
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    match reply {
        Value::Array(parts) if parts.len() == 2 => number(&parts[0])?
            .checked_mul(1_000_000)?
            .checked_add(number(&parts[1])?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_lies_outside_the_round_trip_is_skew() {
        let zero = Skew {
            by: Duration::ZERO,
            ahead: false,
        };
        assert_eq!(skew(100, 200, 150), zero);
        assert_eq!(skew(100, 100, 100), zero);
        assert_eq!(
            skew(100, 200, 40),
            Skew {
                by: Duration::from_micros(60),
                ahead: true
            }
        );
        assert_eq!(
            skew(100, 200, 260),
            Skew {
                by: Duration::from_micros(60),
                ahead: false
            }
        );
    }

    #[test]
    fn time_replies_are_read() {
        let reply = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        assert_eq!(time_micros(&reply), Some(1_700_000_000_123_456));
        assert_eq!(time_micros(&Value::Nil), None);
        let bad = Value::Array(vec![Value::BulkString(b"x".to_vec()), Value::Int(1)]);
        assert_eq!(time_micros(&bad), None);
    }
}
