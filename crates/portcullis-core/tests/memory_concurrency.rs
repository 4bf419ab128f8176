//! Many tasks on many OS threads hammering the in-memory store admit exactly
//! what the limit allows: no lost update, no double admission.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{Algorithm, ManualClock, MemoryStore, Policy, Store, StoreError, WhenFull};

const T0: u64 = 1_700_000_000_000_000;
const THREADS: usize = 8;
const TASKS: usize = 64;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS)
        .build()
        .expect("a tokio runtime")
}

/// Runs `TASKS` tasks, each making `checks_per_task` cost-1 checks on the
/// subject `subject_of(task, i)`, and returns how many were admitted per
/// subject index.
fn hammer(
    store: &MemoryStore,
    policies: &[Policy],
    subjects: usize,
    checks_per_task: usize,
) -> Vec<u64> {
    let admitted: Arc<Vec<AtomicU64>> =
        Arc::new((0..subjects).map(|_| AtomicU64::new(0)).collect());
    let policies: Arc<[Policy]> = policies.into();
    runtime().block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let store = store.clone();
                let policies = Arc::clone(&policies);
                let admitted = Arc::clone(&admitted);
                tokio::spawn(async move {
                    for i in 0..checks_per_task {
                        let subject = (task + i) % subjects;
                        let verdict = store
                            .check(&format!("subject-{subject}"), &policies, 1)
                            .await
                            .expect("a valid check");
                        if verdict.is_allowed() {
                            admitted[subject].fetch_add(1, Ordering::Relaxed);
                        }
                        if i % 16 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("the task finished");
        }
    });
    admitted
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .collect()
}

#[test]
fn one_key_admits_exactly_the_limit_under_contention() {
    const LIMIT: u64 = 500;
    for algorithm in Algorithm::ALL {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let policies = [Policy::per_hour(LIMIT)
            .algorithm(algorithm)
            .build()
            .unwrap()];
        // 64 tasks × 25 checks = 1600 attempts on one subject.
        let admitted = hammer(&store, &policies, 1, 25);
        assert_eq!(admitted, [LIMIT], "{algorithm}");
        assert_eq!(store.len(), 1);
    }
}

#[test]
fn several_keys_each_admit_exactly_the_limit() {
    const LIMIT: u64 = 100;
    const SUBJECTS: usize = 16;
    for algorithm in Algorithm::ALL {
        // Few shards, so subjects share locks.
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0))
            .shards(4)
            .build();
        let policies = [Policy::per_minute(LIMIT)
            .algorithm(algorithm)
            .build()
            .unwrap()];
        // 64 tasks × 48 checks = 3072 attempts, 192 per subject.
        let admitted = hammer(&store, &policies, SUBJECTS, 48);
        assert_eq!(admitted, vec![LIMIT; SUBJECTS], "{algorithm}");
        assert_eq!(store.len(), SUBJECTS);
    }
}

#[test]
fn multi_policy_checks_stay_all_or_nothing_under_contention() {
    let store = MemoryStore::with_clock(ManualClock::new(T0));
    let per_second = Policy::per_second(300).name("per-second").build().unwrap();
    let per_day = Policy::per_day(200)
        .algorithm(Algorithm::FixedWindow)
        .name("per-day")
        .build()
        .unwrap();
    let admitted = hammer(&store, &[per_second.clone(), per_day], 1, 10);
    assert_eq!(admitted, [200]);
    // The per-second policy was charged once per admission, never for the
    // 440 denials.
    let verdict = futures::executor::block_on(store.peek("subject-0", &[per_second])).unwrap();
    assert_eq!(verdict.decisions()[0].remaining(), 100);
}

#[test]
fn max_keys_is_exact_under_contention() {
    const MAX_KEYS: usize = 100;
    let store = MemoryStore::builder()
        .clock(ManualClock::new(T0))
        .max_keys(MAX_KEYS)
        .when_full(WhenFull::Deny)
        .build();
    let policies: Arc<[Policy]> = [Policy::per_minute(10).build().unwrap()].into();
    let (stored, full) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let store = &store;
                let policies = &policies;
                scope.spawn(move || {
                    let (mut stored, mut full) = (0, 0);
                    for i in 0..50 {
                        let subject = format!("t{thread}-{i}");
                        match store.check(&subject, policies, 1).into_inner() {
                            Ok(verdict) => {
                                assert!(verdict.is_allowed());
                                stored += 1;
                            }
                            Err(StoreError::Full { max_keys, .. }) => {
                                assert_eq!(max_keys, MAX_KEYS);
                                full += 1;
                            }
                            Err(other) => panic!("unexpected error: {other}"),
                        }
                    }
                    (stored, full)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("the worker finished"))
            .fold((0, 0), |(s, f), (ws, wf)| (s + ws, f + wf))
    });
    assert_eq!(stored, MAX_KEYS);
    assert_eq!(full, THREADS * 50 - MAX_KEYS);
    assert_eq!(store.len(), MAX_KEYS);
}

#[test]
fn concurrent_checks_on_a_moving_clock_never_exceed_the_rate() {
    // 8 threads, real interleavings, a clock that advances 1 ms per 10
    // checks: over the run a 1000/s GCRA admits at most burst + elapsed·rate.
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let policy = Policy::per_second(1_000).burst(50).build().unwrap();
    let policies = [policy];
    let admitted = AtomicU64::new(0);
    let ticks = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..2_000 {
                    if ticks.fetch_add(1, Ordering::Relaxed).is_multiple_of(10) {
                        clock.advance(Duration::from_millis(1));
                    }
                    let verdict = store.check("shared", &policies, 1).into_inner().unwrap();
                    if verdict.is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let elapsed_ms = ticks.load(Ordering::Relaxed).div_ceil(10);
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(
        admitted <= 50 + elapsed_ms,
        "admitted {admitted} in {elapsed_ms} ms"
    );
    // And it admitted something after the burst: the clock moved 1600 ms.
    assert!(admitted > 50, "admitted {admitted}");
}

#[test]
fn gcra_charges_are_exact_whether_or_not_the_interval_is_whole_microseconds() {
    // 60 s / 1000 is 60 ms, a whole number of microseconds, and 60 s / 7
    // is not: known subjects of both are charged under a read lock by
    // compare-and-swap (the fraction, in sevenths, packs beside the TAT).
    // 60 s / 7001 leaves fractions up to 7000, which do not pack, and
    // takes the locked path. All must admit exactly the burst.
    for limit in [1_000, 7, 7_001] {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let policies = [Policy::per_minute(limit).build().unwrap()];
        let admitted = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..limit.max(100) {
                        let verdict = futures::executor::block_on(store.check("hot", &policies, 1))
                            .expect("a valid check");
                        if verdict.is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), limit, "limit {limit}");
        // The state agrees: nothing is left.
        let peek = futures::executor::block_on(store.peek("hot", &policies)).unwrap();
        assert_eq!(peek.decisions()[0].remaining(), 0, "limit {limit}");
    }
}
