//! The outage log reports every request let through undecided: the
//! rate-limited "failing open" warning logs the first at once and counts
//! the rest, and when the store answers again the count since the last
//! line is logged, so a short outage's last requests are not lost (before:
//! 3 failed open, 1 logged). The store errors' causes are logged once each.

mod log_capture;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::Request;
use log_capture::Captured;
use portcullis::tower::{
    ConcurrencyFailure, ConcurrencyLimitLayer, FailurePolicy, Header, RateLimitLayer,
};
use portcullis_core::{ConcurrencyPolicy, Policy};
use portcullis_redis::RedisStore;
use portcullis_tests::{unique_prefix, OwnedRedis};
use tower::ServiceExt as _;

/// Whether one request as `x-user: u` was decided by the store (it carries
/// `RateLimit`) rather than let through undecided.
async fn decided(app: &Router) -> bool {
    let request = Request::get("/")
        .header("x-user", "u")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert!(response.status().is_success(), "{response:?}");
    response.headers().contains_key("ratelimit")
}

/// The number a log line's message gives after `after`.
fn count_after(line: &str, after: &str) -> Option<u64> {
    let rest = &line[line.find(after)? + after.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// Runs a short outage under a layer `layer_on` builds on a store of a
/// fresh server: one request, then the server refuses every key (NOPERM,
/// a store-wide failure answered at once) for three requests, then takes
/// them again for a last one. Returns what was logged at `WARN` and
/// above, and the requests `decided` said went undecided.
fn short_outage(
    what: &str,
    layer_on: impl FnOnce(RedisStore) -> Router,
    decided: &impl AsyncFn(&Router) -> bool,
) -> (String, u64) {
    let captured = Captured::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let undecided =
        tracing::dispatcher::with_default(&captured.dispatch(tracing::Level::WARN), || {
            runtime.block_on(async {
                let server = OwnedRedis::start(&[]);
                let mut admin = redis::Client::open(server.url())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let store = RedisStore::builder()
                    .url(server.url())
                    .prefix(unique_prefix(what))
                    .timeout(Duration::from_secs(5))
                    .build()
                    .await
                    .unwrap();
                let app = layer_on(store);
                assert!(decided(&app).await);
                let mut acl = |rule: &str| {
                    let () = redis::cmd("ACL")
                        .arg("SETUSER")
                        .arg("default")
                        .arg(rule)
                        .query(&mut admin)
                        .unwrap();
                };
                acl("resetkeys");
                let mut undecided = 0;
                for _ in 0..3 {
                    undecided += u64::from(!decided(&app).await);
                }
                acl("~*");
                assert!(decided(&app).await, "the store answers again");
                undecided
            })
        });
    (captured.text(), undecided)
}

/// The requests the log reports as let through: the "failing open" lines'
/// counts and the end-of-outage line's.
fn reported(logged: &str) -> u64 {
    logged
        .lines()
        .map(|line| {
            count_after(line, "failing open: ").unwrap_or(0)
                + count_after(line, "answers again: ").unwrap_or(0)
        })
        .sum()
}

#[test]
fn the_last_requests_of_a_short_outage_are_logged_when_it_ends() {
    let (logged, let_through) = short_outage(
        "outage-log",
        |store| {
            let layer = RateLimitLayer::builder(store)
                .policy(Policy::per_hour(1_000).name("outage").build().unwrap())
                .key(Header::new(http::HeaderName::from_static("x-user")))
                .on_store_failure(FailurePolicy::FailOpen)
                .check_timeout(Duration::from_secs(5))
                // The breaker would skip the store; this test is about the log.
                .circuit_breaker(0, Duration::from_secs(1))
                .build()
                .unwrap();
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer)
        },
        &decided,
    );
    assert_eq!(let_through, 3, "the keys are refused");
    assert_eq!(
        reported(&logged),
        let_through,
        "every request let through is reported by the time the store answers:\n{logged}"
    );
    assert!(logged.contains("answers again"), "{logged}");
    // The store errors' causes, as `tracing` lists them, each once (before:
    // redis-rs's error and the server error it wraps, the same text twice).
    let mut lists = 0;
    for line in logged.lines() {
        let Some(start) = line.find("error.sources=[") else {
            continue;
        };
        let list = &line[start + "error.sources=[".len()..];
        let list = &list[..list.rfind(']').unwrap_or(list.len())];
        let causes: Vec<&str> = list.split(", ").collect();
        for cause in &causes {
            assert_eq!(
                causes.iter().filter(|c| c == &cause).count(),
                1,
                "{cause:?} twice in {line}"
            );
        }
        lists += 1;
    }
    assert!(lists > 0, "no store error logged its causes:\n{logged}");
}

#[test]
fn the_concurrency_layer_logs_the_last_requests_of_a_short_outage_too() {
    // Run without a permit: the concurrency layer adds no header, so every
    // request of the outage counts as one (3), as the rate layer's do.
    let (logged, _) = short_outage(
        "outage-log-concurrency",
        |store| {
            let layer = ConcurrencyLimitLayer::builder(store)
                .policy(
                    ConcurrencyPolicy::max_in_flight(10)
                        .name("streams")
                        .build()
                        .unwrap(),
                )
                .key(Header::new(http::HeaderName::from_static("x-user")))
                .on_store_failure(ConcurrencyFailure::FailOpen)
                // The breaker would skip the store; this test is about the log.
                .circuit_breaker(0, Duration::from_secs(1))
                .build()
                .unwrap();
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer)
        },
        &|app: &Router| {
            let app = app.clone();
            async move {
                let request = Request::get("/")
                    .header("x-user", "u")
                    .body(axum::body::Body::empty())
                    .unwrap();
                let response = app.oneshot(request).await.unwrap();
                assert!(response.status().is_success(), "{response:?}");
                true
            }
        },
    );
    assert_eq!(
        reported(&logged),
        3,
        "every request run without a permit is reported by the time the store answers:\n{logged}"
    );
    assert!(logged.contains("answers again"), "{logged}");
}
