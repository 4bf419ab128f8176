//! Faults of a standalone Redis under load: killed and restarted (for each
//! failure policy), slow (`CLIENT PAUSE`, `DEBUG SLEEP`), and a pool that
//! cannot get a connection. Each test owns its `redis-server` (it kills or
//! stalls it). The figures are printed; assertions are on outcomes, never
//! on time. `cargo xtask reliability` runs longer versions and prints the
//! table.

use std::time::Duration;

use portcullis_tests::reliability::{
    kill_restart, no_hang, pool_exhaustion, slow_redis, table, FailureMode, KillRestart, SlowRedis,
    Slowdown,
};
use portcullis_tests::OwnedRedis;

/// What a store call may end with. `cancelled` is the layer's own timeout
/// (500 ms) ending a call first: a check queued behind a call that timed
/// out waits up to twice the store's timeout (250 ms) for its batch, so on
/// a loaded machine the layer's deadline can come before the store's
/// answer. The layer then applies its failure policy, as for a store error.
const TYPED: [&str; 6] = [
    "allowed",
    "denied",
    "unavailable",
    "unknown",
    "timeout",
    "cancelled",
];

async fn killed_and_restarted(mode: FailureMode) {
    let mut server = tokio::task::block_in_place(|| OwnedRedis::start(&[]));
    let config = KillRestart::quick(mode);
    let report = no_hang(
        Duration::from_secs(60),
        "the kill/restart scenario",
        kill_restart(&mut server, &config),
    )
    .await;
    println!("{}", table(std::slice::from_ref(&report.row)));
    println!("store calls: {:?}", report.store);

    assert_eq!(report.all.hung, 0, "no request may hang");
    assert_eq!(report.all.other, 0, "no status other than 200, 429 and 503");
    assert_eq!(
        report.policy_violations,
        0,
        "every request during the outage gets the configured failure policy ({})",
        mode.as_str()
    );
    assert_eq!(
        report.admission_errors, 0,
        "neither Redis nor the fallback over- or under-admits"
    );
    assert!(
        report.outage.total() > 20,
        "load kept running during the outage: {:?}",
        report.outage
    );
    match mode {
        FailureMode::Open => assert!(
            report.outage.passed > 0,
            "fail-open lets requests through: {:?}",
            report.outage
        ),
        FailureMode::Closed => assert!(
            report.outage.closed > 0,
            "fail-closed answers 503: {:?}",
            report.outage
        ),
        FailureMode::Fallback => {
            assert!(
                report.outage.admitted > 0,
                "the fallback decides: {:?}",
                report.outage
            );
        }
    }
    assert!(
        report.store.keys().all(|k| TYPED.contains(&k.as_str())),
        "every store failure is a typed backend error: {:?}",
        report.store
    );
    assert!(
        report.store.get("unavailable").copied().unwrap_or(0) > 0,
        "the outage was seen by the store"
    );
    assert!(
        report.recovered.is_some(),
        "the store decides again after the restart, on its own"
    );
    assert!(report.decisions_after > 0);
    assert!(
        report.script_loads >= 1,
        "the scripts were loaded again on the restarted server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_fail_open() {
    killed_and_restarted(FailureMode::Open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_fail_closed() {
    killed_and_restarted(FailureMode::Closed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_fallback() {
    killed_and_restarted(FailureMode::Fallback).await;
}

async fn slow(how: Slowdown, args: &[&str]) {
    let server = tokio::task::block_in_place(|| OwnedRedis::start(args));
    let config = SlowRedis::quick(how);
    let report = no_hang(
        Duration::from_secs(60),
        "the slow-Redis scenario",
        slow_redis(&server, &config),
    )
    .await;
    println!("{}", table(std::slice::from_ref(&report.row)));

    assert!(
        report.direct_timeout_at_bound,
        "a call during the stall fails with StoreError::Timeout at the configured {:?}, got {:?}",
        config.store_timeout, report.direct_error
    );
    assert!(
        report.stalled_requests > u64::from(config.breaker.0) + 10,
        "{} requests",
        report.stalled_requests
    );
    assert_eq!(
        report.reached_store,
        u64::from(config.breaker.0),
        "after {} failures the circuit breaker answers without asking the store",
        config.breaker.0
    );
    assert_eq!(
        report.replies.passed, report.stalled_requests,
        "fail-open lets every stalled request through"
    );
    assert_eq!(
        report.replies.hung + report.replies.other + report.replies.closed,
        0
    );
    // Timed-out calls may or may not have run (usually they run once the
    // stall ends); none may run twice, and nothing admitted may be lost.
    assert!(
        report.charged <= report.admitted + report.maybe_ran,
        "double charge: Redis charged {} for {} admitted and {} timed-out calls",
        report.charged,
        report.admitted,
        report.maybe_ran
    );
    assert!(
        report.charged >= report.admitted,
        "an admitted call was not charged"
    );
    assert!(
        report.maybe_ran > u64::from(config.breaker.0),
        "the timed-out calls ran after the stall"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_paused_times_out_opens_the_breaker_and_never_double_charges() {
    slow(Slowdown::ClientPause, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_debug_sleep_times_out_opens_the_breaker_and_never_double_charges() {
    slow(Slowdown::DebugSleep, portcullis_tests::debug_command_args()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exhausted_pool_gives_a_typed_error_never_a_hang() {
    let report = no_hang(
        Duration::from_secs(60),
        "the pool scenario",
        pool_exhaustion(100),
    )
    .await;
    println!("{}", table(std::slice::from_ref(&report.row)));

    assert_eq!(report.hung, 0, "no call hangs");
    let typed = |counts: &std::collections::BTreeMap<String, u64>| {
        counts
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "unavailable" | "timeout"))
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    assert_eq!(
        typed(&report.black_hole),
        100,
        "a server that never answers: {:?}",
        report.black_hole
    );
    assert_eq!(
        report.full_server.get("unavailable").copied().unwrap_or(0),
        100,
        "a server refusing clients: nothing was charged, so Unavailable: {:?}",
        report.full_server
    );
    let decided: u64 = report
        .one_connection
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "allowed" | "denied"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        decided, 1_000,
        "one pooled connection serves 1000 concurrent calls: {:?}",
        report.one_connection
    );
}
