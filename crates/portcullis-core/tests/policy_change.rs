//! A policy changed under the same name, in the memory store (ALGORITHMS.md,
//! "Changing a policy"): the permits a bucket state holds are carried into
//! the new policy's units, and at most the new capacity; a state further
//! ahead than the new policy can leave is clamped to its worst case; either
//! is written back with its expiry re-armed, so a subject is never held
//! beyond the new policy's full reset. (The same in Redis:
//! `tests/tests/redis_paths/redis_policy_change.rs`.)

use std::time::Duration;

use portcullis_core::{Algorithm, LeakyMode, ManualClock, MemoryStore, Policy, Store};

/// An hour boundary.
const T0: u64 = 1_699_999_200_000_000;

fn policy(algorithm: Algorithm, limit: u64, period: Duration) -> Policy {
    Policy::per(limit, period)
        .algorithm(algorithm)
        .name("api")
        .build()
        .expect("valid")
}

fn check(store: &MemoryStore, policy: &Policy, cost: u64) -> portcullis_core::Decision {
    let verdict =
        futures::executor::block_on(store.check("user", std::slice::from_ref(policy), cost))
            .expect("a valid check");
    *verdict.binding()
}

#[test]
fn the_issue_case_an_hourly_gcra_lowered_to_five_a_minute() {
    // Per hour, then per minute: the stored TAT is an hour ahead. It used
    // to answer Retry-After: 3551 under 5 per minute. The 5 permits used,
    // 9 s later, are 4.9875 (one comes back every 720 s): at 12 s a permit
    // under 5 per minute, that is 59.85 s owed, the next permit 11.85 s
    // away and the whole 59.85 s.
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let hourly = Policy::per_hour(5).burst(5).name("api").build().unwrap();
    assert!(check(&store, &hourly, 5).is_allowed());
    clock.advance(Duration::from_secs(9));
    let per_minute = Policy::per_minute(5).name("api").build().unwrap();
    let denied = check(&store, &per_minute, 1);
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(11_850)));
    assert_eq!(denied.reset_after(), Duration::from_millis(59_850));
    // Written back: 12 s later one passes, without waiting for the hour.
    clock.advance(Duration::from_secs(12));
    assert!(check(&store, &per_minute, 1).is_allowed());
}

#[test]
fn every_algorithm_holds_a_subject_at_most_the_new_full_reset_and_rearms_the_expiry() {
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let old = policy(algorithm, 60, Duration::from_secs(3_600));
        let new = policy(algorithm, 5, Duration::from_secs(60));
        let bound = match algorithm {
            Algorithm::SlidingWindow => Duration::from_secs(120),
            _ => Duration::from_secs(60),
        };
        assert!(check(&store, &old, 60).is_allowed(), "{algorithm}");
        let denied = check(&store, &new, 1);
        assert!(!denied.is_allowed(), "{algorithm}");
        assert!(
            denied.retry_after().unwrap() <= bound,
            "{algorithm}: {denied:?}"
        );
        assert!(denied.reset_after() <= bound, "{algorithm}: {denied:?}");
        clock.advance(bound);
        let peek = check(&store, &new, 0);
        assert_eq!(peek.remaining(), 5, "{algorithm}: {peek:?}");
        // The clamped (or, for the buckets, rescaled) state was written
        // with the new policy's expiry, so the store may forget it now.
        clock.advance(Duration::from_micros(1));
        let purged = store.purge_expired();
        assert_eq!((purged, store.len()), (1, 0), "{algorithm}");
    }
}

#[test]
fn a_clock_a_little_behind_is_never_forgiven() {
    // Within the clock tolerance (the full reset again, at least a second)
    // a state ahead of now is read as it is: a check that read the clock
    // late admits nothing the later clock would not.
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::LeakyBucket(LeakyMode::Queue),
        Algorithm::LeakyBucket(LeakyMode::Meter),
    ] {
        let policy = policy(algorithm, 10, Duration::from_secs(1));
        let mut state = None;
        let now = T0 + 5_000_000;
        for _ in 0..10 {
            let step = portcullis_core::algorithms::check(&policy, state.as_ref(), now, 1);
            assert!(step.decision.is_allowed());
            state = step.new_state;
        }
        // 900 ms behind: the bucket is still full from that view.
        let behind = portcullis_core::algorithms::check(&policy, state.as_ref(), now - 900_000, 1);
        assert!(!behind.decision.is_allowed(), "{algorithm}");
        assert_eq!(behind.new_state, None, "{algorithm}: nothing clamped");
        assert_eq!(
            behind.decision.retry_after(),
            Some(Duration::from_millis(1_000)),
            "{algorithm}"
        );
    }
}

#[test]
fn a_plan_raised_under_the_same_name_gives_the_difference_at_once() {
    // The issue's case: 6 of 6 used at 6 per hour, the customer raised to
    // 10 per hour: 4 more now, then denied; a cut to 3 per hour keeps the
    // 6 used inside the 3 (denied, held at most the new full reset).
    let hour = Duration::from_secs(3_600);
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let six = policy(algorithm, 6, hour);
        let ten = policy(algorithm, 10, hour);
        assert!(check(&store, &six, 6).is_allowed(), "{algorithm}");
        assert_eq!(check(&store, &ten, 0).remaining(), 4, "{algorithm}");
        for left in (0..4).rev() {
            let admitted = check(&store, &ten, 1);
            assert!(admitted.is_allowed(), "{algorithm}");
            assert_eq!(admitted.remaining(), left, "{algorithm}");
        }
        assert!(!check(&store, &ten, 1).is_allowed(), "{algorithm}");
        // Read again in the units it was written in: no second rescale.
        assert_eq!(check(&store, &ten, 0).remaining(), 0, "{algorithm}");

        let store = MemoryStore::with_clock(clock.clone());
        let three = policy(algorithm, 3, hour);
        assert!(check(&store, &six, 6).is_allowed(), "{algorithm}");
        let denied = check(&store, &three, 1);
        assert!(!denied.is_allowed(), "{algorithm}");
        let full_reset = match algorithm {
            Algorithm::SlidingWindow => 2 * hour,
            _ => hour,
        };
        assert!(
            denied.reset_after() <= full_reset,
            "{algorithm}: {denied:?}"
        );
    }
}

#[test]
fn a_raise_reaches_subjects_on_the_fast_path_and_back_again() {
    // GCRA subjects live in the compact form and are charged by
    // compare-and-swap: a policy of the same name in other units must not
    // take that path with the old units, and the subject returns to it in
    // the new ones.
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let six = Policy::per_hour(6).name("api").build().unwrap();
    let ten = Policy::per_hour(10).name("api").build().unwrap();
    for _ in 0..6 {
        assert!(check(&store, &six, 1).is_allowed());
    }
    let mut admitted = 0;
    while check(&store, &ten, 1).is_allowed() {
        admitted += 1;
        assert!(admitted <= 4, "more than the difference");
    }
    assert_eq!(admitted, 4);
    // Back to 6 per hour: the 10 used are 6 of 6. The denied charge writes
    // them back in these units (a peek writes nothing, and until a charge
    // the state drains at the rate it was written with), so one permit
    // comes back after one interval of 6 per hour.
    assert_eq!(check(&store, &six, 0).remaining(), 0);
    assert!(!check(&store, &six, 1).is_allowed());
    clock.advance(Duration::from_secs(600));
    assert_eq!(check(&store, &six, 0).remaining(), 1);
    assert!(check(&store, &six, 1).is_allowed());
}
