//! Restarts: `SCRIPT FLUSH` and a killed and restarted server mid-run.
//! Decisions resume; only calls in flight while the server is down fail,
//! with typed backend errors, never a panic.

use crate::redis_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::Store;
use portcullis_redis::RedisStore;
use portcullis_tests::{unique_prefix, OwnedRedis};

async fn store(url: String) -> RedisStore {
    RedisStore::builder()
        .url(url)
        .prefix(unique_prefix("restart"))
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn script_flush_mid_run_is_survived() {
    let server = OwnedRedis::start(&[]);
    // On the EVALSHA path (PORTCULLIS_REDIS_CALL_PATH=evalsha) as a user
    // without functions; redis_functions.rs flushes the functions.
    let store = store(redis_common::path_url(server.url())).await;
    let policies = redis_common::every_algorithm();
    let mut raw = redis_common::raw(&server.url());
    for i in 0..30_u64 {
        if i % 10 == 5 {
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut raw).unwrap();
        }
        let verdict = store
            .check("subject", &policies, 1)
            .await
            .unwrap_or_else(|e| panic!("check {i} after SCRIPT FLUSH failed: {e}"));
        assert!(verdict.is_allowed());
        // State survives the flush (only scripts were dropped): the count
        // goes on, it does not restart.
        for decision in verdict.decisions() {
            assert_eq!(decision.remaining(), 1_000 - (i + 1), "check {i}");
        }
        // The single-policy and other combinations reload too.
        store.check("other", &policies[..1], 1).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_and_restarted_server_is_survived() {
    let mut server = OwnedRedis::start(&[]);
    let store = store(server.url()).await;
    let policies = redis_common::every_algorithm();
    store.check("warm", &policies, 1).await.unwrap();

    // Hammer in the background while the server goes down and comes back.
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..8 {
        let store = store.clone();
        let policies = policies.clone();
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0_u64, 0_u64);
            while !stop.load(Ordering::Acquire) {
                match store.check(&format!("w{worker}"), &policies, 1).await {
                    Ok(_) => ok += 1,
                    Err(error) => {
                        assert!(error.is_backend(), "only backend errors: {error}");
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // While down: typed errors, nothing hangs.
    let while_down = store.check("probe", &policies, 1).await;
    assert!(
        while_down
            .as_ref()
            .is_err_and(portcullis_core::StoreError::is_backend),
        "{while_down:?}"
    );
    server.restart();
    // Every call started after the server is back succeeds.
    for i in 0..50 {
        let verdict = store
            .check("after", &policies, 1)
            .await
            .unwrap_or_else(|e| panic!("check {i} after the restart failed: {e}"));
        assert!(verdict.is_allowed());
        assert_eq!(verdict.decisions()[0].remaining(), 1_000 - (i + 1));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Release);
    let mut total_ok = 0;
    for worker in workers {
        let (ok, _failed) = worker.await.expect("no worker panicked");
        total_ok += ok;
    }
    assert!(total_ok > 0, "the workers made progress");
}

/// On the Cluster, `NOSCRIPT` comes from the master serving the key's slot;
/// the script is loaded there and the check goes on.
#[tokio::test(flavor = "multi_thread")]
async fn script_flush_on_the_cluster_is_survived() {
    let store = redis_common::cluster(
        &unique_prefix("restart-cluster"),
        portcullis_redis::ClockMode::Redis,
    )
    .await;
    let policies = redis_common::every_algorithm();
    let subjects = ["a", "b", "c", "d", "e", "f"];
    for round in 0..3_u64 {
        for url in portcullis_tests::cluster_urls() {
            let mut raw = redis_common::raw(&url);
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut raw).unwrap();
        }
        for subject in subjects {
            let verdict = store
                .check(subject, &policies, 1)
                .await
                .unwrap_or_else(|e| panic!("{subject} after SCRIPT FLUSH failed: {e}"));
            assert_eq!(verdict.decisions()[0].remaining(), 1_000 - (round + 1));
        }
    }
}
