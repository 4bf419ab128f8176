//! A `MemoryStore` at its bound: held subjects stay exact, a new subject
//! evicts the entry whose loss admits least (or is denied), the worst-case
//! over-admission of an eviction, and the default bound under a million
//! distinct subjects.

use std::time::{Duration, Instant};

use futures::executor::block_on;
use portcullis_core::{
    ErrorScope, ManualClock, MemoryStore, Policy, Store, StoreError, WhenFull, DEFAULT_MAX_KEYS,
};

const T0: u64 = 1_700_000_000_000_000;

fn charge(store: &MemoryStore, subject: &str, policies: &[Policy]) -> bool {
    block_on(store.check(subject, policies, 1))
        .expect("a held or storable subject is always decided")
        .is_allowed()
}

/// Charges until denied; returns how many were admitted.
fn drain(store: &MemoryStore, subject: &str, policies: &[Policy]) -> u64 {
    let mut admitted = 0;
    while charge(store, subject, policies) {
        admitted += 1;
        assert!(admitted <= 1_000, "{subject} is never denied");
    }
    admitted
}

#[test]
fn a_flood_of_new_subjects_never_changes_a_held_subjects_remaining_permits() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder().clock(clock).max_keys(1_000).build();
    let policies = [Policy::per_minute(5).name("api").build().unwrap()];
    // The held user spends 4 of 5.
    for _ in 0..4 {
        assert!(charge(&store, "held-user", &policies));
    }
    // 2 000 fresh identities, one request each: every one is decided
    // (stored by eviction), none is refused.
    for i in 0..2_000 {
        assert!(
            charge(&store, &format!("flood-{i}"), &policies),
            "flood-{i}"
        );
    }
    assert_eq!(store.len(), 1_000);
    // Exactly one permit left, not more.
    assert!(charge(&store, "held-user", &policies));
    assert!(!charge(&store, "held-user", &policies));
    // A fresh identity still gets exactly its limit, no more.
    assert_eq!(drain(&store, "fresh", &policies), 5);
}

#[test]
fn an_eviction_takes_the_entry_soonest_back_to_full_and_over_admits_at_most_what_it_spent() {
    let clock = ManualClock::new(T0);
    // One shard and 8 subjects: the eviction sample sees every entry.
    let store = MemoryStore::builder()
        .clock(clock)
        .shards(1)
        .max_keys(8)
        .build();
    let policies = [Policy::per_minute(10).name("api").build().unwrap()];
    // Subject i spends i + 2 permits (the lightest spends 2).
    for i in 0..8u64 {
        for _ in 0..i + 2 {
            assert!(charge(&store, &format!("s{i}"), &policies));
        }
    }
    assert!(charge(&store, "newcomer", &policies));
    assert_eq!(store.len(), 8);
    // Every subject but the lightest keeps exactly its remaining permits;
    // the lightest was forgotten and now gets its whole limit: an
    // over-admission of exactly the 2 permits it had spent.
    let mut over_admitted = 0;
    for i in 0..8u64 {
        let admitted = drain(&store, &format!("s{i}"), &policies);
        let remaining = 10 - (i + 2);
        assert!(admitted >= remaining, "s{i} lost permits: {admitted}");
        over_admitted += admitted - remaining;
        if i > 0 {
            assert_eq!(admitted, remaining, "s{i} was evicted instead of s0");
        }
    }
    assert_eq!(over_admitted, 2);
}

#[test]
fn the_worst_case_of_one_eviction_is_one_subjects_capacity() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder().clock(clock).max_keys(64).build();
    let policies = [Policy::per_hour(3).name("api").build().unwrap()];
    let remaining = |subject: &str| {
        block_on(store.peek(subject, &policies))
            .expect("a peek needs no room")
            .decisions()[0]
            .remaining()
    };
    // Every held subject is exhausted: whichever is evicted regains its
    // full capacity, the worst case. `held` is what the store must still
    // know: each subject and the permits it has left.
    let mut held: Vec<(String, u64)> = Vec::new();
    for i in 0..64 {
        let subject = format!("s{i}");
        assert_eq!(drain(&store, &subject, &policies), 3);
        held.push((subject, 0));
    }
    for evictions in 1..=8u64 {
        let newcomer = format!("new-{evictions}");
        assert!(charge(&store, &newcomer, &policies));
        assert!(store.len() <= 64, "{} entries", store.len());
        // Peeks store nothing, so they see exactly which subject the one
        // eviction forgot: it is back to full capacity; every other held
        // subject kept exactly what it had.
        let forgotten: Vec<usize> = held
            .iter()
            .enumerate()
            .filter(|(_, (subject, left))| {
                let now_left = remaining(subject);
                assert!(
                    now_left == *left || now_left == 3,
                    "{subject}: {now_left} left, not {left} or 3"
                );
                now_left != *left
            })
            .map(|(index, _)| index)
            .collect();
        assert_eq!(
            forgotten.len(),
            1,
            "eviction {evictions} forgot {forgotten:?}"
        );
        // The over-admission of this eviction: the forgotten subject's
        // spent permits, at most one capacity.
        let (subject, left) = held.swap_remove(forgotten[0]);
        let over = drain(&store, &subject, &policies) - left;
        assert!(over <= 3, "eviction {evictions} over-admitted {over}");
        // Draining it stored it again, which evicted exactly one other
        // subject (the newcomer, spent least, if the sample found it): that
        // one leaves the model, the drained subject re-enters it.
        held.push((newcomer, 2));
        let before = held.len();
        held.retain(|(subject, left)| remaining(subject) == *left);
        assert_eq!(
            before - held.len(),
            1,
            "storing {subject} again evicted one subject"
        );
        held.push((subject, 0));
    }
}

#[test]
fn deny_mode_refuses_a_new_subject_with_an_honest_retry_after_and_keeps_everyone() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(4)
        .when_full(WhenFull::Deny)
        .build();
    let policies = [Policy::per_minute(6).name("api").build().unwrap()];
    for i in 0..4 {
        assert!(charge(&store, &format!("s{i}"), &policies));
    }
    for _ in 0..3 {
        let err = block_on(store.check("stranger", &policies, 1)).unwrap_err();
        assert!(
            matches!(err, StoreError::Full { max_keys: 4, .. }),
            "{err:?}"
        );
        assert_eq!(err.scope(), ErrorScope::NoRoom);
        assert!(!err.is_store_wide());
        // One permit of 6/min refills in 10 s: the first entry expires then.
        assert_eq!(err.retry_after(), Some(Duration::from_secs(10)));
    }
    for i in 0..4 {
        assert_eq!(drain(&store, &format!("s{i}"), &policies), 5, "s{i}");
    }
    clock.advance(Duration::from_secs(60));
    assert!(charge(&store, "stranger", &policies));
}

#[test]
fn a_million_distinct_subjects_stay_under_the_default_bound_with_held_subjects_exact() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock);
    assert_eq!(store.max_keys(), Some(DEFAULT_MAX_KEYS));
    let policies = [Policy::per_day(10).name("daily").build().unwrap()];
    // Held subjects spend 9 of 10; the flood spends 1 each.
    let held: Vec<String> = (0..32).map(|i| format!("held-{i}")).collect();
    for subject in &held {
        for _ in 0..9 {
            assert!(charge(&store, subject, &policies));
        }
    }
    let started = Instant::now();
    let mut subject = String::new();
    let mut peak_len = 0;
    for i in 0..1_000_000u32 {
        subject.clear();
        subject.push_str("10.");
        subject.push_str(&i.to_string());
        assert!(charge(&store, &subject, &policies), "{subject}");
        if i % 65_536 == 0 {
            peak_len = peak_len.max(store.len());
        }
    }
    let elapsed = started.elapsed();
    peak_len = peak_len.max(store.len());
    assert!(peak_len <= DEFAULT_MAX_KEYS, "held {peak_len}");
    // The documented bound: at most 16/7 table slots per subject.
    let bytes = store.memory_bytes();
    let bound = DEFAULT_MAX_KEYS * MemoryStore::bytes_per_entry() * 16 / 7 + (1 << 20);
    assert!(bytes <= bound, "{bytes} bytes > {bound}");
    eprintln!(
        "1 000 000 subjects in {elapsed:?}; {} held, {bytes} bytes ({} per held subject)",
        store.len(),
        bytes / store.len()
    );
    for subject in &held {
        assert!(
            charge(&store, subject, &policies),
            "{subject} lost its last permit"
        );
        assert!(
            !charge(&store, subject, &policies),
            "{subject} got more than its limit"
        );
    }
}

#[test]
fn evicting_under_contention_never_exceeds_the_bound_nor_loses_a_held_subject() {
    const MAX_KEYS: usize = 200;
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(clock)
        .shards(8)
        .max_keys(MAX_KEYS)
        .build();
    let policies = [Policy::per_hour(10).name("api").build().unwrap()];
    // Held subjects spend 8 of 10 before the flood; the flood spends 1.
    let held: Vec<String> = (0..8).map(|i| format!("held-{i}")).collect();
    for subject in &held {
        for _ in 0..8 {
            assert!(charge(&store, subject, &policies));
        }
    }
    let refused = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (store, policies, refused) = (&store, &policies, &refused);
            scope.spawn(move || {
                for i in 0..5_000 {
                    match block_on(store.check(&format!("t{thread}-{i}"), policies, 1)) {
                        Ok(verdict) => assert!(verdict.is_allowed()),
                        // Another thread took the room this one made, four
                        // times over: refused (the layer denies), never
                        // let through.
                        Err(StoreError::Full { .. }) => {
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(other) => panic!("unexpected error: {other}"),
                    }
                    assert!(store.len() <= MAX_KEYS, "held {}", store.len());
                }
            });
        }
    });
    eprintln!(
        "{} of 20 000 new subjects refused under contention",
        refused.into_inner()
    );
    assert!(store.len() <= MAX_KEYS);
    for subject in &held {
        assert_eq!(drain(&store, subject, &policies), 2, "{subject}");
    }
}

#[test]
fn with_few_shards_a_heavy_subject_among_light_ones_keeps_its_permits() {
    // Two shards and a bound of 8: whichever shard each new subject lands
    // in (the hash is seeded at random), it evicts a light subject, in its
    // own shard or, when that holds less than half its share, in the
    // fullest one; never the heavy subject while a light one is sampled.
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder()
        .clock(clock)
        .shards(2)
        .max_keys(8)
        .build();
    let policies = [Policy::per_hour(10).name("api").build().unwrap()];
    // The heavy subject spends 9 permits, the light ones 1.
    let subjects: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    let heavy = &subjects[0];
    for _ in 0..9 {
        assert!(charge(&store, heavy, &policies));
    }
    for subject in &subjects[1..] {
        assert!(charge(&store, subject, &policies));
    }
    // New subjects, wherever they land, evict only light ones: the heavy
    // subject keeps exactly its one permit.
    for i in 0..100 {
        assert!(charge(&store, &format!("new-{i}"), &policies));
        assert!(store.len() <= 8);
    }
    assert_eq!(drain(&store, heavy, &policies), 1);
}
