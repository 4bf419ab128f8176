//! Behaviour of the in-memory store: multi-policy atomicity, peeks, resets,
//! the manual clock, request errors, and agreement with the pure algorithms.

use std::time::Duration;

use futures::executor::block_on;
use portcullis_core::algorithms::{self, State};
use portcullis_core::{Algorithm, ManualClock, MemoryStore, Policy, Store, StoreError, Verdict};
use proptest::prelude::*;

/// 2023-11-14T22:13:20Z, in microseconds.
const T0: u64 = 1_700_000_000_000_000;

fn check(store: &MemoryStore, subject: &str, policies: &[Policy], cost: u64) -> Verdict {
    block_on(store.check(subject, policies, cost)).expect("a valid check")
}

fn peek(store: &MemoryStore, subject: &str, policies: &[Policy]) -> Verdict {
    block_on(store.peek(subject, policies)).expect("a valid peek")
}

#[test]
fn a_denial_by_one_policy_charges_none() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let per_second = Policy::per_second(10).name("per-second").build().unwrap();
    let per_day = Policy::per_day(3)
        .algorithm(Algorithm::FixedWindow)
        .name("per-day")
        .build()
        .unwrap();
    let both = [per_second.clone(), per_day];

    for (per_second_left, daily_left) in [(9, 2), (8, 1), (7, 0)] {
        let verdict = check(&store, "alice", &both, 1);
        assert!(verdict.is_allowed());
        assert_eq!(verdict.decisions()[0].remaining(), per_second_left);
        assert_eq!(verdict.decisions()[1].remaining(), daily_left);
    }

    // The fourth call: the daily policy denies...
    let fourth = check(&store, "alice", &both, 1);
    assert!(!fourth.is_allowed());
    assert!(!fourth.decisions()[1].is_allowed());
    assert!(fourth.decisions()[0].is_allowed());
    // ...the per-second decision reports its state uncharged...
    assert_eq!(fourth.decisions()[0].remaining(), 7);
    assert_eq!(fourth.binding().limit(), 3);
    assert!(fourth.retry_after().is_some());

    // ...and the per-second policy was not charged: 10 - 3 = 7 remain.
    let per_second_only = [per_second];
    assert_eq!(
        peek(&store, "alice", &per_second_only).decisions()[0].remaining(),
        7
    );
    assert_eq!(
        check(&store, "alice", &per_second_only, 1).decisions()[0].remaining(),
        6
    );
}

#[test]
fn decisions_come_in_policy_order() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let policies = [
        Policy::per_minute(100).name("b").build().unwrap(),
        Policy::per_second(5).name("a").build().unwrap(),
    ];
    let verdict = check(&store, "alice", &policies, 2);
    assert_eq!(verdict.decisions()[0].limit(), 100);
    assert_eq!(verdict.decisions()[0].remaining(), 98);
    assert_eq!(verdict.decisions()[1].limit(), 5);
    assert_eq!(verdict.decisions()[1].remaining(), 3);
    assert_eq!(verdict.binding().limit(), 5);
}

#[test]
fn peek_changes_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let policies = [Policy::per_minute(5).algorithm(algorithm).build().unwrap()];

        let fresh = peek(&store, "alice", &policies);
        assert!(fresh.is_allowed(), "{algorithm}");
        assert_eq!(fresh.decisions()[0].remaining(), 5, "{algorithm}");
        assert!(store.is_empty(), "{algorithm}: a peek stored a subject");

        assert_eq!(
            check(&store, "alice", &policies, 2).decisions()[0].remaining(),
            3
        );
        for _ in 0..10 {
            let verdict = peek(&store, "alice", &policies);
            assert!(verdict.is_allowed(), "{algorithm}");
            assert_eq!(verdict.decisions()[0].remaining(), 3, "{algorithm}");
        }
        assert_eq!(
            check(&store, "alice", &policies, 3).decisions()[0].remaining(),
            0
        );
        for _ in 0..3 {
            let verdict = peek(&store, "alice", &policies);
            assert!(!verdict.is_allowed(), "{algorithm}");
            assert!(verdict.retry_after().is_some(), "{algorithm}");
        }
        assert!(
            !check(&store, "alice", &policies, 1).is_allowed(),
            "{algorithm}"
        );
        assert_eq!(store.len(), 1);
    }
}

#[test]
fn reset_forgets_the_named_policies_only() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let fast = Policy::per_second(2).name("fast").build().unwrap();
    let slow = Policy::per_hour(2).name("slow").build().unwrap();
    let both = [fast.clone(), slow];
    check(&store, "alice", &both, 2);
    check(&store, "bob", &both, 2);
    assert!(!check(&store, "alice", &both, 1).is_allowed());

    block_on(store.reset("alice", std::slice::from_ref(&fast))).unwrap();
    let verdict = peek(&store, "alice", &both);
    assert_eq!(verdict.decisions()[0].remaining(), 2);
    assert_eq!(verdict.decisions()[1].remaining(), 0);
    assert!(!verdict.is_allowed());

    block_on(store.reset("alice", &both)).unwrap();
    assert!(check(&store, "alice", &both, 2).is_allowed());
    // Bob was not touched.
    assert!(!check(&store, "bob", &both, 1).is_allowed());

    // Resetting a subject that was never seen is fine and stores nothing.
    block_on(store.reset("carol", &both)).unwrap();
    assert_eq!(store.len(), 2);
    block_on(store.reset("bob", &both)).unwrap();
    assert_eq!(store.len(), 1);
}

#[test]
fn manual_clock_drives_time() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let policies = [Policy::per_second(2).build().unwrap()];
    assert!(check(&store, "alice", &policies, 2).is_allowed());
    let denied = check(&store, "alice", &policies, 1);
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(500)));

    clock.advance(Duration::from_millis(499));
    assert!(!check(&store, "alice", &policies, 1).is_allowed());
    clock.advance(Duration::from_millis(1));
    assert!(check(&store, "alice", &policies, 1).is_allowed());
    assert!(!check(&store, "alice", &policies, 1).is_allowed());

    clock.advance(Duration::from_secs(10));
    let verdict = check(&store, "alice", &policies, 1);
    assert_eq!(verdict.decisions()[0].remaining(), 1);
}

#[test]
fn clones_share_state_and_separate_stores_do_not() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let clone = store.clone();
    let other = MemoryStore::with_clock(ManualClock::new(T0));
    let policies = [Policy::per_minute(1).build().unwrap()];
    assert!(check(&store, "alice", &policies, 1).is_allowed());
    assert!(!check(&clone, "alice", &policies, 1).is_allowed());
    assert!(check(&other, "alice", &policies, 1).is_allowed());
    assert_eq!(clone.len(), 1);
}

#[test]
fn request_errors_match_validate_check_and_store_nothing() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let a = Policy::per_second(5).name("a").build().unwrap();
    let b = Policy::per_second(5).burst(8).name("b").build().unwrap();

    let err = block_on(store.check("alice", &[], 1)).unwrap_err();
    assert!(matches!(err, StoreError::NoPolicies), "{err:?}");
    assert!(!err.is_backend());

    let err = block_on(store.check("alice", &[a.clone(), a.clone()], 1)).unwrap_err();
    assert!(
        matches!(err, StoreError::DuplicatePolicy { ref name } if name == "a"),
        "{err:?}"
    );

    let err = block_on(store.check("alice", &[b.clone(), a], 6)).unwrap_err();
    assert!(
        matches!(err, StoreError::CostTooHigh { ref policy, cost: 6, capacity: 5 } if policy == "a"),
        "{err:?}"
    );
    let err = block_on(store.peek("alice", &[])).unwrap_err();
    assert!(matches!(err, StoreError::NoPolicies), "{err:?}");
    assert!(store.is_empty());

    // The cost may reach the burst, which is above the limit.
    let verdict = check(&store, "alice", &[b], 8);
    assert!(verdict.is_allowed());
    assert_eq!(verdict.decisions()[0].remaining(), 0);
}

#[test]
fn subjects_are_distinct_whatever_their_shape() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let policies = [Policy::per_minute(1).build().unwrap()];
    let long_a = "a".repeat(10_000);
    let long_b = format!("{}b", "a".repeat(9_999));
    let subjects = [
        "",
        " ",
        "alice",
        "Alice",
        "alice ",
        "#alice",
        "2001:db8::1",
        "ünïcode",
        "{tag}",
        &long_a,
        &long_b,
    ];
    for subject in subjects {
        assert!(
            check(&store, subject, &policies, 1).is_allowed(),
            "{subject:.20?}"
        );
    }
    for subject in subjects {
        assert!(
            !check(&store, subject, &policies, 1).is_allowed(),
            "{subject:.20?}"
        );
    }
    assert_eq!(store.len(), subjects.len());
}

#[test]
fn debug_output_names_the_store() {
    let store = MemoryStore::builder().shards(4).max_keys(10).build();
    let debug = format!("{store:?}");
    assert!(debug.contains("MemoryStore"), "{debug}");
    assert!(debug.contains("max_keys: Some(10)"), "{debug}");
    assert!(format!("{:?}", MemoryStore::builder()).contains("MemoryStoreBuilder"));
}

#[test]
fn the_future_is_ready_at_once() {
    let store = MemoryStore::new();
    let policies = [Policy::per_second(3).build().unwrap()];
    let future = store.check("alice", &policies, 1);
    // `Ready` hands its value out without being polled by an executor.
    let verdict = future.into_inner().unwrap();
    assert_eq!(verdict.decisions()[0].remaining(), 2);
}

fn policy_strategy() -> impl Strategy<Value = Policy> {
    (0..7usize, 1..20u64, 1..5_000_000u64, 0..3u64).prop_map(|(algorithm, limit, period, extra)| {
        let algorithm = Algorithm::ALL[algorithm];
        let mut builder = Policy::per(limit, Duration::from_micros(period)).algorithm(algorithm);
        if algorithm.has_burst() && extra > 0 {
            builder = builder.burst(limit + extra);
        }
        builder.build().expect("a valid policy")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The store gives the decisions of the pure function with the state
    /// threaded through by hand, although it forgets expired states.
    #[test]
    fn store_agrees_with_the_pure_algorithm(
        policy in policy_strategy(),
        steps in prop::collection::vec((0..3_000_000u64, 0..25u64), 1..60),
    ) {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder().clock(clock.clone()).shards(1).build();
        let policies = [policy.clone()];
        let mut state: Option<State> = None;
        let mut now = T0;
        for (advance, cost) in steps {
            now += advance;
            clock.set(now);
            let cost = cost.min(policy.capacity());
            let expected = algorithms::check(&policy, state.as_ref(), now, cost);
            if cost > 0 && expected.decision.is_allowed()
                && let Some(new_state) = expected.new_state.clone() {
                    state = Some(new_state);
                }
            let got = check(&store, "subject", &policies, cost);
            prop_assert_eq!(got.decisions(), &[expected.decision][..]);
        }
    }
}
