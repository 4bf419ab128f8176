//! Property tests of post-charging (`algorithms::charge`) over random GCRA
//! and token-bucket policies (limits 1..=1000, periods 1 ms..=1 day,
//! bursts 1..=1000) and random mixes of checks and charges (costs up to
//! three times the capacity) at random, forward-moving times.
//!
//! The invariants, with `F` the policy's full reset (`ceil(B·I / S)` µs)
//! and `i` one emission interval (`ceil(I / S)` µs):
//!
//! - (a) **The debt bound.** Right after any charge, `reset_after ≤ 2·F`
//!   and, when denied, `retry_after ≤ F + i`.
//! - (b) **A charge that fits is an admission.** A charge of `c ≤
//!   remaining` leaves the same state and `reset_after` as a check of `c`.
//! - (c) **A charge never forgives.** `reset_after` after a charge is at
//!   least the peek's `reset_after` before it.
//! - (d) **The debt is paid by waiting, exactly.** After a denied charge,
//!   a cost-1 check `retry_after − 1 µs` later is denied and `retry_after`
//!   later admitted.
//! - (e) GCRA and the token bucket with equal parameters agree on every
//!   decision of the same mix.

use std::time::Duration;

use portcullis_core::algorithms::{self, State, Step};
use portcullis_core::{Algorithm, Policy};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000_000;

#[derive(Debug, Clone, Copy)]
struct Op {
    forward: u64,
    charge: bool,
    cost: u64,
}

fn policy(algorithm: Algorithm, limit: u64, period_ms: u64, burst: u64) -> Policy {
    Policy::per(limit, Duration::from_millis(period_ms))
        .algorithm(algorithm)
        .burst(burst)
        .build()
        .unwrap()
}

fn apply(state: &mut Option<State>, step: &Step) {
    if let Some(new) = &step.new_state {
        *state = Some(new.clone());
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

fn case() -> impl Strategy<Value = (u64, u64, u64, Vec<Op>)> {
    (1..=1000_u64, 1..=86_400_000_u64, 1..=1000_u64).prop_flat_map(|(limit, period, burst)| {
        let ops = prop::collection::vec(
            (
                0..=2 * period * 1000 / limit.max(1) + 10,
                any::<bool>(),
                0..=3 * burst,
            )
                .prop_map(|(forward, charge, cost)| Op {
                    forward,
                    charge,
                    cost,
                }),
            1..40,
        );
        (Just(limit), Just(period), Just(burst), ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn post_charging_keeps_its_bounds((limit, period, burst, ops) in case()) {
        let policies = [Algorithm::Gcra, Algorithm::TokenBucket]
            .map(|algorithm| policy(algorithm, limit, period, burst));
        let mut decisions: [Vec<_>; 2] = [Vec::new(), Vec::new()];
        for (policy, decisions) in policies.iter().zip(decisions.iter_mut()) {
            let (scale, increment) = algorithms::emission_interval(policy);
            let full = u128::from(policy.capacity()) * u128::from(increment);
            let full_reset = u64::try_from(full.div_ceil(u128::from(scale))).unwrap();
            let interval = increment.div_ceil(scale);
            let mut state: Option<State> = None;
            let mut now = T0;
            for op in &ops {
                now += op.forward;
                if !op.charge {
                    let cost = op.cost.clamp(1, policy.capacity());
                    let step = algorithms::check(policy, state.as_ref(), now, cost);
                    apply(&mut state, &step);
                    decisions.push(step.decision);
                    continue;
                }
                let before = algorithms::check(policy, state.as_ref(), now, 0);
                let step = algorithms::charge(policy, state.as_ref(), now, op.cost).unwrap();
                // (a)
                prop_assert!(micros(step.decision.reset_after()) <= 2 * full_reset);
                if let Some(retry) = step.decision.retry_after() {
                    prop_assert!(micros(retry) <= full_reset + interval, "{retry:?}");
                }
                // (b)
                if op.cost <= before.decision.remaining() && before.decision.is_allowed() {
                    let checked = algorithms::check(policy, state.as_ref(), now, op.cost);
                    prop_assert_eq!(&checked.new_state, &step.new_state.clone().or(checked.new_state.clone()));
                    prop_assert_eq!(checked.decision.reset_after(), step.decision.reset_after());
                }
                // (c)
                prop_assert!(step.decision.reset_after() >= before.decision.reset_after());
                apply(&mut state, &step);
                decisions.push(step.decision);
                // (d)
                if let Some(retry) = step.decision.retry_after() {
                    let retry = micros(retry);
                    let early = algorithms::check(policy, state.as_ref(), now + retry - 1, 1);
                    prop_assert!(!early.decision.is_allowed());
                    let due = algorithms::check(policy, state.as_ref(), now + retry, 1);
                    prop_assert!(due.decision.is_allowed());
                }
            }
        }
        // (e)
        let [gcra, bucket] = decisions;
        for (a, b) in gcra.iter().zip(&bucket) {
            prop_assert_eq!(a.is_allowed(), b.is_allowed());
            prop_assert_eq!(a.remaining(), b.remaining());
        }
    }
}
