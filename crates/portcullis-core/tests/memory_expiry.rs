//! The in-memory store forgets subjects once their state is back to full:
//! memory stays bounded without a background thread, and `max_keys` frees
//! room as subjects expire.

use std::fmt::Write as _;
use std::time::Duration;

use futures::executor::block_on;
use portcullis_core::{ErrorScope, ManualClock, MemoryStore, Policy, Store, StoreError, WhenFull};

const T0: u64 = 1_700_000_000_000_000;

fn allowed(store: &MemoryStore, subject: &str, policies: &[Policy]) -> bool {
    block_on(store.check(subject, policies, 1))
        .expect("a valid check")
        .is_allowed()
}

#[test]
fn a_million_expired_subjects_are_swept_by_later_traffic() {
    const SUBJECTS: usize = 1_000_000;
    const SHARDS: usize = 16;
    const LATER_SUBJECTS: usize = 1_024;
    // How much later traffic it takes: each shard holds about 62 500
    // entries in 2^17 buckets. Every 64 operations on a shard (and every 64
    // hot-path charges on a thread, on the shards in turn) scans chunks of
    // 128 buckets, up to 16 chunks while each yields at least 32 expired
    // entries (these chunks hold about 60), so one pass over a shard takes
    // about 2^17 / 2048 × 64 = 4096 operations on it, 65 536 over the 16
    // shards. 200 000 operations spread over 1024 subjects leave a wide
    // margin.
    const LATER_CHECKS: usize = 200_000;
    // The later traffic is admitted (about 195 checks per subject, within
    // the burst): a denial writes nothing and counts towards no sweep.
    let later_policies = [Policy::per_second(1).burst(1_000).build().unwrap()];

    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(SHARDS)
        .unbounded()
        .build();
    let policies = [Policy::per_second(1).build().unwrap()];
    let mut subject = String::new();
    for i in 0..SUBJECTS {
        subject.clear();
        write!(subject, "user:{i}").unwrap();
        assert!(allowed(&store, &subject, &policies));
    }
    assert_eq!(store.len(), SUBJECTS);

    // Every state is back to full after one period.
    clock.advance(Duration::from_secs(1));
    for i in 0..LATER_CHECKS {
        let subject = format!("later:{}", i % LATER_SUBJECTS);
        assert!(allowed(&store, &subject, &later_policies));
    }
    let held = store.len();
    assert!(
        held < LATER_SUBJECTS + SUBJECTS / 100,
        "{held} subjects held after the sweep"
    );
    // What is held is live: nothing expired is left to purge beyond a
    // sliver not yet reached by the last pass.
    let leftover = store.purge_expired();
    assert!(
        leftover < SUBJECTS / 100,
        "{leftover} expired subjects left"
    );
    assert_eq!(store.len(), LATER_SUBJECTS);
}

#[test]
fn expired_state_counts_as_absent_before_any_sweep() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let policies = [Policy::per_second(1).build().unwrap()];
    assert!(allowed(&store, "alice", &policies));
    assert!(!allowed(&store, "alice", &policies));
    clock.advance(Duration::from_secs(1));
    // Still held (no sweep has run) but treated as absent.
    assert_eq!(store.len(), 1);
    let verdict = block_on(store.peek("alice", &policies)).unwrap();
    assert_eq!(verdict.decisions()[0].remaining(), 1);
    assert!(allowed(&store, "alice", &policies));
    assert_eq!(store.len(), 1);
}

#[test]
fn unbounded_growth_of_distinct_subjects_is_capped_by_sweeps() {
    // A steady stream of new subjects (say, scanning IPs): 10 per
    // millisecond with a 1 s policy means about 10 000 are live at any
    // time. The store must not keep the 200 000 it saw.
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(8)
        .build();
    let policies = [Policy::per_second(1).build().unwrap()];
    let mut max_held = 0;
    for i in 0..200_000u32 {
        if i % 10 == 0 {
            clock.advance(Duration::from_millis(1));
        }
        assert!(allowed(&store, &format!("ip:{i}"), &policies));
        max_held = max_held.max(store.len());
    }
    // Live: about 10 000. Sweeps before growth keep each shard's table at
    // most about twice its live entries.
    assert!(max_held < 40_000, "held up to {max_held}");
}

#[test]
fn max_keys_refuses_new_subjects_until_some_expire() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(64)
        .max_keys(3)
        .when_full(WhenFull::Deny)
        .build();
    let per_minute = [Policy::per_minute(2).build().unwrap()];

    for subject in ["a", "b", "c"] {
        assert!(allowed(&store, subject, &per_minute));
    }
    let err = block_on(store.check("d", &per_minute, 1)).unwrap_err();
    assert!(
        matches!(err, StoreError::Full { max_keys: 3, .. }),
        "{err:?}"
    );
    assert!(err.is_backend());
    assert_eq!(err.scope(), ErrorScope::NoRoom);
    // An honest Retry-After: "b" and "c" are back to full in 30 s.
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
    assert!(err.to_string().contains("max_keys"), "{err}");

    // Existing subjects keep working, with their own limits.
    assert!(allowed(&store, "a", &per_minute));
    assert!(!allowed(&store, "a", &per_minute));
    // A peek needs no room.
    assert!(block_on(store.peek("d", &per_minute)).unwrap().is_allowed());
    assert_eq!(store.len(), 3);

    // "b" and "c" expire after 30 s (one permit refills in 30 s); "a"
    // after 60 s.
    clock.advance(Duration::from_secs(30));
    assert!(allowed(&store, "d", &per_minute));
    assert!(allowed(&store, "e", &per_minute));
    let err = block_on(store.check("f", &per_minute, 1)).unwrap_err();
    assert!(matches!(err, StoreError::Full { .. }), "{err:?}");
    assert_eq!(store.len(), 3);

    clock.advance(Duration::from_secs(60));
    for subject in ["f", "g", "h"] {
        assert!(allowed(&store, subject, &per_minute), "{subject}");
    }
    assert_eq!(store.len(), 3);
}

#[test]
fn max_keys_zero_refuses_every_new_subject() {
    let store = MemoryStore::builder()
        .clock(ManualClock::new(T0))
        .max_keys(0)
        .when_full(WhenFull::Deny)
        .build();
    let policies = [Policy::per_second(1).build().unwrap()];
    let err = block_on(store.check("alice", &policies, 1)).unwrap_err();
    assert!(
        matches!(err, StoreError::Full { max_keys: 0, .. }),
        "{err:?}"
    );
    assert!(block_on(store.peek("alice", &policies))
        .unwrap()
        .is_allowed());
    assert!(store.is_empty());
}
