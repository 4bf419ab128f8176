//! A policy changed under the same name, in the memory store (ALGORITHMS.md,
//! "Changing a policy"): a state the old policy left further ahead than the
//! new one can is clamped to the new one's worst case, written back with
//! its expiry re-armed, so a subject is never held beyond the new policy's
//! full reset. (The same in Redis: `tests/tests/redis_policy_change.rs`.)

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
    // to answer Retry-After: 3551 under 5 per minute; the new policy's
    // worst case is 60 s, so the next permit is one interval (12 s) away.
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let hourly = Policy::per_hour(5).burst(5).name("api").build().unwrap();
    assert!(check(&store, &hourly, 5).is_allowed());
    clock.advance(Duration::from_secs(9));
    let per_minute = Policy::per_minute(5).name("api").build().unwrap();
    let denied = check(&store, &per_minute, 1);
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(12)));
    assert_eq!(denied.reset_after(), Duration::from_secs(60));
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
        // The clamped state was written with the new policy's expiry, so
        // the store may forget it now. (A token bucket the old policy
        // emptied holds no more than the new one can: nothing to clamp,
        // and its old expiry stands.)
        clock.advance(Duration::from_micros(1));
        let purged = store.purge_expired();
        if algorithm == Algorithm::TokenBucket {
            assert_eq!(purged, 0, "{algorithm}");
        } else {
            assert_eq!((purged, store.len()), (1, 0), "{algorithm}");
        }
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
