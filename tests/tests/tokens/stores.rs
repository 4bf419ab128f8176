//! Reservations under concurrency and faults, in memory and on Redis:
//! ten concurrent reservations admit exactly those that fit; three
//! independent store instances on one Redis never charge past the budget
//! plus the documented overage; a settle retried after a timeout charges
//! once; a reservation whose holder went away frees its place after its
//! TTL; hostile estimates and usages.

use crate::redis_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use portcullis_core::{
    ManualClock, MemoryStore, Policy, Refusal, ReservationId, ReservationStore, SettleOutcome,
    Store, StoreError, TokenBudget,
};
use portcullis_redis::RedisStore;
use portcullis_tests::{unique_prefix, OwnedRedis};
use redis_common::{client, manual_clock};

/// 1 000 tokens per hour, and the clock stands still: nothing refills
/// during a test, so every count is exact.
fn budget(max_in_flight: Option<u64>, max_overage: u64) -> TokenBudget {
    let mut builder = TokenBudget::tokens(
        Policy::per_hour(1_000)
            .name("tokens")
            .build()
            .expect("a valid policy"),
    )
    .requests(
        Policy::per_hour(100)
            .name("requests")
            .build()
            .expect("a valid policy"),
    )
    .max_overage(max_overage)
    .reservation_ttl(Duration::from_secs(30));
    if let Some(max) = max_in_flight {
        builder = builder.max_in_flight(max);
    }
    builder.build().expect("a valid budget")
}

async fn redis_store(prefix: &str, clock: &ManualClock) -> RedisStore {
    redis_common::standalone(prefix, client(clock)).await
}

/// Ten reservations of 150 tokens at once against 1 000: six fit.
async fn ten_at_once<S: ReservationStore + Clone>(store: S) {
    let budget = budget(None, 0);
    let results = join_all((0..10).map(|_| {
        let store = store.clone();
        let budget = budget.clone();
        async move {
            store
                .reserve("key-1", &budget, 150, ReservationId::generate())
                .await
        }
    }))
    .await;
    let admitted = results
        .iter()
        .filter(|r| r.as_ref().expect("no store error").is_admitted())
        .count();
    assert_eq!(admitted, 6, "{results:?}");
    for refused in results.iter().flatten().filter(|r| !r.is_admitted()) {
        assert_eq!(refused.refusal(), Some(Refusal::Policy { index: 0 }));
        assert_eq!(refused.verdict().decisions()[0].remaining(), 100);
        assert!(refused.retry_after().is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_reservations_admit_exactly_those_that_fit() {
    let clock = manual_clock();
    ten_at_once(MemoryStore::with_clock(clock.clone())).await;
    ten_at_once(redis_store(&unique_prefix("rsv-ten"), &clock).await).await;
}

/// Three instances (stores with their own connections), ten tasks each,
/// reserving and settling with usage up to three times the estimate:
/// never more charged than the budget and, for each reservation open when
/// the last was admitted, the overage cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_never_charge_past_the_budget_and_the_overage_bound() {
    const MAX_IN_FLIGHT: u64 = 6;
    const MAX_OVERAGE: u64 = 40;
    let clock = manual_clock();
    let prefix = unique_prefix("rsv-three");
    let budget = budget(Some(MAX_IN_FLIGHT), MAX_OVERAGE);
    let charged = Arc::new(AtomicU64::new(0));
    let overages = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for instance in 0..3_u64 {
        let store = redis_store(&prefix, &clock).await;
        for task in 0..10_u64 {
            let (store, budget) = (store.clone(), budget.clone());
            let (charged, overages) = (Arc::clone(&charged), Arc::clone(&overages));
            tasks.push(tokio::spawn(async move {
                for round in 0..8_u64 {
                    let seed = instance * 1_000 + task * 10 + round;
                    let estimate = 10 + seed * 7 % 50;
                    let id = ReservationId::generate();
                    let reserved = store.reserve("key-1", &budget, estimate, id).await.unwrap();
                    if !reserved.is_admitted() {
                        continue;
                    }
                    tokio::task::yield_now().await;
                    let used = seed * 13 % (3 * estimate + 1);
                    let settled = store.settle("key-1", &budget, id, used).await.unwrap();
                    assert_eq!(settled.outcome(), SettleOutcome::Settled);
                    assert!(settled.overage() <= MAX_OVERAGE);
                    charged.fetch_add(settled.charged(), Ordering::SeqCst);
                    overages.fetch_add(settled.overage(), Ordering::SeqCst);
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let charged = charged.load(Ordering::SeqCst);
    assert!(
        overages.load(Ordering::SeqCst) > 0,
        "no overage was charged"
    );
    assert!(
        charged <= 1_000 + MAX_IN_FLIGHT * MAX_OVERAGE,
        "{charged} tokens charged against 1 000 and a bound of {} more",
        MAX_IN_FLIGHT * MAX_OVERAGE
    );
    // The budget is spent: what Redis holds says the same as the sum.
    let store = redis_store(&prefix, &clock).await;
    let peek = store
        .peek("key-1", &budget.token_policies()[..1])
        .await
        .unwrap();
    let left = peek.decisions()[0].remaining();
    assert_eq!(left, 1_000_u64.saturating_sub(charged), "{charged} charged");
}

/// A settle whose call timed out (the server was asleep) is retried: it
/// charges once, whichever of the two ran first.
#[tokio::test(flavor = "multi_thread")]
async fn a_settle_retried_after_a_timeout_charges_once() {
    let server = OwnedRedis::start(portcullis_tests::debug_command_args());
    let store = |timeout| {
        RedisStore::builder()
            .url(server.url())
            .prefix("rsv-retry")
            .timeout(timeout)
            .build()
    };
    let patient = store(Duration::from_secs(5)).await.unwrap();
    let hasty = store(Duration::from_millis(100)).await.unwrap();
    let budget = budget(Some(2), 100);
    let id = ReservationId::generate();
    assert!(patient
        .reserve("key-1", &budget, 300, id)
        .await
        .unwrap()
        .is_admitted());
    let url = server.url();
    let sleeper = std::thread::spawn(move || {
        let mut admin = redis::Client::open(url).unwrap().get_connection().unwrap();
        let () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.5")
            .query(&mut admin)
            .unwrap();
    });
    std::thread::sleep(Duration::from_millis(50));
    // 450 used: 150 of overage, capped at 100.
    let first = hasty.settle("key-1", &budget, id, 450).await;
    assert!(
        matches!(first, Err(StoreError::Timeout { .. })),
        "{first:?}"
    );
    sleeper.join().unwrap();
    let retry = patient.settle("key-1", &budget, id, 450).await.unwrap();
    assert_eq!(
        retry.outcome(),
        SettleOutcome::Replayed,
        "the first settle ran"
    );
    assert_eq!(retry.charged(), 400);
    let peek = patient
        .peek("key-1", &budget.token_policies()[..1])
        .await
        .unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 600);
}

/// An instance that reserved and went away (dropped without settling):
/// its places come back after the TTL, its estimate stays charged, and
/// a late settle charges nothing.
async fn places_come_back_after_the_ttl<S: ReservationStore + Store>(
    gone: S,
    other: S,
    clock: &ManualClock,
) {
    let budget = budget(Some(1), 100);
    let id = ReservationId::generate();
    assert!(gone
        .reserve("key-1", &budget, 200, id)
        .await
        .unwrap()
        .is_admitted());
    drop(gone);
    let blocked = other
        .reserve("key-1", &budget, 10, ReservationId::generate())
        .await
        .unwrap();
    assert_eq!(blocked.refusal(), Some(Refusal::InFlight { max: 1 }));
    assert_eq!(blocked.retry_after(), Some(Duration::from_secs(30)));
    clock.advance(Duration::from_secs(30));
    let late = other.settle("key-1", &budget, id, 900).await.unwrap();
    assert_eq!(late.outcome(), SettleOutcome::Unknown);
    let next = other
        .reserve("key-1", &budget, 10, ReservationId::generate())
        .await
        .unwrap();
    assert!(next.is_admitted(), "{next:?}");
    // 200 held by the expired reservation (less 30 s of refill: 8), 10 now.
    assert_eq!(next.verdict().decisions()[0].remaining(), 798);
}

#[tokio::test]
async fn a_reservation_never_settled_frees_its_place_after_its_ttl() {
    let clock = manual_clock();
    let memory = MemoryStore::with_clock(clock.clone());
    places_come_back_after_the_ttl(memory.clone(), memory, &clock).await;
    let clock = manual_clock();
    let prefix = unique_prefix("rsv-ttl");
    let (gone, other) = (
        redis_store(&prefix, &clock).await,
        redis_store(&prefix, &clock).await,
    );
    places_come_back_after_the_ttl(gone, other, &clock).await;
}

/// Estimates no budget holds are errors that charge nothing; a usage of
/// u64::MAX is charged its estimate and the overage cap, no more.
async fn hostile_numbers<S: ReservationStore + Store>(store: S) {
    let budget = budget(Some(4), 50);
    for estimate in [1_001, u64::MAX] {
        let err = store
            .reserve("key-1", &budget, estimate, ReservationId::generate())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::CostTooHigh { .. }), "{err}");
    }
    let peek = store.peek("key-1", budget.policies()).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 1_000);
    assert_eq!(peek.decisions()[1].remaining(), 100);
    let id = ReservationId::generate();
    assert!(store
        .reserve("key-1", &budget, 100, id)
        .await
        .unwrap()
        .is_admitted());
    let settled = store.settle("key-1", &budget, id, u64::MAX).await.unwrap();
    assert_eq!((settled.charged(), settled.overage()), (150, 50));
    assert_eq!(settled.verdict().decisions()[0].remaining(), 850);
    // An id never reserved (a guess) settles nothing.
    let guess = store
        .settle("key-1", &budget, ReservationId::from_u128(1), 0)
        .await
        .unwrap();
    assert_eq!(guess.outcome(), SettleOutcome::Unknown);
    assert_eq!(guess.verdict().decisions()[0].remaining(), 850);
}

#[tokio::test]
async fn hostile_estimates_and_usages_charge_no_more_than_the_bound() {
    let clock = manual_clock();
    hostile_numbers(MemoryStore::with_clock(clock.clone())).await;
    hostile_numbers(redis_store(&unique_prefix("rsv-hostile"), &clock).await).await;
}

/// At maxmemory with `noeviction`, on both call paths (the library's
/// function and the script): an open reservation is still renewed and
/// settled (the allow-oom twin), and a new one is refused with
/// `OutOfMemory`, never made past the limit nor let through.
#[tokio::test(flavor = "multi_thread")]
async fn out_of_memory_settles_held_reservations_and_refuses_new_ones() {
    let (server, functions, evalsha) = redis_common::full_redis_stores("rsv-oom").await;
    let budget = budget(Some(4), 100);
    let mut held = Vec::new();
    for store in [&functions, &evalsha] {
        let id = ReservationId::generate();
        let reserved = store.reserve("held", &budget, 300, id).await.unwrap();
        assert!(reserved.is_admitted());
        held.push(id);
    }
    portcullis_tests::reliability::fill_past_maxmemory(&server.url()).await;
    for (store, id) in [(&evalsha, held[1]), (&functions, held[0])] {
        let path = store.call_path();
        assert!(store.renew("held", &budget, id).await.unwrap(), "{path}");
        let settled = store.settle("held", &budget, id, 100).await.unwrap();
        assert_eq!(settled.outcome(), SettleOutcome::Settled, "{path}");
        assert_eq!(settled.refunded(), 200, "{path}");
        let fresh = store
            .reserve("fresh", &budget, 10, ReservationId::generate())
            .await;
        assert!(
            matches!(fresh, Err(StoreError::OutOfMemory { .. })),
            "{path}: {fresh:?}"
        );
    }
    redis_common::lift_maxmemory(&server);
}
