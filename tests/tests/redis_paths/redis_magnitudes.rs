//! Quotas as they are sold, in Redis (ALGORITHMS.md, "Magnitudes"): a
//! million and u32::MAX per day, 10^9 per 30 days, 10^9 per hour, on the
//! Redis clock and, with a client clock, at the last microsecond of a
//! period and the first of the next — decided as `MemoryStore` decides.

use crate::redis_common;

use std::time::Duration;

use portcullis_core::{Algorithm, Clock, MemoryStore, Policy, Store};
use portcullis_redis::ClockMode;
use portcullis_tests::unique_prefix;
use redis_common::{client, manual_clock};

const DAY: Duration = Duration::from_secs(86_400);

fn sold(algorithm: Algorithm) -> Vec<Policy> {
    [
        (1_000_000, DAY),
        (u64::from(u32::MAX), DAY),
        (1_000_000_000, DAY * 30),
        (1_000_000_000, Duration::from_secs(3_600)),
    ]
    .into_iter()
    .map(|(limit, period)| {
        Policy::per(limit, period)
            .algorithm(algorithm)
            .name("quota")
            .build()
            .expect("accepted")
    })
    .collect()
}

/// The longest a subject can wait: the full reset (two periods for a
/// sliding window).
fn full_reset(policy: &Policy) -> Duration {
    let (scale, increment) = portcullis_core::algorithms::emission_interval(policy);
    match policy.algorithm() {
        Algorithm::SlidingWindow => policy.period() * 2,
        Algorithm::FixedWindow | Algorithm::SlidingLog => policy.period(),
        _ => Duration::from_micros(
            (u128::from(policy.capacity()) * u128::from(increment))
                .div_ceil(u128::from(scale))
                .try_into()
                .unwrap(),
        ),
    }
}

/// On the Redis clock: the whole quota at once, then nothing, with a retry
/// and a reset within the policy's full reset.
#[tokio::test(flavor = "multi_thread")]
async fn sold_quotas_on_the_redis_clock() {
    let store = redis_common::standalone(&unique_prefix("sold"), ClockMode::Redis).await;
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::SlidingLog {
            continue;
        }
        for (i, policy) in sold(algorithm).into_iter().enumerate() {
            let subject = format!("{algorithm}-{i}");
            let policies = [policy.clone()];
            let all = store
                .check(&subject, &policies, policy.capacity())
                .await
                .unwrap();
            assert!(all.is_allowed(), "{policy:?}: {all:?}");
            // The whole quota again at once is refused (it comes back over
            // the full reset), its retry and reset within that.
            let denied = store
                .check(&subject, &policies, policy.capacity())
                .await
                .unwrap();
            let decision = denied.binding();
            assert!(!decision.is_allowed(), "{policy:?}: {decision:?}");
            let bound = full_reset(&policy);
            let retry = decision.retry_after().unwrap();
            assert!(
                (Duration::from_micros(1)..=bound).contains(&retry),
                "{policy:?}: {decision:?}"
            );
            assert!(decision.reset_after() <= bound, "{policy:?}: {decision:?}");
        }
    }
}

/// With a client clock: at the last microsecond of a period and the first
/// of the next, both stores decide the same, and the quota comes back
/// whole exactly when the arithmetic says.
#[tokio::test(flavor = "multi_thread")]
async fn sold_quotas_at_a_period_end_match_memory() {
    let clock = manual_clock();
    let redis = redis_common::standalone(&unique_prefix("sold-end"), client(&clock)).await;
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::SlidingLog {
            continue;
        }
        for (i, policy) in sold(algorithm).into_iter().enumerate() {
            let memory = MemoryStore::builder().clock(clock.clone()).build();
            let period = policy.period_micros();
            // A period start (midnight UTC for a day), a day ahead of real
            // time like every client-clock test.
            let start = clock.now_micros().div_ceil(period) * period;
            clock.set(start);
            let subject = format!("{algorithm}-{i}");
            let policies = [policy.clone()];
            let capacity = policy.capacity();
            let reset = u64::try_from(full_reset(&policy).as_micros()).unwrap();
            // (µs after start, cost): the whole quota, none of it again,
            // the last microsecond before it is back whole, and the first.
            let steps = [
                (0, capacity),
                (1, capacity),
                (reset - 1, capacity),
                (reset, capacity),
            ];
            let mut decisions = Vec::new();
            for (at, cost) in steps {
                clock.set(start + at);
                let a = redis.check(&subject, &policies, cost).await.unwrap();
                let b = memory.check(&subject, &policies, cost).await.unwrap();
                assert_eq!(a, b, "{policy:?} at +{at} µs, cost {cost}");
                decisions.push(*a.binding());
            }
            let allowed: Vec<bool> = decisions.iter().map(|d| d.is_allowed()).collect();
            assert_eq!(
                allowed,
                [true, false, false, true],
                "{policy:?}: {decisions:?}"
            );
            assert_eq!(
                decisions[2].retry_after(),
                Some(Duration::from_micros(1)),
                "{policy:?}: {decisions:?}"
            );
        }
    }
}
