//! A coalesced check told it failed was not charged: a waiting check
//! either gets its batch's answer or is withdrawn before its batch is
//! taken (never sent), however long the queue ahead of it. Before, a check
//! queued behind a few slow batches ran out its fixed wait (2 × timeout)
//! while its batch was in flight: it answered `Timeout`, and the batch
//! charged it all the same.
//!
//! A private server that sleeps again and again (`DEBUG SLEEP`, from a
//! connection of its own, each sleep far shorter than the store's timeout,
//! so no call times out) makes every call of a long queue slow. Redis
//! Functions only: xtask skips it by name on servers before Redis 7.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use portcullis_core::{Algorithm, Policy, Store};
use portcullis_redis::RedisStore;
use portcullis_tests::{unique_prefix, OwnedRedis};

/// The store's timeout: every call ends well within it (a server sleep is
/// a fifth of it), so no call's own timeout charges without an answer.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long each server sleep lasts, in seconds.
const SLEEP_SECONDS: &str = "0.2";
/// The checks sent at once: one leads, the rest queue in fourteen batches
/// (more than twice the timeout's worth of slow calls).
const CHECKS: usize = 1 + 128 * 14;
const LIMIT: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_check_gets_its_batch_answer_or_is_not_charged() {
    let server = OwnedRedis::start(portcullis_tests::debug_command_args());
    let store = RedisStore::builder()
        .url(server.url())
        .prefix(unique_prefix("coalesce-timeout"))
        .timeout(TIMEOUT)
        .build()
        .await
        .expect("the store should build");
    // A fixed window of 30 days: `remaining` counts every charge exactly.
    let policy = [Policy::per(LIMIT, Duration::from_secs(30 * 86_400))
        .algorithm(Algorithm::FixedWindow)
        .name("queue")
        .build()
        .unwrap()];
    assert!(store.check("warm", &policy, 1).await.unwrap().is_allowed());

    // The server sleeps in back-to-back stretches: each call of the queue
    // waits out (part of) one.
    let stop = Arc::new(AtomicBool::new(false));
    let sleeper = {
        let stop = Arc::clone(&stop);
        let url = server.url();
        std::thread::spawn(move || {
            let mut admin = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut sleeps = 0_u32;
            while !stop.load(Ordering::SeqCst) {
                let () = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(SLEEP_SECONDS)
                    .query(&mut admin)
                    .expect("DEBUG SLEEP");
                sleeps += 1;
            }
            sleeps
        })
    };
    let results = join_all((0..CHECKS).map(|_| store.check("s", &policy, 1))).await;
    stop.store(true, Ordering::SeqCst);
    let sleeps = sleeper.join().unwrap();
    assert!(sleeps > 1, "the server slept {sleeps} time(s)");

    let mut reported = Vec::new();
    let mut errors = Vec::new();
    for result in &results {
        match result {
            Ok(verdict) => {
                let decision = &verdict.decisions()[0];
                assert!(decision.is_allowed(), "{verdict:?}");
                reported.push(decision.remaining());
            }
            Err(error) => errors.push(format!("{error:?}")),
        }
    }
    let peeked = store.peek("s", &policy).await.unwrap();
    let charged = LIMIT - peeked.decisions()[0].remaining();
    assert!(charged > 0, "nothing ran");
    // Each charge was answered to exactly one check (the remaining counts
    // the answers report are those of the charges, one each): a check that
    // got an error, a timeout or a withdrawal, was not charged.
    reported.sort_unstable();
    let expected: Vec<u64> = (LIMIT - charged..LIMIT).collect();
    assert_eq!(
        reported.len() as u64,
        charged,
        "{charged} charged, {} answered, {} errors (of {CHECKS}), such as {:?}",
        reported.len(),
        errors.len(),
        errors.first()
    );
    assert_eq!(reported, expected);
    // The only error a waiting check may get here: withdrawn, never sent.
    for error in &errors {
        assert!(error.contains("not sent"), "{error}");
    }
}
