//! Policies with extreme values — limit 1 and u32::MAX, period 1 µs, 1 s
//! and 1 year, burst 1 and u32::MAX, cost at the capacity and one above —
//! are either refused when built, with an error naming the field, or
//! handled exactly and identically by `MemoryStore` and `RedisStore` (one
//! shared manual clock), and the layer's headers for them stay valid
//! structured fields.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use portcullis_core::{
    Algorithm, ManualClock, MemoryStore, Policy, PolicyError, Store, StoreError, Verdict,
};
use portcullis_redis::{ClockMode, RedisStore};
use portcullis_tests::reliability::{probe_service, request_for, subject_key};
use portcullis_tower::RateLimitLayer;
use tower::{Layer, ServiceExt};

const LIMITS: [u64; 2] = [1, u32::MAX as u64];
const YEAR: Duration = Duration::from_secs(365 * 86_400);
const PERIODS: [Duration; 3] = [Duration::from_micros(1), Duration::from_secs(1), YEAR];

/// Every combination, with what building it gave.
fn combinations() -> Vec<(String, Result<Policy, PolicyError>)> {
    let mut all = Vec::new();
    for (a, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for limit in LIMITS {
            for period in PERIODS {
                let bursts: &[Option<u64>] = if algorithm.has_burst() {
                    &[None, Some(1), Some(u64::from(u32::MAX))]
                } else {
                    &[None]
                };
                for burst in bursts {
                    let name = format!(
                        "x{a}-{limit}-{}us-{}",
                        period.as_micros(),
                        burst.map_or(0, |b| b)
                    );
                    let mut builder = Policy::per(limit, period)
                        .algorithm(algorithm)
                        .name(name.clone());
                    if let Some(burst) = burst {
                        builder = builder.burst(*burst);
                    }
                    all.push((name, builder.build()));
                }
            }
        }
    }
    all
}

#[test]
fn extreme_policies_are_refused_with_the_field_named_or_built() {
    let mut built = 0;
    for (name, result) in combinations() {
        match result {
            Ok(policy) => {
                built += 1;
                // Built policies are exact in Lua's doubles: every product
                // the algorithm forms is at most 2^52 (ALGORITHMS.md,
                // "Magnitudes").
                let (scale, increment) = portcullis_core::algorithms::emission_interval(&policy);
                let period = u128::from(policy.period_micros());
                let product = match policy.algorithm() {
                    Algorithm::SlidingWindow => {
                        u128::from(policy.limit()) * period
                            / u128::from(portcullis_core::algorithms::weight_unit_micros(&policy))
                    }
                    Algorithm::FixedWindow | Algorithm::SlidingLog => u128::from(policy.limit()),
                    _ => u128::from(policy.capacity()) * u128::from(increment),
                };
                assert!(product <= 1 << 52, "{name}");
                // A rounded bucket interval is never shorter than exact.
                assert!(
                    u128::from(increment) * u128::from(policy.limit())
                        >= period * u128::from(scale),
                    "{name}"
                );
            }
            Err(error) => {
                let message = error.to_string();
                assert!(
                    ["limit", "period", "burst"]
                        .iter()
                        .any(|field| message.contains(field)),
                    "{name}: the error names the field: {message}"
                );
                assert!(
                    matches!(
                        error,
                        PolicyError::TooLarge { .. } | PolicyError::SlidingLogLimit { .. }
                    ),
                    "{name}: only size errors are expected here: {error:?}"
                );
            }
        }
    }
    assert!(built >= 40, "most extreme combinations are valid: {built}");
    // The expected refusals, spelled out.
    let refused = |limit, period, algorithm| {
        Policy::per(limit, period)
            .algorithm(algorithm)
            .build()
            .unwrap_err()
    };
    assert!(matches!(
        refused(1 << 40, Duration::from_secs(1), Algorithm::Gcra),
        PolicyError::TooLarge { field: "limit", .. }
    ));
    assert!(matches!(
        refused(
            u64::from(u32::MAX),
            Duration::from_secs(1),
            Algorithm::SlidingLog
        ),
        PolicyError::SlidingLogLimit { .. }
    ));
    assert!(matches!(
        Policy::per(1, YEAR)
            .burst(u64::from(u32::MAX))
            .build()
            .unwrap_err(),
        PolicyError::TooLarge { field: "burst", .. }
    ));
    assert!(matches!(
        Policy::per(0, YEAR).build().unwrap_err(),
        PolicyError::ZeroLimit
    ));
    assert!(matches!(
        Policy::per(1, Duration::ZERO).build().unwrap_err(),
        PolicyError::ZeroPeriod
    ));
    assert!(matches!(
        Policy::per(1, Duration::from_nanos(1_500))
            .build()
            .unwrap_err(),
        PolicyError::SubMicrosecondPeriod { .. }
    ));
    assert!(matches!(
        Policy::per(1, YEAR).burst(0).build().unwrap_err(),
        PolicyError::ZeroBurst
    ));
}

fn same(memory: &Result<Verdict, StoreError>, redis: &Result<Verdict, StoreError>) -> bool {
    match (memory, redis) {
        (Ok(a), Ok(b)) => a == b,
        (
            Err(StoreError::CostTooHigh {
                cost: a,
                capacity: c,
                ..
            }),
            Err(StoreError::CostTooHigh {
                cost: b,
                capacity: d,
                ..
            }),
        ) => a == b && c == d,
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn extreme_policies_decide_identically_in_memory_and_redis() {
    // One clock for both stores, ahead of real time so Redis never expires
    // a key before the memory store would forget it.
    let start = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(3_600);
    let clock = ManualClock::new(u64::try_from(start.as_micros()).unwrap());
    let memory = MemoryStore::with_clock(clock.clone());
    let redis = RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .prefix(portcullis_tests::unique_prefix("extreme"))
        .clock(ClockMode::Client(Arc::new(clock.clone())))
        .client_clock_tolerance(Duration::MAX)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let mut compared = 0;
    let mut mismatches = Vec::new();
    for (name, policy) in combinations() {
        let Ok(policy) = policy else { continue };
        let policies = [policy.clone()];
        let capacity = policy.capacity();
        let period = policy.period();
        let subject = format!("extreme-{name}");
        // Each combination from the same start: years of steps summed over
        // all of them would pass 2^53 µs (the year 2255), beyond the times
        // the scripts compute exactly.
        clock.set(u64::try_from(start.as_micros()).unwrap());
        // (time step before the call, cost)
        let steps: [(Duration, u64); 12] = [
            (Duration::ZERO, capacity),
            (Duration::ZERO, 1),
            (Duration::ZERO, 0),
            (Duration::ZERO, capacity + 1),
            (Duration::from_micros(1), 1),
            (period / 2, 1),
            (period, capacity),
            (period, 1),
            (Duration::from_micros(1), capacity),
            (period * 2, 1),
            (period * 3, capacity),
            (YEAR, 1),
        ];
        for (i, (step, cost)) in steps.into_iter().enumerate() {
            clock.advance(step);
            let want = memory.check(&subject, &policies, cost).await;
            let got = redis.check(&subject, &policies, cost).await;
            if !same(&want, &got) {
                mismatches.push(format!(
                    "{name} step {i} (cost {cost}): memory {want:?}, redis {got:?}"
                ));
            }
            compared += 1;
        }
        redis.reset(&subject, &policies).await.unwrap();
    }
    assert!(compared > 400, "{compared} decisions compared");
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[tokio::test]
async fn extreme_policies_give_valid_rate_limit_headers() {
    let mut checked = 0;
    for (name, policy) in combinations() {
        let Ok(policy) = policy else { continue };
        checked += 1;
        let capacity = policy.capacity();
        let period = policy.period();
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .policy(policy)
            .key(subject_key())
            .cost(move |_| capacity)
            .legacy_headers(true)
            .build()
            .unwrap();
        let service = layer.layer(probe_service());
        for _ in 0..2 {
            let response = service.clone().oneshot(request_for("s")).await.unwrap();
            for header in ["ratelimit-policy", "ratelimit"] {
                let Some(value) = response.headers().get(header) else {
                    panic!("{name}: {header} missing on {}", response.status())
                };
                let text = value.to_str().unwrap();
                let list = sfv::Parser::new(text)
                    .parse::<sfv::List>()
                    .unwrap_or_else(|e| {
                        panic!("{name}: {header}: {text:?} is not a structured field: {e}")
                    });
                assert_eq!(list.len(), 1, "{name}: {text}");
            }
            if let Some(retry) = response.headers().get("retry-after") {
                let secs: u64 = retry.to_str().unwrap().parse().unwrap();
                // A full refill, or two windows for the sliding window's
                // estimate.
                let full = 2 * u128::from(capacity) * period.as_micros();
                assert!(
                    u128::from(secs) <= full.div_ceil(1_000_000),
                    "{name}: retry-after {secs} s is longer than two full refills"
                );
            }
        }
    }
    // As many valid policies as the memory/Redis comparison needs for its
    // 400 decisions (12 per policy).
    assert!(checked > 400 / 12, "{checked} policies checked");
}
