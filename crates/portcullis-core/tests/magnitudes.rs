//! Quotas as they are sold (ALGORITHMS.md, "Magnitudes"): a million or
//! u32::MAX per day, 10^9 and 10^10 per 30 days, 10^9 per hour, bursts as
//! large as the limit, periods up to a year. Accepted, never admitting
//! more than exact arithmetic would, with the stated undershoot bound; and
//! what is still refused names its policy and the largest value accepted.

use std::time::Duration;

use portcullis_core::algorithms::{self, State};
use portcullis_core::{Algorithm, LeakyMode, Policy, PolicyError, MAX_MAGNITUDE};
use proptest::prelude::*;

const DAY: Duration = Duration::from_secs(86_400);
const T0: u64 = 1_700_006_400_000_000; // a midnight UTC
const BUCKETS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket(LeakyMode::Meter),
    Algorithm::LeakyBucket(LeakyMode::Queue),
];

/// The quotas of issue 11, as `(limit, period)`.
fn sold() -> Vec<(u64, Duration)> {
    vec![
        (1_000_000, DAY),
        (u64::from(u32::MAX), DAY),
        (1_000_000_000, DAY * 30),
        (10_000_000_000, DAY * 30),
        (1_000_000_000, Duration::from_secs(3_600)),
        (u64::from(u32::MAX), DAY * 365),
    ]
}

#[test]
fn quotas_as_sold_are_accepted_by_every_algorithm_with_bursts_up_to_the_limit() {
    for (limit, period) in sold() {
        for algorithm in Algorithm::ALL {
            if algorithm == Algorithm::SlidingLog {
                continue;
            }
            let bursts: &[Option<u64>] = if algorithm.has_burst() {
                &[None, Some(1), Some(limit)]
            } else {
                &[None]
            };
            for &burst in bursts {
                let mut builder = Policy::per(limit, period).algorithm(algorithm);
                if let Some(burst) = burst {
                    builder = builder.burst(burst);
                }
                let policy = builder.build().unwrap_or_else(|e| {
                    panic!("{limit} per {period:?} with {algorithm} burst {burst:?}: {e}")
                });
                let (scale, increment) = algorithms::emission_interval(&policy);
                if algorithm.has_burst() && !policy.is_exact() {
                    // Rounded: every product within 2^52, the interval never
                    // shorter than exact, and rounded by less than one part
                    // in 2^16.
                    let capacity = u128::from(policy.capacity());
                    assert!(capacity * u128::from(increment) <= u128::from(MAX_MAGNITUDE));
                    let exact = u128::from(policy.period_micros()) * u128::from(scale);
                    let rounded = u128::from(increment) * u128::from(limit);
                    assert!(rounded >= exact);
                    assert!(rounded - exact < u128::from(limit));
                    assert!(increment >= 1 << 16, "{policy:?}");
                }
            }
        }
    }
}

#[test]
fn per_day_u32_max_rounds_its_interval_to_a_multiple_of_2_to_the_minus_15_us() {
    let policy = Policy::per_day(u64::from(u32::MAX)).build().unwrap();
    // 86 400 s / (2^32 − 1) = 20.1166… µs, rounded up to 659 180 / 2^15 µs.
    assert_eq!(algorithms::emission_interval(&policy), (1 << 15, 659_180));
    assert!(!policy.is_exact());
    // 10^6 per day is exact with a burst of 52 124 or less.
    let exact = Policy::per_day(1_000_000).burst(52_124).build().unwrap();
    assert!(exact.is_exact());
    assert_eq!(
        algorithms::emission_interval(&exact),
        (1_000_000, 86_400_000_000)
    );
}

/// A daily fixed window of u32::MAX: all of it at once, nothing more until
/// midnight, all of it again at midnight (exact: windows use no products).
#[test]
fn a_daily_window_of_u32_max_resets_at_midnight_exactly() {
    let limit = u64::from(u32::MAX);
    let policy = Policy::per_day(limit)
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    assert!(policy.is_exact());
    let midnight = T0 + 86_400_000_000;
    let first = algorithms::check(&policy, None, T0 + 1, limit);
    assert!(first.decision.is_allowed());
    let state = first.new_state;
    let late = algorithms::check(&policy, state.as_ref(), midnight - 1, 1);
    assert_eq!(late.decision.retry_after(), Some(Duration::from_micros(1)));
    let next = algorithms::check(&policy, state.as_ref(), midnight, limit);
    assert!(next.decision.is_allowed());
    assert_eq!(next.decision.remaining(), 0);
}

/// Greedy traffic on a bucket of `policy` from `T0` for `periods` periods,
/// charging everything that remains every `step` µs: the permits admitted.
fn greedy(policy: &Policy, periods: u64, steps_per_period: u64) -> u128 {
    let period = policy.period_micros();
    let step = period / steps_per_period;
    let mut state: Option<State> = None;
    let mut admitted = 0_u128;
    let mut now = T0;
    let end = T0 + periods * period;
    while now <= end {
        let peek = algorithms::check(policy, state.as_ref(), now, 0);
        let remaining = peek.decision.remaining();
        if remaining > 0 {
            let charge = algorithms::check(policy, state.as_ref(), now, remaining);
            assert!(charge.decision.is_allowed(), "{policy:?} at {now}");
            admitted += u128::from(remaining);
            state = charge.new_state;
        }
        now += step;
    }
    admitted
}

/// The undershoot bound: over `k` periods a greedy subject gets the burst
/// plus at least `k·L − k·L / increment − 2` (the rate lowered by less than
/// one part in `increment`, plus the rounding down of the last partial
/// permit), and never more than exact arithmetic allows, `B + k·L`.
fn assert_undershoot_bound(policy: &Policy, periods: u64) {
    let (_, increment) = algorithms::emission_interval(policy);
    let capacity = u128::from(policy.capacity());
    let limit = u128::from(policy.limit());
    let k = u128::from(periods);
    let admitted = greedy(policy, periods, 8);
    let most = capacity + k * limit;
    let least = most - (k * limit).div_ceil(u128::from(increment)) - 2;
    assert!(
        (least..=most).contains(&admitted),
        "{policy:?}: {admitted} admitted in {periods} periods, expected {least}..={most}"
    );
}

#[test]
fn sold_quotas_in_buckets_keep_the_undershoot_bound() {
    for (limit, period) in sold() {
        for algorithm in BUCKETS {
            let policy = Policy::per(limit, period)
                .algorithm(algorithm)
                .build()
                .unwrap();
            assert_undershoot_bound(&policy, 3);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any accepted bucket policy, exact or rounded, keeps the bound.
    #[test]
    fn any_bucket_policy_keeps_the_undershoot_bound(
        algorithm in prop::sample::select(BUCKETS.to_vec()),
        limit in prop_oneof![1_u64..=1_000, 1_u64..=1 << 34],
        period in prop_oneof![Just(86_400_000_000_u64), Just(3_600_000_000), 1_000_u64..=1 << 45],
        burst in prop::option::of(1_u64..=1 << 34),
    ) {
        let mut builder = Policy::per(limit, Duration::from_micros(period)).algorithm(algorithm);
        if let Some(burst) = burst {
            builder = builder.burst(burst);
        }
        if let Ok(policy) = builder.build() {
            // Steps shorter than the time to fill the bucket, so that
            // nothing refilled is lost to the cap.
            let fill = u128::from(policy.capacity()) * u128::from(period) / u128::from(limit);
            prop_assume!(fill >= u128::from(period / 8));
            assert_undershoot_bound(&policy, 2);
        }
    }
}

#[test]
fn a_refused_policy_names_itself_and_the_largest_value_accepted() {
    let error = Policy::per(1 << 40, Duration::from_secs(1))
        .name("daily")
        .build()
        .unwrap_err();
    let PolicyError::TooLarge {
        ref policy,
        field,
        value,
        max,
        ..
    } = error
    else {
        panic!("{error:?}")
    };
    assert_eq!((policy.as_str(), field, value), ("daily", "limit", 1 << 40));
    let message = error.to_string();
    assert!(message.starts_with("policy \"daily\": limit"), "{message}");
    assert!(
        message.contains(&format!("the largest limit accepted is {max}")),
        "{message}"
    );
    assert!(Policy::per(max, Duration::from_secs(1)).build().is_ok());
    assert!(Policy::per(max + 1, Duration::from_secs(1))
        .build()
        .is_err());

    // A burst: the largest burst accepted, the limit unchanged.
    let error = Policy::per(1, DAY * 365)
        .burst(u64::from(u32::MAX))
        .name("yearly")
        .build()
        .unwrap_err();
    let PolicyError::TooLarge { field, max, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(*field, "burst");
    assert!(
        error.to_string().starts_with("policy \"yearly\": burst"),
        "{error}"
    );
    assert!(Policy::per(1, DAY * 365).burst(*max).build().is_ok());
    assert!(Policy::per(1, DAY * 365).burst(max + 1).build().is_err());

    // An unnamed policy is called by its default name.
    let error = Policy::per(1 << 40, Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("policy \"gcra-1099511627776-per-1s\""),
        "{error}"
    );

    // A sliding window whose period has no power of ten to count in.
    let error = Policy::per(1 << 40, Duration::from_micros(7_000_013))
        .algorithm(Algorithm::SlidingWindow)
        .name("odd")
        .build()
        .unwrap_err();
    let PolicyError::TooLarge { max, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(*max, MAX_MAGNITUDE / 7_000_013);
    assert!(error.to_string().contains("policy \"odd\""), "{error}");
}
