//! The compatibility APIs: redis-cell's `CL.THROTTLE` sequence and the
//! Redisson-style rate limiter's semantics, against a real server.

use crate::redis_common;

use std::time::Duration;

use portcullis_core::algorithms::throttle;
use portcullis_core::{Algorithm, Clock, Policy, Store};
use portcullis_redis::redisson::{RateLimiterConfig, RateLimiterError, RateType};
use portcullis_redis::ClockMode;
use portcullis_tests::unique_prefix;
use redis_common::{client, manual_clock};

/// redis-cell's README example, `CL.THROTTLE user123 15 30 60 1`, at one
/// instant: 16 admitted (remaining 15 down to 0), then limited with a
/// retry-after of 2 s and the key full again in 32 s. The same replies as
/// the in-memory `throttle`.
#[tokio::test(flavor = "multi_thread")]
async fn redis_cell_example_sequence() {
    let clock = manual_clock();
    let store = redis_common::standalone(&unique_prefix("cell"), client(&clock)).await;
    let first = store.throttle("user123", 15, 30, 60, 1).await.unwrap();
    assert_eq!(first.to_array(), [0, 16, 15, -1, 2]);
    let mut replies = vec![first.to_array()];
    loop {
        let reply = store.throttle("user123", 15, 30, 60, 1).await.unwrap();
        replies.push(reply.to_array());
        if reply.limited {
            break;
        }
        assert!(replies.len() <= 17, "never limited: {replies:?}");
    }
    assert_eq!(replies.len(), 17, "16 admitted, then limited: {replies:?}");
    for (i, reply) in replies[..16].iter().enumerate() {
        let remaining = 15 - i as i64;
        assert_eq!(reply[..4], [0, 16, remaining, -1], "reply {i}");
        assert_eq!(reply[4], 2 * (i as i64 + 1), "reply {i}: reset after");
    }
    assert_eq!(replies[16], [1, 16, 0, 2, 32]);

    // The same sequence from the in-memory function.
    let mut state = None;
    for (i, expected) in replies.iter().enumerate() {
        let (reply, next) =
            throttle(state.as_ref(), clock.now_micros(), 15, 30, 60, 1).expect("valid arguments");
        assert_eq!(&reply.to_array(), expected, "reply {i}");
        if next.is_some() {
            state = next;
        }
    }

    // A peek is never limited and writes nothing; a quantity above the burst
    // can never succeed.
    let peek = store.throttle("user123", 15, 30, 60, 0).await.unwrap();
    assert_eq!(peek.to_array(), [0, 16, 0, -1, 32]);
    let never = store.throttle("user123", 15, 30, 60, 17).await.unwrap();
    assert_eq!(never.to_array(), [1, 16, 0, -1, 32]);
    // Two seconds later exactly one more is admitted.
    clock.advance(Duration::from_secs(2));
    let later = store.throttle("user123", 15, 30, 60, 1).await.unwrap();
    assert_eq!(later.to_array(), [0, 16, 0, -1, 32]);
    assert!(
        store
            .throttle("user123", 15, 30, 60, 1)
            .await
            .unwrap()
            .limited
    );
}

/// `throttle` shares its state with a GCRA policy named `throttle` and
/// refuses what `CL.THROTTLE` refuses.
#[tokio::test(flavor = "multi_thread")]
async fn throttle_shares_state_with_the_gcra_policy_and_checks_arguments() {
    let clock = manual_clock();
    let store = redis_common::standalone(&unique_prefix("cell-share"), client(&clock)).await;
    let policy = Policy::per(30, Duration::from_secs(60))
        .algorithm(Algorithm::Gcra)
        .burst(16)
        .name(portcullis_redis::THROTTLE_POLICY_NAME)
        .build()
        .unwrap();
    let verdict = store.check("shared", &[policy], 10).await.unwrap();
    assert!(verdict.is_allowed());
    let reply = store.throttle("shared", 15, 30, 60, 1).await.unwrap();
    assert_eq!(reply.remaining, 5, "the policy's 10 permits are taken");

    assert!(matches!(
        store.throttle("k", 15, 0, 60, 1).await,
        Err(portcullis_redis::ThrottleCallError::Arguments(_))
    ));
    assert!(matches!(
        store.throttle("k", 15, 30, 0, 1).await,
        Err(portcullis_redis::ThrottleCallError::Arguments(_))
    ));
}

/// With Redis' own clock the sequence is the same up to the time passing
/// between calls: exactly 16 admitted, then limited.
#[tokio::test(flavor = "multi_thread")]
async fn redis_cell_sequence_on_the_redis_clock() {
    let store = redis_common::standalone(&unique_prefix("cell-time"), ClockMode::Redis).await;
    let mut admitted = 0;
    let limited = loop {
        let reply = store.throttle("user123", 15, 30, 60, 1).await.unwrap();
        if reply.limited {
            break reply;
        }
        admitted += 1;
        assert!(admitted <= 16, "more than max_burst + 1 admitted");
    };
    assert_eq!(admitted, 16);
    assert_eq!(limited.limit, 16);
    assert_eq!(limited.remaining, 0);
    assert!((0..=2).contains(&limited.retry_after_secs), "{limited:?}");
    assert!((30..=32).contains(&limited.reset_after_secs), "{limited:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn first_writer_wins_and_config_is_shared() {
    let store = redis_common::standalone(&unique_prefix("limiter"), ClockMode::Redis).await;
    let a = store.rate_limiter("shared");
    let b = store.rate_limiter("shared");
    assert_eq!(a.config().await.unwrap(), None);
    assert!(a
        .try_set_rate(RateType::Overall, 10, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(!b
        .try_set_rate(RateType::PerClient, 99, Duration::from_secs(1))
        .await
        .unwrap());
    let expected = RateLimiterConfig {
        rate_type: RateType::Overall,
        rate: 10,
        interval: Duration::from_secs(60),
    };
    assert_eq!(a.config().await.unwrap(), Some(expected));
    assert_eq!(b.config().await.unwrap(), Some(expected));
    // Overall: both handles draw from the same 10 permits.
    assert!(a.try_acquire(6).await.unwrap());
    assert!(b.try_acquire(4).await.unwrap());
    assert!(!a.try_acquire(1).await.unwrap());
    assert!(!b.try_acquire(1).await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn set_rate_keeps_the_state() {
    let store = redis_common::standalone(&unique_prefix("limiter"), ClockMode::Redis).await;
    let limiter = store.rate_limiter("keeps");
    limiter
        .try_set_rate(RateType::Overall, 10, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(limiter.try_acquire(10).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap());
    // Redisson would wipe the state here and admit again.
    limiter
        .set_rate(RateType::Overall, 20, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        limiter.config().await.unwrap().map(|c| c.rate),
        Some(20),
        "the new rate is stored"
    );
    assert!(
        !limiter.try_acquire(1).await.unwrap(),
        "the permits taken stay taken"
    );
    assert_eq!(limiter.available_permits().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn available_permits_reads_without_changing_the_next_decision() {
    let clock = manual_clock();
    let prefix = unique_prefix("limiter");
    let store = redis_common::standalone(&prefix, client(&clock)).await;
    let limiter = store.rate_limiter("reader");
    limiter
        .try_set_rate(RateType::Overall, 5, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 5);
    assert!(limiter.try_acquire(3).await.unwrap());
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    let state_key = format!("{prefix}:limiter:{{reader}}:state");
    let before: Option<String> = redis::cmd("GET").arg(&state_key).query(&mut raw).unwrap();
    assert!(before.is_some(), "the acquisition wrote the state");
    for _ in 0..5 {
        assert_eq!(limiter.available_permits().await.unwrap(), 2);
    }
    let after: Option<String> = redis::cmd("GET").arg(&state_key).query(&mut raw).unwrap();
    assert_eq!(before, after, "reads write nothing");
    assert!(limiter.try_acquire(2).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn try_acquire_within_waits_for_the_permits_and_charges_nothing_when_denied() {
    let store = redis_common::standalone(&unique_prefix("limiter"), ClockMode::Redis).await;
    let limiter = store.rate_limiter("waiter");
    // One permit every 200 ms, two at once.
    limiter
        .try_set_rate(RateType::Overall, 2, Duration::from_millis(400))
        .await
        .unwrap();
    assert!(limiter.try_acquire(2).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap());
    // Due within 200 ms: waits (sleeping for the retry-after) and succeeds.
    assert!(limiter
        .try_acquire_within(1, Duration::from_secs(5))
        .await
        .unwrap());
    // Two permits are due 400 ms from now at the earliest: a 1 ms budget
    // gives up at once, and the denied attempt took nothing.
    assert!(!limiter
        .try_acquire_within(2, Duration::from_millis(1))
        .await
        .unwrap());
    assert!(limiter
        .try_acquire_within(2, Duration::from_secs(5))
        .await
        .unwrap());
    // acquire waits as long as needed.
    limiter.acquire(1).await.unwrap();
    assert!(!limiter.try_acquire(1).await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn per_client_limits_each_handle_separately() {
    let store = redis_common::standalone(&unique_prefix("limiter"), ClockMode::Redis).await;
    let a = store.rate_limiter("per-client");
    let b = store.rate_limiter("per-client");
    a.try_set_rate(RateType::PerClient, 3, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(a.try_acquire(3).await.unwrap());
    assert!(!a.try_acquire(1).await.unwrap());
    assert!(b.try_acquire(3).await.unwrap(), "b has its own permits");
    assert!(!b.try_acquire(1).await.unwrap());
    assert_eq!(
        a.clone().available_permits().await.unwrap(),
        0,
        "clones share a client id"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn limiter_errors_and_delete() {
    let store = redis_common::standalone(&unique_prefix("limiter"), ClockMode::Redis).await;
    let limiter = store.rate_limiter("errors");
    assert!(matches!(
        limiter.try_acquire(1).await,
        Err(RateLimiterError::NotInitialized { .. })
    ));
    assert!(matches!(
        limiter
            .try_set_rate(RateType::Overall, 0, Duration::from_secs(1))
            .await,
        Err(RateLimiterError::InvalidRate(_))
    ));
    limiter
        .try_set_rate(RateType::Overall, 4, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(
        limiter.try_acquire(5).await,
        Err(RateLimiterError::PermitsAboveRate {
            permits: 5,
            rate: 4
        })
    ));
    assert!(matches!(
        limiter.try_acquire(0).await,
        Err(RateLimiterError::ZeroPermits)
    ));
    assert!(limiter.try_acquire(1).await.unwrap());
    assert!(limiter.delete().await.unwrap());
    assert_eq!(limiter.config().await.unwrap(), None);
    assert!(matches!(
        limiter.try_acquire(1).await,
        Err(RateLimiterError::NotInitialized { .. })
    ));
    assert!(!limiter.delete().await.unwrap(), "nothing left to delete");
}

/// A configuration that expired (keep-alive) is restored by a handle that
/// knew it, so a long-idle limiter keeps working.
#[tokio::test(flavor = "multi_thread")]
async fn expired_configuration_is_restored_by_a_handle_that_knew_it() {
    let prefix = unique_prefix("limiter");
    let store = redis_common::standalone(&prefix, ClockMode::Redis).await;
    let limiter = store
        .rate_limiter("idle")
        .keep_alive(Duration::from_secs(60));
    limiter
        .try_set_rate(RateType::Overall, 2, Duration::from_secs(60))
        .await
        .unwrap();
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    let config_key = format!("{prefix}:limiter:{{idle}}:config");
    let ttl: i64 = redis::cmd("PTTL").arg(&config_key).query(&mut raw).unwrap();
    assert!(
        ttl > 0 && ttl <= 60_000,
        "the configuration has a TTL: {ttl}"
    );
    let _: i64 = redis::cmd("DEL").arg(&config_key).query(&mut raw).unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    assert_eq!(limiter.config().await.unwrap().map(|c| c.rate), Some(2));
    // A fresh handle that never saw it cannot invent one.
    let stranger = store.rate_limiter("never-set");
    assert!(matches!(
        stranger.try_acquire(1).await,
        Err(RateLimiterError::NotInitialized { .. })
    ));
}

/// The limiter works on the Cluster (its keys share a hash tag).
#[tokio::test(flavor = "multi_thread")]
async fn limiter_on_the_cluster() {
    let store = redis_common::cluster(&unique_prefix("limiter-cluster"), ClockMode::Redis).await;
    let limiter = store.rate_limiter("odd {name}\nwith braces");
    assert!(limiter
        .try_set_rate(RateType::Overall, 3, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(limiter.try_acquire(3).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap());
    assert_eq!(limiter.available_permits().await.unwrap(), 0);
    assert!(limiter.delete().await.unwrap());
}

include!("../../../crates/portcullis-core/tests/common/cl_throttle_known.rs");

/// `RedisStore::throttle` gives redis-cell 0.5's replies, rounding included.
#[tokio::test(flavor = "multi_thread")]
async fn known_cl_throttle_replies_from_redis() {
    let clock = manual_clock();
    let start = clock.now_micros();
    let store = redis_common::standalone(&unique_prefix("cell-known"), client(&clock)).await;
    for (i, &(key, max_burst, count, period, qty, at_ms, expected)) in KNOWN.iter().enumerate() {
        clock.set(start + at_ms * 1_000);
        let reply = store
            .throttle(key, max_burst, count, period, qty)
            .await
            .unwrap();
        assert_eq!(reply.to_array(), expected, "row {i}");
    }
}

/// Random `CL.THROTTLE` sequences: the Redis script and the in-memory
/// function give the same replies, on random arguments, quantities (peeks
/// and quantities above the burst included) and whole-millisecond times.
#[test]
fn random_throttle_sequences_match_memory() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};

    let runtime = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    let clock = manual_clock();
    let store = runtime.block_on(redis_common::standalone(
        &unique_prefix("cell-random"),
        client(&clock),
    ));
    let case = (
        0u64..=20,
        1u64..=120,
        1u64..=120,
        prop::collection::vec((0u64..=5_000, 0u64..=23), 1..30),
    );
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let n = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&case, |(max_burst, count, period, calls)| {
            let key = format!("k{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            let mut state = None;
            for (i, (step_ms, qty)) in calls.into_iter().enumerate() {
                clock.advance(Duration::from_millis(step_ms));
                let now = clock.now_micros();
                let from_redis = runtime
                    .block_on(store.throttle(&key, max_burst, count, period, qty))
                    .map_err(|e| TestCaseError::fail(format!("call {i}: {e}")))?;
                let (from_memory, next) =
                    throttle(state.as_ref(), now, max_burst, count, period, qty)
                        .map_err(|e| TestCaseError::fail(format!("call {i}: {e}")))?;
                if next.is_some() {
                    state = next;
                }
                prop_assert_eq!(from_redis, from_memory, "call {}", i);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("Redis and memory throttle disagree: {e}"));
}
