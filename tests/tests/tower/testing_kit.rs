//! The test kit (`portcullis::testing`) as a user's tests use it: an Axum
//! app driven by a manual clock (in memory, and on Redis where the layer's
//! deny cache must follow the same clock), a store failing on command
//! behind layers that fail open and closed, and the default clock's
//! indifference to a step of the wall clock.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::{routing::get, Router};
use portcullis::redis::{ClockMode, RedisStore};
use portcullis::testing::{Fault, FaultStore, RateLimitFields};
use portcullis::tower::{ApiKey, FailurePolicy, RateLimitLayer};
use portcullis::{Clock, ManualClock, MemoryStore, MonotonicClock, Policy, Store, SystemClock};
use portcullis_tests::{redis_url, unique_prefix};
use tower::ServiceExt;

fn app<St: Store>(store: St, clock: &ManualClock) -> Router {
    let limit = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(5).name("api").build().unwrap())
        .key(ApiKey::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limit)
}

fn request() -> Request<Body> {
    Request::get("/")
        .header("x-api-key", "k-1")
        .body(Body::empty())
        .unwrap()
}

/// Five pass with their remaining counted down, the sixth is refused with
/// the wait the store computed, and after that wait on the manual clock
/// the next passes. (The doc example of `portcullis::testing`.)
async fn sixth_refused_then_passes_after_the_wait(app: Router, clock: &ManualClock) {
    for left in (0..5).rev() {
        let response = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let fields = RateLimitFields::read(response.headers()).unwrap();
        assert_eq!(fields.remaining(), Some(left));
        assert_eq!(fields.get("api").and_then(|f| f.quota), Some(5));
    }
    let refused = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait = RateLimitFields::read(refused.headers())
        .unwrap()
        .retry_after()
        .unwrap();
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(12),
        "{wait:?}"
    );

    // Refused again while the clock stands still (on Redis, answered by
    // the layer's deny cache).
    let still = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(still.status(), StatusCode::TOO_MANY_REQUESTS);

    clock.advance(wait);
    let again = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_manual_clock_drives_the_layer_and_the_memory_store() {
    let clock = ManualClock::new(SystemClock.now_micros());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    sixth_refused_then_passes_after_the_wait(app(store, &clock), &clock).await;
}

#[tokio::test]
async fn a_manual_clock_drives_the_layer_deny_cache_and_the_redis_store() {
    let clock = ManualClock::new(SystemClock.now_micros());
    let store = RedisStore::builder()
        .url(redis_url())
        .prefix(unique_prefix("testing-kit"))
        .clock(ClockMode::Client(Arc::new(clock.clone())))
        .build()
        .await
        .unwrap();
    sixth_refused_then_passes_after_the_wait(app(store, &clock), &clock).await;
}

/// Without the layer's clock, the deny cache would hold the denial in
/// tokio's time, which the manual clock does not move: the control for the
/// test above, showing that `clock` is what makes it pass.
#[tokio::test]
async fn without_the_layer_clock_the_deny_cache_keeps_tokio_time() {
    let clock = ManualClock::new(SystemClock.now_micros());
    let store = RedisStore::builder()
        .url(redis_url())
        .prefix(unique_prefix("testing-kit-control"))
        .clock(ClockMode::Client(Arc::new(clock.clone())))
        .build()
        .await
        .unwrap();
    let limit = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(1).name("api").build().unwrap())
        .key(ApiKey::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limit);
    assert_eq!(
        app.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    let refused = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_secs(120));
    let cached = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(cached.status(), StatusCode::TOO_MANY_REQUESTS);
}

fn failing_app(store: FaultStore<MemoryStore>, failure: FailurePolicy) -> Router {
    let limit = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(2).name("api").build().unwrap())
        .key(ApiKey::new())
        .on_store_failure(failure)
        .check_timeout(Duration::from_millis(100))
        // Every failure is answered by the policy, none skipped.
        .circuit_breaker(0, Duration::from_secs(1))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limit)
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_is_let_through_when_failing_open_and_refused_when_closed() {
    for (failure, expected) in [
        (FailurePolicy::FailOpen, StatusCode::OK),
        (FailurePolicy::FailClosed, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let store = FaultStore::new(MemoryStore::new());
        let app = failing_app(store.clone(), failure.clone());
        for fault in [
            Fault::Unavailable,
            Fault::Timeout,
            Fault::OutcomeUnknown,
            Fault::Stall,
        ] {
            store.set(fault);
            // More requests than the limit: none is charged while failing.
            for _ in 0..3 {
                let response = app.clone().oneshot(request()).await.unwrap();
                assert_eq!(response.status(), expected, "{failure:?} {fault:?}");
            }
        }
        assert_eq!(store.calls(), 12);
        // Back to a working store: the subject's whole limit is there.
        store.set(Fault::Pass);
        for status in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            assert_eq!(
                app.clone().oneshot(request()).await.unwrap().status(),
                status
            );
        }
    }
}

/// The default clock does not read the wall clock after its first reading;
/// `MonotonicClock` shows the same on a wall clock a test can step. An
/// hour back or forward changes no decision: the subject at its limit is
/// neither held for the hour nor refilled.
#[tokio::test]
async fn a_step_of_the_wall_clock_changes_no_decision() {
    let wall = ManualClock::new(SystemClock.now_micros());
    let clock = ManualClock::new(0); // the layer's: no deny cache in memory
    let store = MemoryStore::builder()
        .clock(MonotonicClock::new(&wall))
        .build();
    let app = app(store, &clock);
    for _ in 0..5 {
        assert_eq!(
            app.clone().oneshot(request()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let hour = 3_600_000_000;
    for step in [wall.now_micros() - hour, wall.now_micros() + 2 * hour] {
        wall.set(step);
        let refused = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait = RateLimitFields::read(refused.headers())
            .unwrap()
            .retry_after()
            .unwrap();
        assert!(wait <= Duration::from_secs(12), "{wait:?}");
    }
}
