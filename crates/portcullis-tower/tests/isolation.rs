//! No subject's fault changes another subject's decision: errors about one
//! subject or one new subject never open the circuit breaker, a new subject
//! the store has no room for is denied whatever the failure policy, and
//! every request let through undecided is counted and logged (at most once
//! per second), as are the breaker opening and closing.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use portcullis_core::{MemoryStore, Policy, Store, StoreError, Verdict, WhenFull};
use portcullis_tower::{FailurePolicy, RateLimitLayer};
use tower::ServiceExt;

type BoxCheck = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send>>;

/// A memory store in which one subject's stored value is corrupt (every
/// check of it fails as a Redis script does on a key of the wrong type),
/// and which can be switched to fail as a whole; counts its checks.
#[derive(Clone)]
struct OneBadSubject {
    inner: MemoryStore,
    bad: &'static str,
    down: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Store for OneBadSubject {
    type CheckFuture = BoxCheck;
    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(StoreError::unavailable(
                "connection refused",
            ))));
        }
        if subject == self.bad {
            return Box::pin(std::future::ready(Err(StoreError::Protocol {
                detail: "WRONGTYPE Operation against a key holding the wrong kind of value".into(),
            })));
        }
        Box::pin(self.inner.check(subject, policies, cost))
    }
    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.inner.reset(subject, policies)
    }
}

fn app<St: Store>(layer: RateLimitLayer<St>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn get_from(ip: &str) -> Request<Body> {
    Request::get("/")
        .extension(ConnectInfo(SocketAddr::new(ip.parse().unwrap(), 40_000)))
        .body(Body::empty())
        .unwrap()
}

async fn send(app: &Router, ip: &str) -> (StatusCode, http::HeaderMap) {
    let response = app.clone().oneshot(get_from(ip)).await.unwrap();
    let (parts, body) = response.into_parts();
    body.collect().await.unwrap();
    (parts.status, parts.headers)
}

/// Log lines written while a test runs (each test installs its own
/// subscriber for its own thread).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn lines(&self, containing: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| line.contains(containing))
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_corrupt_value_fails_only_its_own_requests_and_never_opens_the_breaker() {
    let logs = Logs::default();
    let _guard = logs.install();
    let calls = Arc::new(AtomicUsize::new(0));
    let store = OneBadSubject {
        inner: MemoryStore::new(),
        bad: "192.0.2.66",
        down: Arc::default(),
        calls: Arc::clone(&calls),
    };
    // The layer's defaults: fail-open, breaker 5 failures / 1 s.
    let app = app(RateLimitLayer::builder(store)
        .policy(Policy::per_hour(5).name("api").build().unwrap())
        .build()
        .unwrap());
    let mut good_admitted = [0; 3];
    for round in 0..20 {
        // The bad subject's requests are answered by its failure policy
        // (fail-open: through, without headers) ...
        let (status, headers) = send(&app, "192.0.2.66").await;
        assert_eq!(status, StatusCode::OK, "round {round}");
        assert!(headers.get("ratelimit").is_none());
        // ... and every other subject keeps exactly its limit.
        for (i, admitted) in good_admitted.iter_mut().enumerate() {
            let (status, headers) = send(&app, &format!("192.0.2.{}", i + 1)).await;
            assert!(
                headers.get("ratelimit").is_some(),
                "192.0.2.{} was passed undecided in round {round}",
                i + 1
            );
            if status == StatusCode::OK {
                *admitted += 1;
            } else {
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            }
        }
    }
    assert_eq!(good_admitted, [5, 5, 5]);
    // Every request the deny cache did not answer reached the store (the
    // breaker never opened): the bad subject's 20, and per good subject 5
    // admitted and 1 denied (the deny cache answers its other 14).
    assert_eq!(calls.load(Ordering::SeqCst), 20 + 3 * 6);
    assert!(logs.lines("circuit breaker opened").is_empty());
    // Twenty undecided passes in no time: logged once, with the count.
    let warnings = logs.lines("let through undecided");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("count=1"), "{warnings:?}");
    tokio::time::advance(Duration::from_secs(1)).await;
    send(&app, "192.0.2.66").await;
    let warnings = logs.lines("let through undecided");
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[1].contains("count=20"), "{warnings:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn store_wide_failures_open_the_breaker_and_recovery_closes_it_with_logs() {
    let logs = Logs::default();
    let _guard = logs.install();
    let down = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let store = OneBadSubject {
        inner: MemoryStore::new(),
        bad: "none",
        down: Arc::clone(&down),
        calls: Arc::clone(&calls),
    };
    let app = app(RateLimitLayer::builder(store)
        .policy(Policy::per_hour(5).name("api").build().unwrap())
        .build()
        .unwrap());
    for _ in 0..10 {
        assert_eq!(send(&app, "192.0.2.1").await.0, StatusCode::OK);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5, "open after five failures");
    let opened = logs.lines("circuit breaker opened");
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert!(opened[0].contains("WARN"), "{opened:?}");
    // The store error's cause (its `source()`, not in its `Display`) is
    // logged too.
    assert!(opened[0].contains("connection refused"), "{opened:?}");
    down.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(1)).await;
    let (status, headers) = send(&app, "192.0.2.1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("ratelimit").is_some(), "decided again");
    let closed = logs.lines("circuit breaker closed");
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert!(closed[0].contains("INFO"), "{closed:?}");
}

#[tokio::test]
async fn a_new_subject_a_full_store_refuses_is_denied_even_when_failing_open() {
    let store = MemoryStore::builder()
        .max_keys(2)
        .when_full(WhenFull::Deny)
        .build();
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_hour(3).name("api").build().unwrap())
        .on_store_failure(FailurePolicy::FailOpen)
        .build()
        .unwrap();
    let app = app(layer);
    assert_eq!(send(&app, "192.0.2.1").await.0, StatusCode::OK);
    assert_eq!(send(&app, "192.0.2.2").await.0, StatusCode::OK);
    for _ in 0..20 {
        let (status, headers) = send(&app, "192.0.2.3").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        // One permit of 3/hour refills in 20 minutes.
        assert_eq!(headers.get("retry-after").unwrap(), "1200");
    }
    // The held subjects keep exactly their remaining two permits: the
    // refusals opened no breaker.
    for ip in ["192.0.2.1", "192.0.2.2"] {
        for expected in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let (status, headers) = send(&app, ip).await;
            assert_eq!(status, expected, "{ip}");
            assert!(headers.get("ratelimit").is_some(), "{ip} decided");
        }
    }
}

#[tokio::test]
async fn the_status_of_a_refused_new_subject_can_be_503_and_a_fallback_does_not_pass_it() {
    let store = MemoryStore::builder()
        .max_keys(1)
        .when_full(WhenFull::Deny)
        .build();
    let fallback = MemoryStore::builder()
        .max_keys(1)
        .when_full(WhenFull::Deny)
        .build();
    let app = app(RateLimitLayer::builder(store)
        .policy(Policy::per_hour(3).name("api").build().unwrap())
        .on_store_failure(FailurePolicy::fallback(fallback))
        .no_room_status(StatusCode::SERVICE_UNAVAILABLE)
        .build()
        .unwrap());
    assert_eq!(send(&app, "192.0.2.1").await.0, StatusCode::OK);
    let (status, headers) = send(&app, "192.0.2.2").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.get("retry-after").is_some());
}

#[tokio::test]
async fn a_dry_run_forwards_a_new_subject_the_store_has_no_room_for() {
    let store = MemoryStore::builder()
        .max_keys(1)
        .when_full(WhenFull::Deny)
        .build();
    let app = app(RateLimitLayer::builder(store)
        .policy(Policy::per_hour(3).name("api").build().unwrap())
        .dry_run()
        .build()
        .unwrap());
    assert_eq!(send(&app, "192.0.2.1").await.0, StatusCode::OK);
    assert_eq!(
        send(&app, "192.0.2.2").await.0,
        StatusCode::OK,
        "a dry run never rejects"
    );
}
