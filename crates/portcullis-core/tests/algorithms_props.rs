//! Property tests of the algorithms over random policies (limits 1..=1000,
//! periods 1 µs..=1 day, bursts 1..=1000), random costs (1..=capacity) and
//! random time steps, each against the public `algorithms::check`.
//!
//! The invariants, stated precisely:
//!
//! - (a) **Windows.** Fixed window: the permits admitted in any aligned
//!   window `[k·P, (k+1)·P)` sum to at most `L`. Sliding log: the permits
//!   admitted in any interval `(t − P, t]` sum to at most `L`. Sliding
//!   window counter: right after each admission at time `t` (aligned window
//!   start `ws`, `e = t − ws`), with `prev` the permits admitted in
//!   `[ws − P, ws)` and `curr` those admitted in `[ws, t]` — both recounted
//!   from the history, not read from the state — the estimate
//!   `prev·(P − e)/P + curr` is at most `L` (checked exactly, scaled by `P`).
//! - (b) **Buckets** (GCRA, token bucket, leaky meter, leaky queue): the
//!   permits admitted at times within any closed interval of length `T`
//!   sum to at most `B + ceil(L·T / P)`.
//! - (c) `remaining ≤ B` in every decision, including peeks after any idle
//!   time, and a peek at or after `expires_at` reports `remaining = B`.
//! - (d) Peeks change nothing: the same requests with peeks interleaved get
//!   the same decisions and leave the same states; each peek predicts the
//!   cost-1 request at its instant.
//! - (e) `retry_after` is honest: with no other traffic, the same request
//!   `retry_after` later is admitted and `retry_after − 1 µs` later is not
//!   — also when the clock has gone back (from the state the denial left:
//!   a state further ahead than the policy can leave is clamped and the
//!   repair written).
//! - (f) `expires_at` is honest: from then on, the state decides exactly as
//!   no state does (so a store may forget it). (A peek of a state that
//!   needs a repair describes the repaired state, which peeks never write:
//!   (e) and (f) hold from the next charge, which writes it.)
//! - (g) GCRA, token bucket, leaky meter and leaky queue with equal
//!   parameters make identical decisions on the same traffic.

use std::time::Duration;

use portcullis_core::algorithms::{self, State, Step};
use portcullis_core::{Algorithm, Decision, LeakyMode, Policy};
use proptest::prelude::*;

const ALL: &[Algorithm] = &Algorithm::ALL;
const BUCKETS: &[Algorithm] = &[
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket(LeakyMode::Meter),
    Algorithm::LeakyBucket(LeakyMode::Queue),
];
const WINDOWS: &[Algorithm] = &[
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

/// One request in a generated sequence.
#[derive(Debug, Clone, Copy)]
struct Op {
    /// Microseconds the clock moves forward before the request.
    forward: u64,
    /// Microseconds the clock then moves back (0 unless the case lets the
    /// clock go back).
    back: u64,
    /// The request's cost, 1..=capacity.
    cost: u64,
    /// A peek somewhere in the `forward` gap, at this fraction (per mille).
    peek_permille: Option<u64>,
}

/// One `check` and what went into it.
#[derive(Debug, Clone)]
struct Record {
    now: u64,
    cost: u64,
    before: Option<State>,
    step: Step,
}

impl Record {
    /// The state after the step, as a store keeps it: the new one (an
    /// admission's, or a denial's repair), or the old one unchanged. Peeks
    /// write nothing, not even a repair.
    fn after(&self) -> Option<State> {
        if self.cost == 0 {
            return self.before.clone();
        }
        self.step.new_state.clone().or_else(|| self.before.clone())
    }
}

fn period_us() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..=1_000,
        1_000u64..=1_000_000,
        1_000_000u64..=86_400_000_000,
        Just(60_000_000u64),
    ]
}

fn policy(algorithms: &'static [Algorithm]) -> impl Strategy<Value = Policy> {
    (
        prop::sample::select(algorithms),
        prop_oneof![1u64..=10, 1u64..=1_000],
        period_us(),
        prop::option::of(prop_oneof![1u64..=10, 1u64..=1_000]),
    )
        .prop_map(|(algorithm, limit, period, burst)| {
            let builder = Policy::per(limit, Duration::from_micros(period)).algorithm(algorithm);
            let builder = match burst {
                Some(burst) if algorithm.has_burst() => builder.burst(burst),
                _ => builder,
            };
            builder
                .build()
                .expect("limits ≤ 1000 and periods ≤ 1 day make valid policies")
        })
}

fn ops(policy: &Policy, clock_back: bool) -> impl Strategy<Value = Vec<Op>> + use<> {
    let period = policy.period_micros();
    let capacity = policy.capacity();
    // One emission interval, at least 1 µs.
    let interval = (period / policy.limit()).max(1);
    let forward = prop_oneof![
        3 => Just(0u64),
        3 => 0..=2 * interval,
        2 => 0..=2 * period,
        1 => 0..=period / 8 + 1,
    ];
    let back = if clock_back {
        prop_oneof![3 => Just(0u64), 1 => 0..=2 * period].boxed()
    } else {
        Just(0u64).boxed()
    };
    let cost = prop_oneof![3 => Just(1u64), 2 => 1..=capacity, 1 => Just(capacity)];
    let peek = prop::option::of(0u64..=1_000);
    prop::collection::vec(
        (forward, back, cost, peek).prop_map(|(forward, back, cost, peek_permille)| Op {
            forward,
            back,
            cost,
            peek_permille,
        }),
        1..48,
    )
}

/// A policy, a start time and a sequence of requests.
fn case(
    algorithms: &'static [Algorithm],
    clock_back: bool,
) -> impl Strategy<Value = (Policy, u64, Vec<Op>)> {
    policy(algorithms).prop_flat_map(move |policy| {
        let start = prop_oneof![Just(0u64), 0u64..1 << 50, Just(1_700_000_000_000_000u64)];
        let ops = ops(&policy, clock_back);
        (Just(policy), start, ops)
    })
}

/// Runs the requests (and, with `peeks`, the peeks between them) as a store
/// would: each step's new state replaces the old.
fn run(policy: &Policy, start: u64, ops: &[Op], peeks: bool) -> Vec<Record> {
    let mut state: Option<State> = None;
    let mut now = start;
    let mut records = Vec::new();
    let mut check = |state: &mut Option<State>, now: u64, cost: u64| {
        let step = algorithms::check(policy, state.as_ref(), now, cost);
        let record = Record {
            now,
            cost,
            before: state.clone(),
            step,
        };
        *state = record.after();
        records.push(record);
    };
    for op in ops {
        if let (true, Some(permille)) = (peeks, op.peek_permille) {
            let at = now + op.forward * permille / 1_000;
            check(&mut state, at, 0);
        }
        now = (now + op.forward).saturating_sub(op.back);
        check(&mut state, now, op.cost);
    }
    records
}

fn admitted(records: &[Record]) -> Vec<(u64, u64)> {
    records
        .iter()
        .filter(|r| r.cost > 0 && r.step.decision.is_allowed())
        .map(|r| (r.now, r.cost))
        .collect()
}

fn summary(d: &Decision) -> (bool, u64, Option<Duration>, Duration) {
    (
        d.is_allowed(),
        d.remaining(),
        d.retry_after(),
        d.reset_after(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// (a)
    #[test]
    fn window_algorithms_never_admit_more_than_the_limit((policy, start, ops) in case(WINDOWS, false)) {
        let records = run(&policy, start, &ops, true);
        let admitted = admitted(&records);
        let (limit, period) = (u128::from(policy.limit()), u128::from(policy.period_micros()));
        for &(t, _) in &admitted {
            let t = u128::from(t);
            match policy.algorithm() {
                Algorithm::FixedWindow => {
                    let window = t / period;
                    let sum: u128 = admitted.iter()
                        .filter(|&&(u, _)| u128::from(u) / period == window)
                        .map(|&(_, c)| u128::from(c)).sum();
                    prop_assert!(sum <= limit, "window {window}: {sum} > {limit}");
                }
                Algorithm::SlidingLog => {
                    let sum: u128 = admitted.iter()
                        .filter(|&&(u, _)| u128::from(u) + period > t && u128::from(u) <= t)
                        .map(|&(_, c)| u128::from(c)).sum();
                    prop_assert!(sum <= limit, "({} − P, {t}]: {sum} > {limit}", t);
                }
                _ => {
                    let ws = t - t % period;
                    let e = t - ws;
                    let in_range = |from: u128, to: u128| -> u128 {
                        admitted.iter()
                            .filter(|&&(u, _)| (from..=to).contains(&u128::from(u)))
                            .map(|&(_, c)| u128::from(c)).sum()
                    };
                    let curr = in_range(ws, t);
                    let prev = if ws == 0 { 0 } else { in_range(ws.saturating_sub(period), ws - 1) };
                    prop_assert!(
                        prev * (period - e) + curr * period <= limit * period,
                        "at {t}: prev {prev}, curr {curr}, e {e}, P {period}, L {limit}"
                    );
                }
            }
        }
    }

    /// (b)
    #[test]
    fn buckets_admit_at_most_burst_plus_rate((policy, start, ops) in case(BUCKETS, false)) {
        let records = run(&policy, start, &ops, true);
        let admitted = admitted(&records);
        let burst = u128::from(policy.capacity());
        let (limit, period) = (u128::from(policy.limit()), u128::from(policy.period_micros()));
        for (i, &(ti, _)) in admitted.iter().enumerate() {
            let mut sum = 0u128;
            for &(tj, cj) in &admitted[i..] {
                sum += u128::from(cj);
                let span = u128::from(tj - ti);
                let bound = burst + (limit * span).div_ceil(period);
                prop_assert!(sum <= bound, "[{ti}, {tj}]: {sum} > {bound}");
            }
        }
    }

    /// (c)
    #[test]
    fn remaining_never_exceeds_capacity(
        (policy, start, ops) in case(ALL, true),
        idle in prop_oneof![0u64..=1_000, 0u64..=200_000_000_000],
    ) {
        let records = run(&policy, start, &ops, true);
        for r in &records {
            prop_assert!(r.step.decision.remaining() <= policy.capacity(), "{r:?}");
        }
        let last = records.last().expect("at least one op");
        let state = last.after();
        let later = algorithms::check(&policy, state.as_ref(), last.now + idle, 0);
        prop_assert!(later.decision.remaining() <= policy.capacity());
        let at_expiry = last.step.expires_at_us;
        for at in [at_expiry, at_expiry + idle] {
            let peek = algorithms::check(&policy, state.as_ref(), at, 0);
            prop_assert_eq!(peek.decision.remaining(), policy.capacity());
            prop_assert_eq!(peek.decision.reset_after(), Duration::ZERO);
        }
    }

    /// (d)
    #[test]
    fn peeks_change_nothing((policy, start, ops) in case(ALL, true)) {
        let plain = run(&policy, start, &ops, false);
        let with_peeks = run(&policy, start, &ops, true);
        let (peeks, real): (Vec<&Record>, Vec<&Record>) =
            with_peeks.iter().partition(|r| r.cost == 0);
        prop_assert_eq!(real.len(), plain.len());
        for (a, b) in plain.iter().zip(real) {
            prop_assert_eq!(&a.step, &b.step);
            prop_assert_eq!(&a.before, &b.before);
        }
        for peek in peeks {
            // A peek offers nothing to write but a repair: the state clamped
            // to the policy's worst case, which reads back the same.
            if let Some(repair) = &peek.step.new_state {
                let again = algorithms::check(&policy, Some(repair), peek.now, 0);
                prop_assert_eq!(&again.new_state, &None);
                prop_assert_eq!(&again.decision, &peek.step.decision);
            }
            let real = algorithms::check(&policy, peek.before.as_ref(), peek.now, 1);
            let (p, r) = (&peek.step.decision, &real.decision);
            prop_assert_eq!(p.is_allowed(), r.is_allowed());
            if r.is_allowed() {
                prop_assert_eq!(p.remaining(), r.remaining() + 1);
            } else {
                prop_assert_eq!(p, r);
            }
        }
    }

    /// (e)
    #[test]
    fn retry_after_is_honest(
        (policy, start, ops) in case(ALL, false),
        (policy_b, start_b, ops_b) in case(ALL, true),
    ) {
        for (policy, records) in [(&policy, run(&policy, start, &ops, true)), (&policy_b, run(&policy_b, start_b, &ops_b, true))] {
            for r in &records {
                let Some(retry) = r.step.decision.retry_after() else { continue };
                if r.cost == 0 && r.step.new_state.is_some() {
                    // A peek of a state that needs a repair describes the
                    // repaired state, which only the next charge writes.
                    continue;
                }
                prop_assert!(retry != Duration::MAX, "cost ≤ capacity can always succeed: {r:?}");
                let retry = u64::try_from(retry.as_micros()).unwrap();
                prop_assert!(retry >= 1);
                // From the state the denial left: a repair, when the old
                // state was clamped, is written whatever the decision.
                let after = r.after();
                let at = |dt: u64| algorithms::check(policy, after.as_ref(), r.now + dt, r.cost);
                let early = at(retry - 1);
                let on_time = at(retry);
                prop_assert!(!early.decision.is_allowed(), "admitted 1 µs early: {r:?} {early:?}");
                prop_assert!(on_time.decision.is_allowed(), "denied on time: {r:?} {on_time:?}");
            }
        }
    }

    /// (f)
    #[test]
    fn state_may_be_forgotten_at_expiry((policy, start, ops) in case(ALL, true), extra in 0u64..=1_000) {
        let records = run(&policy, start, &ops, true);
        for r in &records {
            if r.cost == 0 && r.step.new_state.is_some() {
                // A peek of a state that needs a repair: see (e).
                continue;
            }
            let state = r.after();
            let at = r.step.expires_at_us + extra;
            for cost in [0, 1, policy.capacity()] {
                let kept = algorithms::check(&policy, state.as_ref(), at, cost);
                let forgotten = algorithms::check(&policy, None, at, cost);
                prop_assert_eq!(&kept, &forgotten, "{:?} at {}", r, at);
            }
        }
    }

    /// (g)
    #[test]
    fn bucket_algorithms_agree(
        (policy, start, ops) in case(&[Algorithm::Gcra], false),
    ) {
        let mut reference: Option<Vec<Record>> = None;
        for &algorithm in BUCKETS {
            let same = Policy::per(policy.limit(), policy.period())
                .burst(policy.capacity())
                .algorithm(algorithm)
                .build()
                .expect("same parameters as a valid policy");
            let records = run(&same, start, &ops, true);
            if let Some(reference) = &reference {
                for (a, b) in reference.iter().zip(&records) {
                    prop_assert_eq!(
                        summary(&a.step.decision),
                        summary(&b.step.decision),
                        "{} at {} cost {}", algorithm, b.now, b.cost
                    );
                    prop_assert_eq!(a.step.expires_at_us, b.step.expires_at_us);
                }
            } else {
                reference = Some(records);
            }
        }
    }
}
