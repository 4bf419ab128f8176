//! Token reservations in the stores: `RedisStore` (reserve.lua) and
//! `MemoryStore` answer every reserve and settle alike (a differential
//! over random budgets, plan changes and operations, standalone and
//! Cluster); ten concurrent reservations of one budget admit exactly those that fit;
//! three independent store instances on one Redis never charge past the
//! budget plus the documented overage; a settle retried after a timeout
//! charges once; a reservation never settled frees its place after its
//! TTL; hostile estimates and usages.

use crate::redis_common;

use std::time::Duration;

use portcullis_core::{
    Algorithm, Clock, ManualClock, MemoryStore, Policy, Refusal, ReservationId, ReservationStore,
    SettleOutcome, StoreError, TokenBudget,
};
use portcullis_redis::RedisStore;
use portcullis_tests::unique_prefix;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis_common::{client, manual_clock};

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Move the clock forward, then reserve `estimate` as a new id.
    Reserve { step: u64, estimate: u64 },
    /// Move the clock forward, then reserve again the id of an earlier
    /// reserve (`index` modulo those made).
    Again { step: u64, index: usize },
    /// Move the clock forward, then settle an earlier reserve's id.
    Settle { step: u64, index: usize, used: u64 },
    /// A plan change: from now on the other budget (the same names and
    /// algorithms, other numbers), whose states are read rescaled.
    Switch,
    /// Move the clock forward, then keep an earlier reserve's id open.
    Renew { step: u64, index: usize },
}

fn token_policy(name: &'static str) -> impl Strategy<Value = Policy> {
    (
        prop::sample::select(vec![Algorithm::Gcra, Algorithm::TokenBucket]),
        10_u64..=200,
        prop::sample::select(vec![1_000_000_u64, 7_000_013, 60_000_000]),
    )
        .prop_map(move |(algorithm, limit, period)| {
            Policy::per(limit, Duration::from_micros(period))
                .algorithm(algorithm)
                .name(name)
                .build()
                .expect("a valid policy")
        })
}

fn request_policy() -> impl Strategy<Value = Policy> {
    (prop::sample::select(Algorithm::ALL.to_vec()), 1_u64..=6).prop_map(|(algorithm, limit)| {
        Policy::per(limit, Duration::from_secs(5))
            .algorithm(algorithm)
            .name("requests")
            .build()
            .expect("a valid policy")
    })
}

/// A budget and its other plan: the same names and algorithms, other
/// numbers.
fn budgets() -> impl Strategy<Value = (TokenBudget, TokenBudget)> {
    budget().prop_flat_map(|a| {
        let tokens: Vec<(String, Algorithm)> = a
            .token_policies()
            .iter()
            .map(|p| (p.name().to_owned(), p.algorithm()))
            .collect();
        let requests: Vec<(String, Algorithm)> = a
            .request_policies()
            .iter()
            .map(|p| (p.name().to_owned(), p.algorithm()))
            .collect();
        let numbers = (
            prop::collection::vec(
                (
                    10_u64..=200,
                    prop::sample::select(vec![1_000_000_u64, 7_000_013, 60_000_000]),
                ),
                tokens.len(),
            ),
            prop::collection::vec(1_u64..=6, requests.len()),
        );
        let first = a;
        numbers.prop_map(move |(t, r)| {
            let policy = |(name, algorithm): &(String, Algorithm), limit: u64, period: u64| {
                Policy::per(limit, Duration::from_micros(period))
                    .algorithm(*algorithm)
                    .name(name.clone())
                    .build()
                    .expect("a valid policy")
            };
            let mut policies = tokens.iter().zip(&t).map(|(p, (l, d))| policy(p, *l, *d));
            let mut builder = TokenBudget::tokens(policies.next().expect("a token policy"))
                .max_overage(first.max_overage())
                .reservation_ttl(first.reservation_ttl());
            for more in policies {
                builder = builder.tokens(more);
            }
            for (p, l) in requests.iter().zip(&r) {
                builder = builder.requests(policy(p, *l, 5_000_000));
            }
            if let Some(max) = first.max_in_flight() {
                builder = builder.max_in_flight(max);
            }
            (first.clone(), builder.build().expect("a valid budget"))
        })
    })
}

fn budget() -> impl Strategy<Value = TokenBudget> {
    (
        token_policy("tokens"),
        prop::option::of(token_policy("tokens-long")),
        prop::option::of(request_policy()),
        prop::option::of(1_u64..=3),
        0_u64..=60,
        prop::sample::select(vec![2_000_000_u64, 30_000_000]),
    )
        .prop_map(|(tokens, long, requests, in_flight, overage, ttl)| {
            let mut builder = TokenBudget::tokens(tokens)
                .max_overage(overage)
                .reservation_ttl(Duration::from_micros(ttl));
            if let Some(long) = long {
                builder = builder.tokens(long);
            }
            if let Some(requests) = requests {
                builder = builder.requests(requests);
            }
            if let Some(max) = in_flight {
                builder = builder.max_in_flight(max);
            }
            builder.build().expect("a valid budget")
        })
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let step = prop_oneof![3 => Just(0_u64), 3 => 1_u64..=1_000, 3 => 0_u64..=5_000_000, 1 => 0_u64..=60_000_000];
    let op = prop_oneof![
        1 => Just(Op::Switch),
        4 => (step.clone(), 0_u64..=40).prop_map(|(step, estimate)| Op::Reserve { step, estimate }),
        1 => (step.clone(), 0_usize..8).prop_map(|(step, index)| Op::Again { step, index }),
        4 => (step.clone(), 0_usize..8, prop_oneof![9 => 0_u64..=120, 1 => Just(u64::MAX)]).prop_map(|(step, index, used)| Op::Settle { step, index, used }),
        2 => (step, 0_usize..8).prop_map(|(step, index)| Op::Renew { step, index }),
    ];
    prop::collection::vec(op, 30)
}

fn run_case(
    runtime: &tokio::runtime::Runtime,
    redis: &RedisStore,
    clock: &ManualClock,
    subject: &str,
    plans: (&TokenBudget, &TokenBudget),
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let (mut budget, mut other) = plans;
    clock.set(manual_clock().now_micros());
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let mut ids: Vec<ReservationId> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let context = format!("op {i} ({op:?})");
        match *op {
            Op::Switch => std::mem::swap(&mut budget, &mut other),
            Op::Reserve { step, estimate } => {
                clock.advance(Duration::from_micros(step));
                let id = ReservationId::generate();
                ids.push(id);
                let a = runtime.block_on(redis.reserve(subject, budget, estimate, id));
                let b = runtime.block_on(memory.reserve(subject, budget, estimate, id));
                compare(a, b, &context)?;
            }
            Op::Again { step, index } => {
                clock.advance(Duration::from_micros(step));
                let Some(id) = ids.get(index % ids.len().max(1)).copied() else {
                    continue;
                };
                let a = runtime.block_on(redis.reserve(subject, budget, 5, id));
                let b = runtime.block_on(memory.reserve(subject, budget, 5, id));
                compare(a, b, &context)?;
            }
            Op::Settle { step, index, used } => {
                clock.advance(Duration::from_micros(step));
                let Some(id) = ids.get(index % ids.len().max(1)).copied() else {
                    continue;
                };
                let a = runtime.block_on(redis.settle(subject, budget, id, used));
                let b = runtime.block_on(memory.settle(subject, budget, id, used));
                compare(a, b, &context)?;
            }
            Op::Renew { step, index } => {
                clock.advance(Duration::from_micros(step));
                let Some(id) = ids.get(index % ids.len().max(1)).copied() else {
                    continue;
                };
                let a = runtime.block_on(redis.renew(subject, budget, id));
                let b = runtime.block_on(memory.renew(subject, budget, id));
                compare(a, b, &context)?;
            }
        }
    }
    Ok(())
}

/// What the differential saw, so that it fails if its cases never reach
/// a branch: admissions, refusals by a policy and in flight, replays,
/// refunds, overages, settles replayed and unknown, renewals kept and
/// not.
#[derive(Debug, Default)]
struct Seen([u64; 10]);

static SEEN: std::sync::Mutex<Seen> = std::sync::Mutex::new(Seen([0; 10]));

trait Tally {
    fn tally(&self) -> usize;
}

impl Tally for portcullis_core::Reserved {
    fn tally(&self) -> usize {
        match self.refusal() {
            None if self.is_replay() => 3,
            None => 0,
            Some(Refusal::Policy { .. }) => 1,
            Some(_) => 2,
        }
    }
}

impl Tally for bool {
    fn tally(&self) -> usize {
        if *self {
            8
        } else {
            9
        }
    }
}

impl Tally for portcullis_core::Settlement {
    fn tally(&self) -> usize {
        match self.outcome() {
            SettleOutcome::Settled if self.overage() > 0 => 5,
            SettleOutcome::Settled => 4,
            SettleOutcome::Replayed => 6,
            _ => 7,
        }
    }
}

fn compare<T: PartialEq + std::fmt::Debug + Tally>(
    redis: Result<T, StoreError>,
    memory: Result<T, StoreError>,
    context: &str,
) -> Result<(), TestCaseError> {
    match (redis, memory) {
        (Ok(a), Ok(b)) => {
            prop_assert_eq!(&a, &b, "{}", context);
            if let Ok(mut seen) = SEEN.lock() {
                seen.0[a.tally()] += 1;
            }
            Ok(())
        }
        (Err(a), Err(b)) => {
            prop_assert!(!a.is_backend(), "{}: Redis failed: {}", context, a);
            prop_assert_eq!(format!("{a:?}"), format!("{b:?}"), "{}", context);
            Ok(())
        }
        (a, b) => Err(TestCaseError::fail(format!(
            "{context}: Redis {a:?} but memory {b:?}"
        ))),
    }
}

fn differential(cluster: bool, cases: u32) {
    let runtime = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    let clock = manual_clock();
    let prefix = unique_prefix("rsv-diff");
    let redis = runtime.block_on(async {
        if cluster {
            redis_common::cluster(&prefix, client(&clock)).await
        } else {
            redis_common::standalone(&prefix, client(&clock)).await
        }
    });
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case_number = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(&(budgets(), ops()), |((budget, other), ops)| {
        let n = case_number.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let subject = format!("subject-{n}");
        run_case(&runtime, &redis, &clock, &subject, (&budget, &other), &ops)
    });
    if let Err(error) = result {
        panic!("RedisStore and MemoryStore disagree on reservations: {error}");
    }
    let seen = SEEN.lock().map(|seen| seen.0).unwrap_or_default();
    assert!(
        seen.iter().all(|&n| n > 0),
        "a branch was never reached: {seen:?}"
    );
}

#[test]
fn redis_reserves_and_settles_as_memory_does() {
    differential(false, 128);
}

#[test]
fn the_cluster_reserves_and_settles_as_memory_does() {
    differential(true, 12);
}
