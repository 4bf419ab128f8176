//! Idempotency keys and priority classes (`Store::check_with`, and the
//! layer's `idempotency_key` and `priority`) on real Redis servers and in
//! memory: a retry after a timeout is charged once across two instances, a
//! different key is charged, a record expires with its window (manual
//! clock), `charge_from_response` does not charge a retry again, a flood of
//! `batch` from three OS processes leaves `critical` its share exactly, and
//! a differential holds `RedisStore` and `MemoryStore` equal for random
//! sequences of keys, classes, costs and time steps.

use crate::redis_common;

use std::convert::Infallible;
use std::process::Command;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use portcullis_core::{
    Algorithm, CheckOptions, Checked, Clock, LeakyMode, ManualClock, MemoryStore, Policy, Store,
    StoreError,
};
use portcullis_redis::{ClockMode, RedisStore};
use portcullis_tests::{priority_policy, unique_prefix};
use portcullis_tower::{Header, RateLimitLayer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis_common::{client, manual_clock, path_url, standalone};
use tower::{service_fn, Layer, ServiceExt};

const WINDOW: Duration = Duration::from_secs(600);

fn payments() -> Vec<Policy> {
    vec![Policy::per_hour(5).name("payments").build().unwrap()]
}

fn pay(key: &str) -> Request<()> {
    Request::builder()
        .header("x-account", "acme")
        .header("idempotency-key", key)
        .body(())
        .unwrap()
}

async fn remaining<St: Store>(store: &St, policies: &[Policy]) -> u64 {
    store.peek("acme", policies).await.unwrap().decisions()[0].remaining()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_timeout_is_charged_once_across_two_instances() {
    let prefix = unique_prefix("idem");
    let layer = |store: RedisStore| {
        RateLimitLayer::builder(store)
            .policies(payments())
            .key(Header::new(http::HeaderName::from_static("x-account")))
            .idempotency_key(
                Header::new(http::HeaderName::from_static("idempotency-key")),
                WINDOW,
            )
            .build()
            .unwrap()
    };
    let first = standalone(&prefix, ClockMode::Redis).await;
    let second = standalone(&prefix, ClockMode::Redis).await;
    let probe = standalone(&prefix, ClockMode::Redis).await;
    // Instance 1 admits (and charges) but its handler hangs: the client
    // gives up.
    let hanging = layer(first).layer(service_fn(|_req: Request<()>| async {
        std::future::pending::<Result<Response<String>, Infallible>>().await
    }));
    let attempt = tokio::time::timeout(Duration::from_millis(300), hanging.oneshot(pay("k-1")));
    assert!(attempt.await.is_err(), "the first attempt should time out");
    assert_eq!(remaining(&probe, &payments()).await, 4, "charged once");
    // The retry reaches instance 2: the first decision, nothing charged.
    let ok = layer(second).layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let retry = ok.clone().oneshot(pay("k-1")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
    assert_eq!(remaining(&probe, &payments()).await, 4, "the retry is free");
    // A different key is a new request: charged.
    let other = ok.clone().oneshot(pay("k-2")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(remaining(&probe, &payments()).await, 3);
    // The record's key is beside the subject's, hashed, with a TTL.
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{acme}}:#*"))
        .query(&mut raw)
        .unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in keys {
        assert!(!key.contains("k-1") && !key.contains("k-2"), "{key}");
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut raw).unwrap();
        assert!(ttl > 0 && ttl <= 600_000, "{key}: {ttl}");
    }
}

/// Both stores on one manual clock.
async fn both(clock: &ManualClock) -> (RedisStore, MemoryStore) {
    let redis = standalone(&unique_prefix("idem-clock"), client(clock)).await;
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    (redis, memory)
}

async fn same(
    stores: &(RedisStore, MemoryStore),
    subject: &str,
    policies: &[Policy],
    cost: u64,
    options: &CheckOptions,
) -> Result<Checked, String> {
    let from_redis = stores.0.check_with(subject, policies, cost, options).await;
    let from_memory = stores.1.check_with(subject, policies, cost, options).await;
    match (from_redis, from_memory) {
        (Ok(a), Ok(b)) if a == b => Ok(a),
        (Err(a), Err(b)) if format!("{a:?}") == format!("{b:?}") => Err(a.to_string()),
        (a, b) => panic!("Redis {a:?} but memory {b:?}"),
    }
}

#[tokio::test]
async fn a_record_expires_with_its_window_in_memory_and_redis_alike() {
    let clock = manual_clock();
    let stores = both(&clock).await;
    let policies = payments();
    let options = CheckOptions::new().idempotency_key("k-1", Duration::from_secs(10));
    let first = same(&stores, "acme", &policies, 1, &options).await.unwrap();
    assert!(!first.is_replay() && first.verdict().is_allowed());
    clock.advance(Duration::from_secs(9));
    let retry = same(&stores, "acme", &policies, 1, &options).await.unwrap();
    assert!(retry.is_replay());
    assert_eq!(
        retry.verdict(),
        first.verdict(),
        "the first decision, as it was"
    );
    clock.advance(Duration::from_secs(1));
    let later = same(&stores, "acme", &policies, 1, &options).await.unwrap();
    assert!(!later.is_replay(), "the window is over: a new charge");
    let peek = same(&stores, "acme", &policies, 0, &CheckOptions::new()).await;
    assert_eq!(peek.unwrap().verdict().decisions()[0].remaining(), 3);
    // A denial records nothing: the retry after its retry_after is
    // checked afresh (and admitted), in both stores alike.
    for i in 0..3 {
        let key = CheckOptions::new().idempotency_key(format!("spend-{i}"), WINDOW);
        same(&stores, "acme", &policies, 1, &key).await.unwrap();
    }
    let late = CheckOptions::new().idempotency_key("late", WINDOW);
    let denied = same(&stores, "acme", &policies, 1, &late).await.unwrap();
    assert!(!denied.verdict().is_allowed());
    let wait = denied.verdict().retry_after().unwrap();
    clock.advance(wait);
    let retried = same(&stores, "acme", &policies, 1, &late).await.unwrap();
    assert!(
        !retried.is_replay() && retried.verdict().is_allowed(),
        "a retry after the denial's Retry-After is decided afresh: {retried:?}"
    );
}

#[tokio::test]
async fn charge_from_response_does_not_charge_a_retry_again() {
    let policies = payments();
    async fn run<St: Store>(store: St, policies: &[Policy]) -> u64 {
        let store = std::sync::Arc::new(store);
        let layer = RateLimitLayer::builder_shared(std::sync::Arc::clone(&store))
            .policies(policies.iter().cloned())
            .key(Header::new(http::HeaderName::from_static("x-account")))
            .idempotency_key(
                Header::new(http::HeaderName::from_static("idempotency-key")),
                WINDOW,
            )
            .charge_from_response(|_parts| 2)
            .build()
            .unwrap();
        let service = layer.layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
        for _ in 0..3 {
            let response = service.clone().oneshot(pay("k-1")).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
        remaining(&*store, policies).await
    }
    let redis = standalone(&unique_prefix("idem-charge"), ClockMode::Redis).await;
    assert_eq!(run(redis, &policies).await, 3, "Redis: charged 2 once");
    assert_eq!(
        run(MemoryStore::new(), &policies).await,
        3,
        "memory: charged 2 once"
    );
}

/// Runs `n` checks of `class`; how many were admitted.
async fn admitted<St: Store>(store: &St, subject: &str, class: &str, n: u64) -> u64 {
    let options = CheckOptions::new().class(class);
    let mut admitted = 0;
    for _ in 0..n {
        let checked = store
            .check_with(subject, &[priority_policy()], 1, &options)
            .await
            .unwrap();
        if checked.verdict().is_allowed() {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_flood_from_three_processes_leaves_critical_its_share_exactly() {
    let prefix = unique_prefix("prio");
    let url = path_url(portcullis_tests::redis_url());
    let workers: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_priority_worker"))
                .args(["--url", &url, "--prefix", &prefix, "--subject", "acme"])
                .args(["--class", "batch", "--requests", "20"])
                .output()
        })
        .collect();
    let mut batch = 0;
    for output in workers {
        let output = output.expect("the worker should run");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let fields: Vec<u64> = stdout
            .trim()
            .split(' ')
            .map(|field| field.split('=').nth(1).unwrap().parse().unwrap())
            .collect();
        assert_eq!(fields[2], 0, "errors: {stdout}");
        assert_eq!(fields[0] + fields[1], 20);
        batch += fields[0];
    }
    assert_eq!(batch, 5, "batch stops while half of 10 remains");
    let redis = standalone(&prefix, ClockMode::Redis).await;
    // Interactive goes on while 2 remain, critical to the last permit.
    assert_eq!(admitted(&redis, "acme", "interactive", 10).await, 3);
    assert_eq!(admitted(&redis, "acme", "batch", 10).await, 0);
    assert_eq!(admitted(&redis, "acme", "critical", 10).await, 2);
    // Each class's denial says when that class may go again (10 per hour:
    // one permit every 6 minutes).
    let retry = |class: &'static str| {
        let redis = &redis;
        async move {
            let options = CheckOptions::new().class(class);
            let checked = redis
                .check_with("acme", &[priority_policy()], 1, &options)
                .await;
            checked.unwrap().verdict().retry_after().unwrap()
        }
    };
    let (critical, interactive, batch) = (
        retry("critical").await,
        retry("interactive").await,
        retry("batch").await,
    );
    assert!(critical <= Duration::from_secs(360), "{critical:?}");
    assert!(
        interactive > critical + Duration::from_secs(600),
        "{interactive:?}"
    );
    assert!(batch > interactive + Duration::from_secs(1000), "{batch:?}");
    // Memory decides alike.
    let memory = MemoryStore::new();
    assert_eq!(admitted(&memory, "acme", "batch", 60).await, 5);
    assert_eq!(admitted(&memory, "acme", "interactive", 10).await, 3);
    assert_eq!(admitted(&memory, "acme", "batch", 10).await, 0);
    assert_eq!(admitted(&memory, "acme", "critical", 10).await, 2);
}

#[tokio::test]
async fn bad_classes_and_windows_are_refused_alike() {
    let clock = manual_clock();
    let stores = both(&clock).await;
    let policies = [priority_policy()];
    // A class the policy does not define is its default class (the most
    // reserved, "batch": 5 of 10 reserved), no error.
    let unknown = same(
        &stores,
        "acme",
        &policies,
        1,
        &CheckOptions::new().class("gold"),
    )
    .await
    .unwrap();
    assert!(unknown.verdict().is_allowed());
    assert_eq!(unknown.verdict().decisions()[0].remaining(), 4);
    let too_much = same(
        &stores,
        "acme",
        &policies,
        6,
        &CheckOptions::new().class("batch"),
    )
    .await;
    assert!(too_much.unwrap_err().contains("cost 6"));
    let zero = CheckOptions::new().idempotency_key("k", Duration::ZERO);
    assert!(same(&stores, "acme", &policies, 1, &zero).await.is_err());
    let queue = Policy::per_second(5)
        .algorithm(Algorithm::LeakyBucket(LeakyMode::Queue))
        .class("batch", 50)
        .build()
        .unwrap_err();
    assert!(queue.to_string().contains("leaky_queue"), "{queue}");
    let _ = StoreError::NoPolicies;
}

/// One step of the differential: move the clock forward, then check.
#[derive(Debug, Clone)]
struct Op {
    step: u64,
    cost: u64,
    class: Option<&'static str>,
    key: Option<&'static str>,
    fingerprint: &'static str,
    free_replays: u32,
}

fn classed(algorithm: Algorithm, name: &str) -> impl Strategy<Value = Policy> + use<> {
    let name = name.to_owned();
    (
        1_u64..=10,
        prop::sample::select(vec![1_000_000_u64, 7_000_013, 60_000_000]),
    )
        .prop_map(move |(limit, period)| {
            Policy::per(limit + 2, Duration::from_micros(period))
                .algorithm(algorithm)
                .name(name.clone())
                .class("critical", 0)
                .class("interactive", 20)
                .class("batch", 50)
                .build()
                .unwrap()
        })
}

fn classed_algorithms() -> Vec<Algorithm> {
    Algorithm::ALL
        .into_iter()
        .filter(|a| *a != Algorithm::LeakyBucket(LeakyMode::Queue))
        .collect()
}

fn case() -> impl Strategy<Value = (Vec<Policy>, Vec<Op>)> {
    let policies = (
        prop::sample::select(classed_algorithms()),
        prop::option::of(prop::sample::select(classed_algorithms())),
    )
        .prop_flat_map(|(first, second)| {
            let mut all = vec![classed(first, "p0").boxed()];
            if let Some(second) = second {
                all.push(classed(second, "p1").boxed());
            }
            all
        });
    let op = (
        prop_oneof![2 => Just(0_u64), 2 => 1_u64..=500_000, 1 => 0_u64..=20_000_000],
        prop_oneof![6 => Just(1_u64), 1 => Just(0_u64), 2 => 0_u64..=4],
        prop::option::of(prop::sample::select(vec![
            "critical",
            "interactive",
            "batch",
            "gold",
        ])),
        prop::option::of(prop::sample::select(vec!["k1", "k2", "k3"])),
        prop::sample::select(vec!["GET /a", "POST /a"]),
        0..3u32,
    )
        .prop_map(|(step, cost, class, key, fingerprint, free_replays)| Op {
            step,
            cost,
            class,
            key,
            fingerprint,
            free_replays,
        });
    (policies, prop::collection::vec(op, 30))
}

#[test]
fn check_with_matches_memory() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let clock = manual_clock();
    let redis = runtime.block_on(standalone(&unique_prefix("diff-options"), client(&clock)));
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case_number = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(&case(), |(policies, ops)| {
        let n = case_number.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let subject = format!("subject-{n}");
        clock.set(manual_clock().now_micros());
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        for (i, op) in ops.iter().enumerate() {
            clock.advance(Duration::from_micros(op.step));
            let mut options = CheckOptions::new();
            if let Some(class) = op.class {
                options = options.class(class);
            }
            if let Some(key) = op.key {
                options = options
                    .idempotency_key(key, Duration::from_secs(5))
                    .fingerprint(op.fingerprint)
                    .free_replays(op.free_replays);
            }
            let a = runtime.block_on(redis.check_with(&subject, &policies, op.cost, &options));
            let b = runtime.block_on(memory.check_with(&subject, &policies, op.cost, &options));
            match (a, b) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "op {} {:?}", i, op),
                (Err(a), Err(b)) => {
                    prop_assert!(!a.is_backend(), "op {i}: Redis failed: {a}");
                    prop_assert_eq!(format!("{a:?}"), format!("{b:?}"), "op {} {:?}", i, op);
                }
                (a, b) => {
                    return Err(TestCaseError::fail(format!(
                        "op {i} {op:?}: Redis {a:?} but memory {b:?}"
                    )))
                }
            }
        }
        Ok(())
    });
    if let Err(error) = result {
        panic!("RedisStore and MemoryStore disagree on check_with: {error}");
    }
}
