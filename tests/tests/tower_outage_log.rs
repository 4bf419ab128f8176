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

#[test]
fn the_last_requests_of_a_short_outage_are_logged_when_it_ends() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let let_through = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let server = OwnedRedis::start(&[]);
            let mut admin = redis::Client::open(server.url())
                .unwrap()
                .get_connection()
                .unwrap();
            let store = RedisStore::builder()
                .url(server.url())
                .prefix(unique_prefix("outage-log"))
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap();
            let layer = RateLimitLayer::builder(store)
                .policy(Policy::per_hour(1_000).name("outage").build().unwrap())
                .key(Header::new(http::HeaderName::from_static("x-user")))
                .on_store_failure(FailurePolicy::FailOpen)
                .check_timeout(Duration::from_secs(5))
                // The breaker would skip the store; this test is about the log.
                .circuit_breaker(0, Duration::from_secs(1))
                .build()
                .unwrap();
            let app = Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer);
            assert!(decided(&app).await);
            // A short outage: the server refuses every key (NOPERM, a
            // store-wide failure answered at once), three requests are let
            // through, then it takes them again.
            let mut acl = |rule: &str| {
                let () = redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("default")
                    .arg(rule)
                    .query(&mut admin)
                    .unwrap();
            };
            acl("resetkeys");
            let mut let_through = 0;
            for _ in 0..3 {
                assert!(!decided(&app).await, "the keys are refused");
                let_through += 1;
            }
            acl("~*");
            assert!(decided(&app).await, "the store answers again");
            let_through
        })
    });
    let logged = captured.text();
    let mut reported = 0;
    for line in logged.lines() {
        reported += count_after(line, "failing open: ").unwrap_or(0);
        reported += count_after(line, "answers again: ").unwrap_or(0);
    }
    assert_eq!(
        reported, let_through,
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
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let run_without_permit = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let server = OwnedRedis::start(&[]);
            let mut admin = redis::Client::open(server.url())
                .unwrap()
                .get_connection()
                .unwrap();
            let store = RedisStore::builder()
                .url(server.url())
                .prefix(unique_prefix("outage-log-concurrency"))
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap();
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
            let app = Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer);
            let send = || async {
                let request = Request::get("/")
                    .header("x-user", "u")
                    .body(axum::body::Body::empty())
                    .unwrap();
                let response = app.clone().oneshot(request).await.unwrap();
                assert!(response.status().is_success(), "{response:?}");
            };
            send().await;
            let mut acl = |rule: &str| {
                let () = redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("default")
                    .arg(rule)
                    .query(&mut admin)
                    .unwrap();
            };
            acl("resetkeys");
            for _ in 0..3 {
                send().await;
            }
            acl("~*");
            send().await;
            3
        })
    });
    let logged = captured.text();
    let mut reported = 0;
    for line in logged.lines() {
        reported += count_after(line, "failing open: ").unwrap_or(0);
        reported += count_after(line, "answers again: ").unwrap_or(0);
    }
    assert_eq!(
        reported, run_without_permit,
        "every request run without a permit is reported by the time the store answers:\n{logged}"
    );
    assert!(logged.contains("answers again"), "{logged}");
}
