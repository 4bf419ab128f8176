//! Limits as data over Redis: two instances sharing Redis follow one
//! limits file together, and the memory store and Redis decide alike
//! across changes of the limits.

use crate::redis_common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use portcullis::tower::{Header, RateLimitLayer};
use portcullis::{LimitSet, Limits, LimitsFile, ManualClock, MemoryStore, Policy, Store};
use portcullis_redis::ClockMode;
use portcullis_tests::unique_prefix;
use redis_common::{manual_clock, standalone};
use tower::{service_fn, Layer, ServiceExt};

fn layer<St: Store>(store: St, limits: &Limits) -> RateLimitLayer<St, Header> {
    RateLimitLayer::builder(store)
        .key(Header::new(HeaderName::from_static("x-customer")))
        .limits(limits.clone())
        // Every answer from the store, none from a local cache.
        .deny_cache(0)
        .build()
        .expect("valid layer")
}

/// Status, `RateLimit-Policy`, `RateLimit` and `Retry-After` of one
/// request of `customer`.
async fn ask<St: Store>(
    layer: &RateLimitLayer<St, Header>,
    customer: &str,
) -> (StatusCode, String, String, String) {
    let service = layer.layer(service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let request = Request::get("/")
        .header("x-customer", customer)
        .body(())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    (
        response.status(),
        header("ratelimit-policy"),
        header("ratelimit"),
        header("retry-after"),
    )
}

fn file_with(limit: u64) -> String {
    format!("default = [\"api\"]\n[policies]\napi = {{ limit = {limit}, period = \"1m\" }}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_both_follow_a_changed_file() {
    let prefix = unique_prefix("limits-two");
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, file_with(10)).unwrap();
    // Two instances: each its own store (connections), file handle and
    // watcher; one Redis.
    let files = [
        LimitsFile::open(&path).unwrap(),
        LimitsFile::open(&path).unwrap(),
    ];
    let _watchers: Vec<_> = files
        .iter()
        .map(|f| f.watch(Duration::from_millis(50)))
        .collect();
    let a = layer(
        standalone(&prefix, ClockMode::Redis).await,
        &files[0].limits(),
    );
    let b = layer(
        standalone(&prefix, ClockMode::Redis).await,
        &files[1].limits(),
    );
    for _ in 0..3 {
        assert_eq!(ask(&a, "acme").await.0, StatusCode::OK);
        assert_eq!(ask(&b, "acme").await.0, StatusCode::OK);
    }
    let (_, policy, ratelimit, _) = ask(&a, "acme").await;
    assert_eq!(policy, "\"api\";q=10;w=60");
    assert!(
        ratelimit.starts_with("\"api\";r=3;"),
        "shared count: {ratelimit}"
    );

    // Lower the limit below what acme used (7 of 10 per minute: 42 s of
    // GCRA's time, more than a 2-per-minute bucket holds): both instances
    // deny.
    std::fs::write(&path, file_with(2)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while files.iter().any(|f| f.limits().version() < 2) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watchers applied the file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for instance in [&a, &b] {
        let (status, policy, _, retry) = ask(instance, "acme").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(policy, "\"api\";q=2;w=60");
        assert!(!retry.is_empty());
        // Another customer is admitted under the new limit.
        let (status, _, ratelimit, _) = ask(instance, "newcomer").await;
        assert_eq!(status, StatusCode::OK);
        assert!(ratelimit.starts_with("\"api\";r="), "{ratelimit}");
    }
    assert_eq!(files[0].hash(), files[1].hash());

    // Raise it again: both admit.
    std::fs::write(&path, file_with(100)).unwrap();
    while files.iter().any(|f| f.limits().version() < 3) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watchers applied the file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ask(&a, "acme").await.0, StatusCode::OK);
    assert_eq!(ask(&b, "acme").await.0, StatusCode::OK);
    std::fs::remove_file(&path).ok();
}

fn policy(name: &str, limit: u64) -> Policy {
    Policy::per_minute(limit).name(name).build().expect("valid")
}

#[tokio::test]
async fn memory_and_redis_decide_alike_across_changes_of_the_limits() {
    let clock: ManualClock = manual_clock();
    let limits = Limits::new(
        LimitSet::builder()
            .policy(policy("minute", 6))
            .tier("pro", [policy("minute", 20), policy("pro-day", 1_000)])
            .build()
            .unwrap(),
    );
    let memory = layer(MemoryStore::with_clock(clock.clone()), &limits);
    let redis = layer(
        standalone(
            &unique_prefix("limits-differential"),
            ClockMode::Client(Arc::new(clock.clone())),
        )
        .await,
        &limits,
    );
    let customers = ["acme", "globex", "initech"];
    let mut compared = 0;
    for step in 0..60_u64 {
        match step {
            // Lower everyone's limit below what they used.
            12 => limits.update(|s| s.defaults([policy("minute", 3)])),
            // Move acme to the pro tier (same policy name: its count stays).
            20 => limits.update(|s| s.override_tier("acme", "pro")),
            // Raise the defaults again.
            30 => limits.update(|s| s.defaults([policy("minute", 12)])),
            // globex gets a quota of its own.
            38 => limits.update(|s| s.override_policies("globex", [policy("globex-minute", 2)])),
            // acme back to the defaults.
            46 => limits.update(|s| s.remove_override("acme")),
            _ => Ok(0),
        }
        .unwrap();
        let customer = customers[(step % 3) as usize];
        let in_memory = ask(&memory, customer).await;
        let in_redis = ask(&redis, customer).await;
        assert_eq!(in_memory, in_redis, "step {step}, {customer}");
        compared += 1;
        clock.advance(Duration::from_millis(1_700));
    }
    assert_eq!(compared, 60);
    assert_eq!(limits.version(), 6);
}
