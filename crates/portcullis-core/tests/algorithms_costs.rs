//! Cost edge cases and wild inputs, for every algorithm: cost = capacity on
//! a new key, cost 0 peeks, cost above capacity, times at the ends of the
//! `u64` range, and states no well-behaved store would hold.

use std::collections::VecDeque;
use std::time::Duration;

use portcullis_core::algorithms::{
    self, FixedWindowState, GcraState, LeakyMeterState, LeakyQueueState, SlidingLogState,
    SlidingWindowState, State, Step, TokenBucketState,
};
use portcullis_core::{Algorithm, LeakyMode, Policy, MAX_MAGNITUDE};

const T0: u64 = 1_700_000_000_000_000;

const ALGORITHMS: [Algorithm; 7] = Algorithm::ALL;

/// A few policies per algorithm: small, fractional rates, a burst unlike the
/// limit, and products right at `MAX_MAGNITUDE`.
fn policies(algorithm: Algorithm) -> Vec<Policy> {
    let mut specs: Vec<(u64, Duration, Option<u64>)> = vec![
        (1, Duration::from_micros(1), None),
        (3, Duration::from_secs(1), None),
        (7, Duration::from_secs(86_400), None),
        (1_000, Duration::from_micros(999), None),
    ];
    if algorithm != Algorithm::SlidingLog {
        // limit × period = 2^52 exactly.
        specs.push((1 << 20, Duration::from_micros(1 << 32), None));
        specs.push((MAX_MAGNITUDE, Duration::from_micros(1), None));
    }
    if algorithm.has_burst() {
        specs.push((10, Duration::from_secs(1), Some(1)));
        specs.push((2, Duration::from_secs(1), Some(50)));
        specs.push((1, Duration::from_micros(1 << 32), Some(1 << 20)));
    }
    specs
        .into_iter()
        .map(|(limit, period, burst)| {
            let builder = Policy::per(limit, period).algorithm(algorithm);
            let builder = match burst {
                Some(burst) => builder.burst(burst),
                None => builder,
            };
            builder.build().unwrap()
        })
        .collect()
}

/// Checks what every decision must satisfy, whatever the input.
fn assert_sane(policy: &Policy, now: u64, cost: u64, step: &Step) {
    let d = &step.decision;
    let context = format!("{policy:?} now={now} cost={cost}");
    assert_eq!(d.limit(), policy.capacity(), "{context}");
    assert!(d.remaining() <= policy.capacity(), "{context}");
    assert_eq!(d.retry_after().is_some(), !d.is_allowed(), "{context}");
    if let Some(retry) = d.retry_after() {
        assert!(retry >= Duration::from_micros(1), "{context}");
    }
    if !d.is_allowed() || cost == 0 {
        // Denials and peeks write nothing but a repair: a state clamped to
        // the policy's worst case, which reads back as itself, with the
        // same decision.
        if let Some(repaired) = &step.new_state {
            let again = algorithms::check(policy, Some(repaired), now, cost);
            assert_eq!(again.new_state, None, "a repair is final: {context}");
            assert_eq!(again.decision, step.decision, "{context}");
        }
    }
    // The state is never further ahead than the policy's full reset (at
    // most two periods for a sliding window) plus the clock tolerance (as
    // much again, at least a second: ALGORITHMS.md, "Changing a policy"),
    // and a retry is at most one full reset beyond that.
    let full_reset = (policy.capacity().saturating_mul(policy.period_micros()) / policy.limit())
        .max(2 * policy.period_micros())
        + 1;
    let bound = 2 * full_reset + full_reset.max(1_000_000);
    assert!(d.reset_after() <= Duration::from_micros(bound), "{context}");
    if let Some(retry) = d.retry_after().filter(|r| *r != Duration::MAX) {
        assert!(retry <= Duration::from_micros(bound), "{context}");
    }
    let reset = u64::try_from(d.reset_after().as_micros()).unwrap();
    assert_eq!(step.expires_at_us, now.saturating_add(reset), "{context}");
    if d.delay() > Duration::ZERO {
        assert_eq!(policy.algorithm(), Algorithm::LeakyBucket(LeakyMode::Queue));
    }
}

#[test]
fn cost_equal_to_capacity_is_admitted_on_a_new_key() {
    for algorithm in ALGORITHMS {
        for policy in policies(algorithm) {
            let step = algorithms::check(&policy, None, T0, policy.capacity());
            assert_sane(&policy, T0, policy.capacity(), &step);
            assert!(step.decision.is_allowed(), "{policy:?}");
            assert_eq!(step.decision.remaining(), 0, "{policy:?}");
            assert!(step.new_state.is_some(), "{policy:?}");
            // And then nothing more at the same instant.
            let next = algorithms::check(&policy, step.new_state.as_ref(), T0, 1);
            assert!(!next.decision.is_allowed(), "{policy:?}");
        }
    }
}

#[test]
fn peek_on_a_new_key_reports_full_capacity_and_writes_nothing() {
    for algorithm in ALGORITHMS {
        for policy in policies(algorithm) {
            let step = algorithms::check(&policy, None, T0, 0);
            assert_sane(&policy, T0, 0, &step);
            assert!(step.decision.is_allowed(), "{policy:?}");
            assert_eq!(step.decision.remaining(), policy.capacity(), "{policy:?}");
            assert_eq!(step.decision.reset_after(), Duration::ZERO, "{policy:?}");
            assert_eq!(step.decision.delay(), Duration::ZERO, "{policy:?}");
            assert_eq!(step.expires_at_us, T0, "{policy:?}");
        }
    }
}

#[test]
fn peek_changes_nothing_after_traffic() {
    for algorithm in ALGORITHMS {
        for policy in policies(algorithm) {
            let cost = policy.capacity().div_ceil(2);
            let first = algorithms::check(&policy, None, T0, cost);
            let state = first.new_state.clone();
            let peek = algorithms::check(&policy, state.as_ref(), T0 + 1, 0);
            assert_sane(&policy, T0 + 1, 0, &peek);
            // The peek predicts a cost-1 request at the same instant.
            let real = algorithms::check(&policy, state.as_ref(), T0 + 1, 1);
            assert_eq!(
                peek.decision.is_allowed(),
                real.decision.is_allowed(),
                "{policy:?}"
            );
            if real.decision.is_allowed() {
                assert_eq!(
                    peek.decision.remaining(),
                    real.decision.remaining() + 1,
                    "{policy:?}"
                );
            } else {
                assert_eq!(peek.decision, real.decision, "{policy:?}");
            }
        }
    }
}

#[test]
fn cost_above_capacity_is_denied_forever_without_panicking() {
    for algorithm in ALGORITHMS {
        for policy in policies(algorithm) {
            let used = algorithms::check(&policy, None, T0, 1).new_state;
            for state in [None, used] {
                for cost in [policy.capacity() + 1, u64::MAX] {
                    for now in [0, T0, u64::MAX] {
                        let step = algorithms::check(&policy, state.as_ref(), now, cost);
                        assert_sane(&policy, now, cost, &step);
                        assert!(!step.decision.is_allowed(), "{policy:?}");
                        assert_eq!(
                            step.decision.retry_after(),
                            Some(Duration::MAX),
                            "{policy:?}"
                        );
                        // remaining and reset_after describe the state, as a peek.
                        let peek = algorithms::check(&policy, state.as_ref(), now, 0);
                        assert_eq!(
                            step.decision.remaining(),
                            peek.decision.remaining(),
                            "{policy:?}"
                        );
                        assert_eq!(
                            step.decision.reset_after(),
                            peek.decision.reset_after(),
                            "{policy:?}"
                        );
                    }
                }
            }
        }
    }
}

/// States no store writes for these policies: extreme fields, unsorted logs.
fn wild_states() -> Vec<State> {
    let max = u64::MAX;
    vec![
        State::Gcra(GcraState {
            tat_us: max,
            tat_rem: max,
        }),
        State::Gcra(GcraState {
            tat_us: 0,
            tat_rem: max,
        }),
        State::TokenBucket(TokenBucketState {
            level: max,
            last_us: max,
        }),
        State::TokenBucket(TokenBucketState {
            level: max,
            last_us: 0,
        }),
        State::LeakyMeter(LeakyMeterState {
            level: max,
            last_us: max,
        }),
        State::LeakyMeter(LeakyMeterState {
            level: max,
            last_us: 0,
        }),
        State::LeakyQueue(LeakyQueueState {
            free_us: max,
            free_rem: max,
        }),
        State::FixedWindow(FixedWindowState {
            window_start_us: max,
            count: max,
        }),
        State::FixedWindow(FixedWindowState {
            window_start_us: 0,
            count: max,
        }),
        State::SlidingWindow(SlidingWindowState {
            window_start_us: max,
            previous: max,
            current: max,
        }),
        State::SlidingWindow(SlidingWindowState {
            window_start_us: 0,
            previous: max,
            current: max,
        }),
        State::SlidingLog(SlidingLogState {
            entries: VecDeque::from([max, max, max]),
        }),
        State::SlidingLog(SlidingLogState {
            entries: VecDeque::from([max, 0, 7]),
        }),
        State::SlidingLog(SlidingLogState {
            entries: VecDeque::from(vec![0; 20_000]),
        }),
    ]
}

#[test]
fn wild_times_and_states_never_panic() {
    let nows = [
        0,
        1,
        999,
        T0,
        u64::MAX / 2,
        u64::MAX - (1 << 53),
        u64::MAX - 1,
        u64::MAX,
    ];
    let mut checked = 0;
    for algorithm in ALGORITHMS {
        for policy in policies(algorithm) {
            let costs = [0, 1, policy.capacity()];
            let mut states: Vec<Option<State>> = vec![None];
            states.extend(wild_states().into_iter().map(Some));
            for state in &states {
                for now in nows {
                    for cost in costs {
                        let step = algorithms::check(&policy, state.as_ref(), now, cost);
                        assert_sane(&policy, now, cost, &step);
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 5_000);
}

#[test]
fn a_new_key_works_at_the_ends_of_time() {
    for algorithm in ALGORITHMS {
        for policy in policies(algorithm) {
            for now in [0, 1] {
                let step = algorithms::check(&policy, None, now, 1);
                assert!(step.decision.is_allowed(), "{policy:?} at {now}");
            }
        }
    }
    // Near the end of `u64` microseconds (year 586 000), a GCRA key whose
    // next arrival time no longer fits is denied rather than wrapped.
    let policy = Policy::per(1, Duration::from_secs(1)).build().unwrap();
    let step = algorithms::check(&policy, None, u64::MAX - 10, 1);
    assert!(!step.decision.is_allowed());
    assert_eq!(step.new_state, None);
}

#[test]
fn a_state_of_another_algorithm_counts_as_none() {
    for algorithm in ALGORITHMS {
        for policy in policies(algorithm) {
            for state in wild_states() {
                let matches = matches!(
                    (&state, algorithm),
                    (State::Gcra(_), Algorithm::Gcra)
                        | (State::TokenBucket(_), Algorithm::TokenBucket)
                        | (
                            State::LeakyMeter(_),
                            Algorithm::LeakyBucket(LeakyMode::Meter)
                        )
                        | (
                            State::LeakyQueue(_),
                            Algorithm::LeakyBucket(LeakyMode::Queue)
                        )
                        | (State::FixedWindow(_), Algorithm::FixedWindow)
                        | (State::SlidingWindow(_), Algorithm::SlidingWindow)
                        | (State::SlidingLog(_), Algorithm::SlidingLog)
                );
                if matches {
                    continue;
                }
                for cost in [0, 1, policy.capacity()] {
                    let foreign = algorithms::check(&policy, Some(&state), T0, cost);
                    let fresh = algorithms::check(&policy, None, T0, cost);
                    assert_eq!(foreign, fresh, "{policy:?} with {state:?}");
                }
            }
        }
    }
}
