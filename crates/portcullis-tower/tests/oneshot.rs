//! Service tests with `tower::ServiceExt::oneshot`: every mode, extractor,
//! header format and failure policy, against the memory store and the test
//! kit's `FaultStore` (answering through futures as Redis does, counting its
//! calls, failing or hanging on command).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use portcullis::testing::{Fault, FaultStore};
use portcullis_core::{Algorithm, Clock, LeakyMode, MemoryStore, Policy, Store};
use portcullis_tower::{
    ApiKey, BearerToken, ClientIp, FailurePolicy, Global, Header, HeaderMode, KeyExtractor,
    MatchedRoute, Method, MissingKey, PeerIp, RateLimitInfo, RateLimitLayer, RequestHead, User,
};
use tower::{Layer, Service, ServiceExt};

/// Wall-clock time that follows Tokio's (paused) clock, so a memory store
/// and the layer's waits agree in `start_paused` tests.
#[derive(Debug)]
struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        1_700_000_000_000_000 + u64::try_from(self.start.elapsed().as_micros()).unwrap()
    }
}

fn paused_store() -> MemoryStore {
    MemoryStore::with_clock(TokioClock::new())
}

/// A store that answers only through futures, as Redis does (so the layer
/// times its checks and holds denials), counting its calls and failing or
/// hanging on command: the test kit's `FaultStore`.
fn remote(inner: MemoryStore) -> FaultStore<MemoryStore> {
    FaultStore::remote(inner)
}

fn policy(limit: u64, name: &str) -> Policy {
    Policy::per_minute(limit).name(name).build().unwrap()
}

fn peer(ip: &str) -> ConnectInfo<SocketAddr> {
    ConnectInfo(SocketAddr::new(ip.parse().unwrap(), 40_000))
}

/// An Axum app whose handler reports the rate-limit info it sees.
fn app<St: Store, K: KeyExtractor>(layer: RateLimitLayer<St, K>) -> Router {
    async fn handler(info: Option<Extension<RateLimitInfo>>) -> String {
        match info {
            Some(Extension(info)) => format!(
                "key={} tier={} denied={}",
                info.key(),
                info.tier(),
                info.is_denied()
            ),
            None => "no info".to_owned(),
        }
    }
    Router::new()
        .route("/", get(handler))
        .route("/items/{id}", get(handler).post(handler))
        .layer(layer)
}

fn get_from(ip: &str) -> Request<Body> {
    Request::get("/")
        .extension(peer(ip))
        .body(Body::empty())
        .unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, http::HeaderMap, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> &'a str {
    headers.get(name).map_or("", |v| v.to_str().unwrap())
}

/// The integer parameter `name` of a structured-field item.
fn int_param(item: &sfv::Item, name: &str) -> Option<i64> {
    item.params
        .get(name)
        .and_then(|v| v.as_integer())
        .map(i64::from)
}

fn sf_list(value: &str) -> sfv::List {
    sfv::Parser::new(value)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured list: {e}"))
}

#[tokio::test]
async fn enforce_admits_the_limit_then_answers_429_with_headers() {
    let app = app(RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(3, "api"))
        .info_in_extensions(true)
        .build()
        .unwrap());
    for remaining in (0..3).rev() {
        let (status, headers, body) = send(&app, get_from("192.0.2.1")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "key=192.0.2.1 tier=default denied=false");
        assert_eq!(header(&headers, "ratelimit-policy"), "\"api\";q=3;w=60");
        let ratelimit = header(&headers, "ratelimit");
        assert!(
            ratelimit.starts_with(&format!("\"api\";r={remaining};t=")),
            "{ratelimit}"
        );
        assert!(headers.get("retry-after").is_none());
        sf_list(ratelimit);
    }
    let (status, headers, body) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&headers, "retry-after"),
        "20",
        "60 s / 3, rounded up"
    );
    assert_eq!(
        header(&headers, "content-type"),
        "text/plain; charset=utf-8"
    );
    assert!(
        body.contains("rate limit \"api\" exceeded; retry in 20 seconds"),
        "{body}"
    );
    let list = sf_list(header(&headers, "ratelimit"));
    let sfv::ListEntry::Item(item) = &list[0] else {
        panic!("not an item")
    };
    assert_eq!(item.bare_item.as_string().unwrap().as_str(), "api");
    assert_eq!(int_param(item, "r"), Some(0));
    assert_eq!(int_param(item, "t"), Some(20));
    let policy = sf_list(header(&headers, "ratelimit-policy"));
    let sfv::ListEntry::Item(item) = &policy[0] else {
        panic!("not an item")
    };
    assert_eq!(int_param(item, "q"), Some(3));
    assert_eq!(int_param(item, "w"), Some(60));
    // Another client is not affected.
    let (status, _, _) = send(&app, get_from("192.0.2.2")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn info_is_in_the_extensions_only_when_asked() {
    let app = app(RateLimitLayer::new(MemoryStore::new(), policy(3, "api")));
    let (status, headers, body) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "no info"));
    assert!(headers.contains_key("ratelimit"));
}

#[tokio::test]
async fn retry_after_rounds_up_to_whole_seconds() {
    // 2 per 3 s: after two, the next permit is 1.5 s away -> "2".
    let p = Policy::per(2, Duration::from_secs(3))
        .name("odd")
        .build()
        .unwrap();
    let app = app(RateLimitLayer::new(MemoryStore::new(), p));
    send(&app, get_from("192.0.2.1")).await;
    send(&app, get_from("192.0.2.1")).await;
    let (status, headers, _) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "retry-after"), "2");
}

#[tokio::test]
async fn several_policies_are_checked_atomically() {
    let store = MemoryStore::new();
    let daily = Policy::per_day(5).name("daily").build().unwrap();
    let layer = RateLimitLayer::builder(store.clone())
        .policy(policy(2, "short"))
        .policy(daily.clone())
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let (_, headers, _) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        "\"short\";q=2;w=60, \"daily\";q=5;w=86400"
    );
    let rate = header(&headers, "ratelimit");
    assert!(
        rate.starts_with("\"short\";r=1;t=") && rate.contains(", \"daily\";r=4;t="),
        "{rate}"
    );
    assert_eq!(sf_list(rate).len(), 2);
    send(&app, get_from("192.0.2.1")).await;
    // "short" denies: "daily" must not be charged.
    for _ in 0..3 {
        let (status, headers, _) = send(&app, get_from("192.0.2.1")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            header(&headers, "ratelimit").starts_with("\"short\";r=0;t=30"),
            "{}",
            header(&headers, "ratelimit")
        );
    }
    let peek = store
        .peek("192.0.2.1", std::slice::from_ref(&daily))
        .await
        .unwrap();
    assert_eq!(
        peek.decisions()[0].remaining(),
        3,
        "two admitted, the denied ones charged nothing"
    );
}

#[tokio::test]
async fn cost_function() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(5, "budget"))
        .cost(|request| {
            request
                .headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let with_cost = |cost: &str| {
        Request::get("/")
            .header("x-cost", cost)
            .extension(peer("192.0.2.1"))
            .body(Body::empty())
            .unwrap()
    };
    let (status, headers, _) = send(&app, with_cost("3")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(header(&headers, "ratelimit").contains("r=2;"));
    // Free requests are not checked and carry no headers.
    let (status, headers, body) = send(&app, with_cost("0")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "no info"));
    assert!(headers.get("ratelimit").is_none());
    // More than the capacity can never be admitted: 429 without Retry-After.
    let (status, headers, body) = send(&app, with_cost("6")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.get("retry-after").is_none());
    // It says what the client can do, not the store's detail.
    assert!(
        body.contains("costs more than the rate limit ever allows"),
        "{body}"
    );
    assert!(
        !body.contains("capacity") && !body.contains("Policy"),
        "{body}"
    );
    let (status, _, _) = send(&app, with_cost("3")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, _, _) = send(&app, with_cost("2")).await;
    assert_eq!(status, StatusCode::OK);
}

#[derive(Clone, Copy)]
enum Plan {
    Pro,
}

#[tokio::test]
async fn tiers_are_chosen_per_request() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "free"))
        .tier("pro", [policy(3, "pro")])
        .tier_by(|request| request.extensions().get::<Plan>().map(|Plan::Pro| "pro"))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let pro = || {
        Request::get("/")
            .extension(peer("192.0.2.1"))
            .extension(Plan::Pro)
            .body(Body::empty())
            .unwrap()
    };
    for _ in 0..3 {
        let (status, headers, body) = send(&app, pro()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "key=192.0.2.1 tier=pro denied=false");
        assert_eq!(header(&headers, "ratelimit-policy"), "\"pro\";q=3;w=60");
    }
    assert_eq!(send(&app, pro()).await.0, StatusCode::TOO_MANY_REQUESTS);
    // The same client without the plan has its own, smaller limit.
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    assert_eq!(
        send(&app, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn dry_run_never_rejects_and_tells_the_handler() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .dry_run()
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let (status, headers, body) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "key=192.0.2.1 tier=default denied=false")
    );
    assert!(
        headers.get("ratelimit").is_none(),
        "dry run adds no headers"
    );
    for _ in 0..3 {
        let (status, headers, body) = send(&app, get_from("192.0.2.1")).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "key=192.0.2.1 tier=default denied=true")
        );
        assert!(headers.get("retry-after").is_none());
    }
}

#[tokio::test(start_paused = true)]
async fn shape_waits_for_the_retry_time_within_max_wait() {
    let p = Policy::per_second(1).name("slow").build().unwrap();
    let store = remote(paused_store());
    let calls = store.clone();
    let layer = RateLimitLayer::builder(store)
        .policy(p)
        .shape(Duration::from_secs(2))
        .deny_cache(0)
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let start = tokio::time::Instant::now();
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    // Denied now, admitted after waiting 1 s (paused clock: no real wait).
    let (status, _, body) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "key=192.0.2.1 tier=default denied=false")
    );
    assert!(start.elapsed() >= Duration::from_secs(1));
    assert_eq!(calls.calls(), 3, "first, denied, recheck");
}

#[tokio::test(start_paused = true)]
async fn shape_rejects_beyond_max_wait() {
    let p = Policy::per_minute(1).name("slow").build().unwrap();
    let layer = RateLimitLayer::builder(paused_store())
        .policy(p)
        .shape(Duration::from_secs(5))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let start = tokio::time::Instant::now();
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    let (status, headers, _) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "retry-after"), "60");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "rejected at once, not after waiting"
    );
}

#[tokio::test(start_paused = true)]
async fn leaky_queue_delay_is_waited_out() {
    let p = Policy::per_second(2)
        .burst(4)
        .algorithm(Algorithm::LeakyBucket(LeakyMode::Queue))
        .name("queue")
        .build()
        .unwrap();
    let app = app(RateLimitLayer::builder(paused_store())
        .policy(p)
        .build()
        .unwrap());
    let start = tokio::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    }
    // Three requests at 2/s: the third waits its turn, 1 s after the first.
    assert!(
        start.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn fail_open_forwards_without_headers() {
    let store = remote(MemoryStore::new());
    store.set(Fault::Unavailable);
    let app = app(RateLimitLayer::builder(store)
        .policy(policy(1, "api"))
        .build()
        .unwrap());
    for _ in 0..3 {
        let (status, headers, body) = send(&app, get_from("192.0.2.1")).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "no info"));
        assert!(headers.get("ratelimit").is_none());
    }
}

#[tokio::test]
async fn fail_closed_answers_503_and_grpc_14() {
    let store = remote(MemoryStore::new());
    store.set(Fault::Unavailable);
    let layer = RateLimitLayer::builder(store)
        .policy(policy(1, "api"))
        .on_store_failure(FailurePolicy::FailClosed)
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let (status, _, body) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("unavailable"));
    let grpc = Request::get("/")
        .header("content-type", "application/grpc")
        .extension(peer("192.0.2.1"))
        .body(Body::empty())
        .unwrap();
    let (status, headers, _) = send(&app, grpc).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "grpc-status"), "14");
}

#[tokio::test]
async fn fallback_store_limits_while_the_store_is_down() {
    let store = remote(MemoryStore::new());
    let failing = store.clone();
    let layer = RateLimitLayer::builder(store)
        .policy(policy(2, "api"))
        .on_store_failure(FailurePolicy::fallback(MemoryStore::new()))
        .circuit_breaker(0, Duration::ZERO)
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    failing.set(Fault::Unavailable);
    // The fallback starts from scratch: two admitted, then limited.
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    let (status, headers, _) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(header(&headers, "ratelimit").contains("r=0"));
    assert_eq!(
        send(&app, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The store is back: it remembers one request, so one more is admitted.
    failing.set(Fault::Pass);
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    assert_eq!(
        send(&app, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_fallback_store_times_out_and_lets_the_request_through() {
    let store = remote(MemoryStore::new());
    store.set(Fault::Unavailable);
    let hanging = remote(MemoryStore::new());
    hanging.set(Fault::Stall);
    let layer = RateLimitLayer::builder(store)
        .policy(policy(1, "api"))
        .check_timeout(Duration::from_millis(50))
        .on_store_failure(FailurePolicy::fallback(hanging))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    for _ in 0..2 {
        // A guard against the hang itself (the paused clock reaches it at
        // once if the layer sets no timer of its own).
        let answer =
            tokio::time::timeout(Duration::from_secs(3600), send(&app, get_from("192.0.2.1")))
                .await;
        let (status, headers, body) = answer.expect("the request hung on the fallback store");
        // Let through undecided, as when the fallback fails.
        assert_eq!((status, body.as_str()), (StatusCode::OK, "no info"));
        assert!(headers.get("ratelimit").is_none());
    }
}

#[tokio::test(start_paused = true)]
async fn hanging_store_times_out_into_the_failure_policy() {
    let store = remote(MemoryStore::new());
    store.set(Fault::Stall);
    let layer = RateLimitLayer::builder(store)
        .policy(policy(1, "api"))
        .check_timeout(Duration::from_millis(50))
        .on_store_failure(FailurePolicy::FailClosed)
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let start = tokio::time::Instant::now();
    let (status, _, _) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(start.elapsed() >= Duration::from_millis(50));
}

#[tokio::test(start_paused = true)]
async fn circuit_breaker_stops_asking_a_failing_store() {
    let store = remote(MemoryStore::new());
    store.set(Fault::Unavailable);
    let failing = store.clone();
    let calls = store.clone();
    let layer = RateLimitLayer::builder(store)
        .policy(policy(100, "api"))
        .circuit_breaker(3, Duration::from_secs(1))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    for _ in 0..10 {
        assert_eq!(
            send(&app, get_from("192.0.2.1")).await.0,
            StatusCode::OK,
            "fail-open"
        );
    }
    assert_eq!(calls.calls(), 3, "open after three failures");
    tokio::time::advance(Duration::from_secs(1)).await;
    send(&app, get_from("192.0.2.1")).await;
    assert_eq!(calls.calls(), 4, "one probe after the pause");
    send(&app, get_from("192.0.2.1")).await;
    assert_eq!(calls.calls(), 4, "the failed probe reopened it");
    failing.set(Fault::Pass);
    tokio::time::advance(Duration::from_secs(1)).await;
    let (_, headers, _) = send(&app, get_from("192.0.2.1")).await;
    assert!(headers.get("ratelimit").is_some(), "the probe succeeded");
    send(&app, get_from("192.0.2.1")).await;
    assert_eq!(calls.calls(), 6, "closed again");
}

#[tokio::test(start_paused = true)]
async fn deny_cache_answers_locally_until_the_retry_time() {
    let store = remote(paused_store());
    let calls = store.clone();
    let p = Policy::per_second(1).name("api").build().unwrap();
    let layer = RateLimitLayer::builder(store)
        .policy(p)
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let req = |query: &str| {
        Request::get(format!("/?{query}"))
            .extension(peer("192.0.2.1"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, req("one")).await.0, StatusCode::OK);
    assert_eq!(calls.calls(), 1);
    let (status, headers, _) = send(&app, req("one")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "retry-after"), "1");
    assert_eq!(calls.calls(), 2);
    for _ in 0..5 {
        let (status, headers, _) = send(&app, req("one")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(headers.get("ratelimit").is_some());
    }
    assert_eq!(calls.calls(), 2, "denied locally, no store call");
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert_eq!(
        send(&app, req("one")).await.0,
        StatusCode::OK,
        "admitted again at the retry time"
    );
    assert_eq!(calls.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn deny_cache_lets_smaller_costs_through_to_the_store() {
    let store = remote(paused_store());
    let calls = store.clone();
    let p = Policy::per_second(3).name("api").build().unwrap();
    let layer = RateLimitLayer::builder(store)
        .policy(p)
        .cost(|request| {
            request
                .uri()
                .query()
                .and_then(|q| q.parse().ok())
                .unwrap_or(1)
        })
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let req = |cost: u64| {
        Request::get(format!("/?{cost}"))
            .extension(peer("192.0.2.1"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, req(2)).await.0, StatusCode::OK);
    assert_eq!(send(&app, req(3)).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&app, req(3)).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        calls.calls(),
        2,
        "the second cost-3 request was denied locally"
    );
    assert_eq!(
        send(&app, req(1)).await.0,
        StatusCode::OK,
        "a smaller cost still fits"
    );
    assert_eq!(calls.calls(), 3);
}

#[tokio::test]
async fn reset_clears_the_store_and_the_deny_cache() {
    let store = remote(MemoryStore::new());
    let calls = store.clone();
    let layer = RateLimitLayer::builder(store)
        .policy(policy(1, "api"))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer.clone());
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    assert_eq!(
        send(&app, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.calls(), 2);
    layer.reset("192.0.2.1").await.unwrap();
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_store_that_answers_at_once_is_asked_every_time_no_denial_is_cached() {
    // The memory store answers through `Store::check_now`: no round trip
    // for the deny cache to save, so its denials are not held, and a reset
    // made on the store itself (not through the layer) counts at once.
    let store = MemoryStore::new();
    let p = policy(1, "api");
    let layer = RateLimitLayer::builder(store.clone())
        .policy(p.clone())
        .build()
        .unwrap();
    let app = app(layer);
    assert_eq!(send(&app, get_from("192.0.2.1")).await.0, StatusCode::OK);
    let (status, headers, _) = send(&app, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "retry-after"), "60");
    store.reset("192.0.2.1", &[p]).await.unwrap();
    assert_eq!(
        send(&app, get_from("192.0.2.1")).await.0,
        StatusCode::OK,
        "the store's reset is seen by the next request"
    );
    assert_eq!(
        send(&app, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn keep_body_answers_in_the_inner_body_type() {
    // Directly around a service answering Axum's `Body`: the layer's
    // responses are that type too, not a wrapper (a compile-time check).
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .problem_json()
        .build()
        .unwrap()
        .keep_body();
    let service = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("hello")))
    }));
    let admitted: Response<Body> = service
        .clone()
        .oneshot(get_from("192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(header(admitted.headers(), "ratelimit"), "\"api\";r=0;t=60");
    let body = admitted.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "hello", "the handler's body, passed on as it is");

    let limited: Response<Body> = service.oneshot(get_from("192.0.2.1")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(limited.headers(), "retry-after"), "60");
    assert_eq!(
        header(limited.headers(), "content-type"),
        "application/problem+json"
    );
    let body = limited.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem["status"], 429,
        "the layer's own body, converted: {problem}"
    );

    // And in a Router, as the bench and the README use it.
    let router = app_keep_body();
    assert_eq!(send(&router, get_from("192.0.2.9")).await.0, StatusCode::OK);
    let (status, headers, _) = send(&router, get_from("192.0.2.9")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "retry-after"), "60");
}

fn app_keep_body() -> Router {
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(1, "api"));
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.keep_body())
}

#[tokio::test]
async fn missing_key_reject_skip_and_fallback() {
    let no_peer = || Request::get("/").body(Body::empty()).unwrap();
    // Default: 400 naming what the extractor (the peer IP) reads; how to
    // serve Axum with connect info is the operator's, for the log.
    let app1 = app(RateLimitLayer::new(MemoryStore::new(), policy(1, "api")));
    let (status, _, body) = send(&app1, no_peer()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("the client's network address"), "{body}");
    assert!(
        !body.contains("into_make_service_with_connect_info"),
        "{body}"
    );
    // Custom rejection.
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .key(BearerToken::new())
        .on_missing_key(MissingKey::reject(
            StatusCode::UNAUTHORIZED,
            "send a bearer token\n",
        ))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let (status, _, body) = send(&app(layer), no_peer()).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::UNAUTHORIZED, "send a bearer token\n")
    );
    // Skip.
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .on_missing_key(MissingKey::Skip)
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app2 = app(layer);
    for _ in 0..3 {
        let (status, headers, body) = send(&app2, no_peer()).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "no info"));
        assert!(headers.get("ratelimit").is_none());
    }
    // Fallback: keyless requests share one limit.
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .on_missing_key(MissingKey::fallback("anonymous"))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app3 = app(layer);
    let (status, _, body) = send(&app3, no_peer()).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "key=anonymous tier=default denied=false")
    );
    assert_eq!(
        send(&app3, no_peer()).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app3, get_from("192.0.2.1")).await.0, StatusCode::OK);
}

/// The key `key` gives `request` (with an empty body), or `"<none>"`.
async fn key_of<K: KeyExtractor>(key: K, request: http::request::Builder) -> String {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(100, "api"))
        .key(key)
        .on_missing_key(MissingKey::reject(StatusCode::IM_A_TEAPOT, "no key"))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let request = request.body(Body::empty()).unwrap();
    let (status, _, body) = send(&app(layer), request).await;
    if status == StatusCode::IM_A_TEAPOT {
        return "<none>".to_owned();
    }
    body.strip_prefix("key=")
        .and_then(|b| b.split(' ').next())
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn extractors_through_the_service() {
    let base = || Request::get("/items/7");
    // Peer IP from Axum's ConnectInfo, from a plain SocketAddr, IPv6 /56.
    assert_eq!(
        key_of(PeerIp::new(), base().extension(peer("192.0.2.9"))).await,
        "192.0.2.9"
    );
    let v6: SocketAddr = "[2001:db8:1:2345::9]:1".parse().unwrap();
    assert_eq!(
        key_of(PeerIp::new(), base().extension(v6)).await,
        "2001:db8:1:2300::/56"
    );
    let mapped: SocketAddr = "[::ffff:192.0.2.5]:1".parse().unwrap();
    assert_eq!(
        key_of(PeerIp::new(), base().extension(mapped)).await,
        "192.0.2.5"
    );
    // Client IP: trusted proxy vs spoofing client.
    let trusted = || ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]);
    let via_proxy = base()
        .header("x-forwarded-for", "203.0.113.50")
        .extension(peer("10.0.0.1"));
    assert_eq!(key_of(trusted(), via_proxy).await, "203.0.113.50");
    let spoofed = base()
        .header("x-forwarded-for", "203.0.113.50")
        .extension(peer("198.51.100.7"));
    assert_eq!(key_of(trusted(), spoofed).await, "198.51.100.7");
    let garbage = base()
        .header(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"\xff\xfe, ,,[[").unwrap(),
        )
        .extension(peer("10.0.0.1"));
    assert_eq!(key_of(trusted(), garbage).await, "10.0.0.1");
    // Header, token and API key.
    let tenant = Header::new(http::HeaderName::from_static("x-tenant"));
    assert_eq!(
        key_of(tenant.clone(), base().header("x-tenant", "acme")).await,
        "acme"
    );
    assert_eq!(key_of(tenant, base()).await, "<none>");
    let token = key_of(
        BearerToken::new(),
        base().header("authorization", "Bearer t0k3n"),
    )
    .await;
    assert_eq!(token, portcullis_core::subject::hash_subject(b"t0k3n"));
    let api_key = key_of(ApiKey::new(), base().header("x-api-key", "k")).await;
    assert_eq!(api_key, portcullis_core::subject::hash_subject(b"k"));
    // A user an earlier layer authenticated.
    assert_eq!(
        key_of(User::<String>::new(), base().extension("alice".to_owned())).await,
        "alice"
    );
    // Route, method, global, tuples and `or`.
    assert_eq!(key_of(MatchedRoute, base()).await, "/items/{id}");
    assert_eq!(key_of(Global, base()).await, "global");
    let tuple = (Method, PeerIp::new());
    assert_eq!(
        key_of(tuple, base().extension(peer("192.0.2.9"))).await,
        "GET,192.0.2.9"
    );
    let token_or_ip = BearerToken::new().or(PeerIp::new());
    assert_eq!(
        key_of(token_or_ip, base().extension(peer("192.0.2.9"))).await,
        "192.0.2.9"
    );
    let closure = |request: &RequestHead<'_>| {
        request
            .uri()
            .path()
            .strip_prefix("/items/")
            .map(str::to_owned)
    };
    assert_eq!(key_of(closure, base()).await, "7");
}

#[tokio::test]
async fn matched_route_limits_each_route_separately() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .key((MatchedRoute, Method))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app = app(layer);
    let req = |method: &str, path: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, req("GET", "/items/1")).await.0, StatusCode::OK);
    assert_eq!(
        send(&app, req("GET", "/items/2")).await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "same route"
    );
    assert_eq!(
        send(&app, req("POST", "/items/2")).await.0,
        StatusCode::OK,
        "other method"
    );
    assert_eq!(
        send(&app, req("GET", "/")).await.0,
        StatusCode::OK,
        "other route"
    );
}

#[tokio::test]
async fn route_layer_limits_only_its_routes() {
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(1, "login"));
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route_layer(layer)
        .route("/", get(|| async { "home" }));
    let req = |method: &str, path: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .extension(peer("192.0.2.1"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, req("POST", "/login")).await.0, StatusCode::OK);
    assert_eq!(
        send(&app, req("POST", "/login")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(send(&app, req("GET", "/")).await.0, StatusCode::OK);
    }
    // route_layer does not apply to unmatched paths (404, not 429).
    assert_eq!(
        send(&app, req("GET", "/nope")).await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn header_modes_and_legacy_headers() {
    for (mode, on_allowed, on_limited) in [
        (HeaderMode::All, true, true),
        (HeaderMode::LimitedOnly, false, true),
        (HeaderMode::None, false, false),
    ] {
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .policy(policy(1, "api"))
            .headers(mode)
            .legacy_headers(true)
            .build()
            .unwrap();
        let app = app(layer);
        let (_, allowed, _) = send(&app, get_from("192.0.2.1")).await;
        let (status, limited, _) = send(&app, get_from("192.0.2.1")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        for name in [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            assert_eq!(
                allowed.contains_key(name),
                on_allowed,
                "{mode:?} {name} on allowed"
            );
            assert_eq!(
                limited.contains_key(name),
                on_limited,
                "{mode:?} {name} on limited"
            );
        }
        assert_eq!(
            header(&limited, "retry-after"),
            "60",
            "Retry-After is always sent"
        );
        if on_limited {
            assert_eq!(header(&limited, "x-ratelimit-limit"), "1");
            assert_eq!(header(&limited, "x-ratelimit-remaining"), "0");
            assert_eq!(header(&limited, "x-ratelimit-reset"), "60");
        }
    }
}

#[tokio::test]
async fn problem_json_and_custom_responses() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .problem_json()
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app1 = app(layer);
    send(&app1, get_from("192.0.2.1")).await;
    let (status, headers, body) = send(&app1, get_from("192.0.2.1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "content-type"), "application/problem+json");
    assert!(
        body.starts_with('{')
            && body.contains("\"status\":429")
            && body.contains("\"retry_after\":60"),
        "{body}"
    );

    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "api"))
        .on_limited(|info| {
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .header("retry-after", "999")
                .body(format!("busy {}", info.binding_policy()))
                .unwrap()
        })
        .info_in_extensions(true)
        .build()
        .unwrap();
    let app2 = app(layer);
    send(&app2, get_from("192.0.2.1")).await;
    let (status, headers, body) = send(&app2, get_from("192.0.2.1")).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "busy api")
    );
    assert_eq!(
        header(&headers, "retry-after"),
        "999",
        "the closure's header wins"
    );
    assert!(headers.contains_key("ratelimit"), "fields are added");
}

#[tokio::test]
async fn grpc_requests_get_resource_exhausted() {
    let app = app(RateLimitLayer::new(MemoryStore::new(), policy(1, "rpc")));
    let grpc = || {
        Request::post("/")
            .header("content-type", "application/grpc+proto")
            .extension(peer("192.0.2.1"))
            .body(Body::empty())
            .unwrap()
    };
    let _ = send(&app, grpc()).await;
    let (status, headers, body) = send(&app, grpc()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "content-type"), "application/grpc+proto");
    assert_eq!(header(&headers, "grpc-status"), "8");
    // Percent-encoded (Tonic, feature `tonic`, encodes spaces too).
    let message = percent_encoding::percent_decode_str(header(&headers, "grpc-message"))
        .decode_utf8()
        .unwrap()
        .into_owned();
    assert!(
        message.contains("rate limit \"rpc\" exceeded; retry in 60 seconds"),
        "{message}"
    );
    assert_eq!(header(&headers, "retry-after"), "60");
    let pushback: u64 = header(&headers, "grpc-retry-pushback-ms").parse().unwrap();
    assert!((59_000..=60_000).contains(&pushback), "{pushback}");
    assert!(body.is_empty());
}

#[tokio::test]
async fn clones_share_one_limit() {
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(2, "api"));
    let a = app(layer.clone());
    let b = app(layer);
    assert_eq!(send(&a, get_from("192.0.2.1")).await.0, StatusCode::OK);
    assert_eq!(send(&b, get_from("192.0.2.1")).await.0, StatusCode::OK);
    assert_eq!(
        send(&a, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&b, get_from("192.0.2.1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn poll_ready_forwards_and_errors_pass_through() {
    use tower::Layer;
    // A service that fails with its own error: the error is the inner one.
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(1, "api"));
    let mut service = layer.layer(tower::service_fn(|_req: Request<Body>| async {
        Err::<Response<Body>, &'static str>("inner failed")
    }));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let err = service.call(get_from("192.0.2.1")).await.unwrap_err();
    assert_eq!(err, "inner failed");
    // The limited response is a response, not an error.
    let response = service
        .ready()
        .await
        .unwrap()
        .call(get_from("192.0.2.1"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn build_errors_name_the_problem() {
    let err = RateLimitLayer::builder(MemoryStore::new())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains(".policy("), "{err}");
    let err = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "same"))
        .policy(policy(2, "same"))
        .build()
        .unwrap_err();
    // The tier here; which policies, in the cause.
    assert!(err.to_string().contains("\"default\""), "{err}");
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.contains("\"same\""), "{cause}");
    let err = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "a"))
        .tier("pro", [])
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("\"pro\""), "{err}");
    let err = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "a"))
        .tier("pro", [policy(1, "b")])
        .tier("pro", [policy(1, "c")])
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    let err = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "a"))
        .check_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("timeout"), "{err}");
}

/// The `Display` texts of `error` and of each `source()` below it.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut texts = vec![error.to_string()];
    let mut cause = error.source();
    while let Some(error) = cause {
        texts.push(error.to_string());
        cause = error.source();
    }
    texts
}

#[test]
fn config_errors_print_each_cause_once_through_a_source_walker() {
    let duplicate = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy(1, "same"))
        .policy(policy(2, "same"))
        .build()
        .unwrap_err();
    let not_chargeable = RateLimitLayer::builder(MemoryStore::new())
        .policy(
            Policy::per_minute(5)
                .algorithm(Algorithm::FixedWindow)
                .name("window")
                .build()
                .unwrap(),
        )
        .charge_from_response(|_| 1)
        .build()
        .unwrap_err();
    for error in [duplicate, not_chargeable] {
        let texts = error_chain(&error);
        assert_eq!(texts.len(), 2, "{texts:?}");
        let printed = texts.join(": ");
        assert_eq!(printed.matches(texts[1].as_str()).count(), 1, "{printed}");
    }
}

#[tokio::test]
async fn a_hyper_style_service_fn_works_with_a_socket_addr_extension() {
    use tower::Layer;
    let layer = RateLimitLayer::new(MemoryStore::new(), policy(1, "api"));
    let service = layer.layer(tower::service_fn(
        |_req: Request<http_body_util::Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                Bytes::from_static(b"hi"),
            )))
        },
    ));
    let addr: SocketAddr = "192.0.2.3:5".parse().unwrap();
    let req = || {
        Request::get("/")
            .extension(addr)
            .body(http_body_util::Empty::new())
            .unwrap()
    };
    let ok = service.clone().oneshot(req()).await.unwrap();
    assert_eq!(ok.into_body().collect().await.unwrap().to_bytes(), "hi");
    let limited = service.oneshot(req()).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
}
