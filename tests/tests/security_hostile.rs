//! The hostile client: for each value a request carries to the rate-limit
//! layer (an idempotency key, a priority class, a missing key), a test
//! that the client cannot use it to get past its limit, lock itself out
//! beyond the policy, grow state, evict another tenant's records, or fill
//! a log; in memory and on a real Redis, with two layer instances sharing
//! one Redis where state is shared (issue "No client talks its way past a
//! limit", one test per row).

mod redis_common;

mod log_capture;

use std::convert::Infallible;
use std::fmt;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use log_capture::Captured;
use portcullis_core::{
    CheckOptions, ConcurrencyPolicy, ManualClock, MemoryStore, Policy, Store, WhenFull,
};
use portcullis_redis::RedisStore;
use portcullis_tests::unique_prefix;
use portcullis_tower::{
    ApiKey, ConcurrencyLimitLayer, FailurePolicy, Global, Header, Mode, RateLimitLayer,
    RequestHead, User,
};
use redis_common::{client, manual_clock, standalone};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};

type Svc = BoxCloneService<Request<()>, Response<Bytes>, Infallible>;

/// The service behind the layers: answers `ok` and counts the requests
/// that reach it.
#[derive(Clone)]
struct Handler(Arc<AtomicU64>);

impl tower::Service<Request<()>> for Handler {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = futures::future::Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<()>) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        futures::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

/// `layer` around a [`Handler`] counting into `reached`, its response
/// bodies read.
fn counted<L, B>(layer: &L, reached: &Arc<AtomicU64>) -> Svc
where
    L: Layer<Handler>,
    L::Service: tower::Service<Request<()>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<Request<()>>>::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: fmt::Debug,
{
    let service = layer.layer(Handler(Arc::clone(reached)));
    BoxCloneService::new(service.and_then(|response: Response<B>| async move {
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.expect("a body").to_bytes();
        Ok(Response::from_parts(parts, bytes))
    }))
}

fn header(name: &'static str) -> Header {
    Header::new(HeaderName::from_static(name))
}

fn request(method: &str, path: &str, account: &str, key: Option<&str>) -> Request<()> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("x-account", account);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(()).unwrap()
}

async fn send(service: &Svc, request: Request<()>) -> (StatusCode, Response<Bytes>) {
    let response = service.clone().oneshot(request).await.unwrap();
    (response.status(), response)
}

/// Two Redis stores on one server and prefix: two app instances.
async fn two_instances(what: &str, clock: &ManualClock) -> (RedisStore, RedisStore) {
    let prefix = unique_prefix(what);
    (
        standalone(&prefix, client(clock)).await,
        standalone(&prefix, client(clock)).await,
    )
}

/// A layer keyed by `x-account` with an idempotency key, on `store`.
fn idempotent_layer<St: Store>(store: St, policy: Policy) -> RateLimitLayer<St, Header> {
    RateLimitLayer::builder(store)
        .policy(policy)
        .key(header("x-account"))
        .idempotency_key(header("idempotency-key"), Duration::from_secs(600))
        .build()
        .unwrap()
}

/// One deployment of the idempotent layer: its store's name, its
/// services (app instances sharing that store), and how many requests
/// reached their handler.
type Deployment = (&'static str, Vec<Svc>, Arc<AtomicU64>);

/// The idempotent layer under `policy` in memory (one instance) and on
/// Redis (two instances sharing one server), every store on `clock`.
async fn memory_and_redis(
    what: &str,
    clock: &ManualClock,
    policy: impl Fn() -> Policy,
) -> [Deployment; 2] {
    let in_memory = Arc::new(AtomicU64::new(0));
    let memory = MemoryStore::with_clock(clock.clone());
    let memory = vec![counted(&idempotent_layer(memory, policy()), &in_memory)];
    let on_redis = Arc::new(AtomicU64::new(0));
    let (a, b) = two_instances(what, clock).await;
    let redis = vec![
        counted(&idempotent_layer(a, policy()), &on_redis),
        counted(&idempotent_layer(b, policy()), &on_redis),
    ];
    [("memory", memory, in_memory), ("redis", redis, on_redis)]
}

// Row 1: one key for any request.

/// Sends 100 requests with one idempotency key over 100 paths through
/// `services` in turn; how many reached the handler.
async fn one_key_many_paths(services: &[Svc], reached: &AtomicU64) -> u64 {
    for i in 0..100 {
        let service = &services[i % services.len()];
        let path = format!("/pay/{i}");
        send(service, request("POST", &path, "mallory", Some("same"))).await;
    }
    reached.load(Ordering::SeqCst)
}

#[tokio::test]
async fn one_idempotency_key_reused_over_many_requests_is_charged_for_each() {
    let policy = || Policy::per_minute(1).name("payments").build().unwrap();
    let clock = manual_clock();
    for (what, services, reached) in memory_and_redis("hostile-one-key", &clock, policy).await {
        assert_eq!(
            one_key_many_paths(&services, &reached).await,
            1,
            "{what}: one request of 100 under per_minute(1)"
        );
    }
}

#[tokio::test]
async fn a_long_url_with_an_idempotency_key_is_checked_and_replayed() {
    // The fingerprint is a digest: a 20 kB path neither fails the check
    // nor costs the store more.
    let reached = Arc::new(AtomicU64::new(0));
    let policy = Policy::per_minute(1).name("payments").build().unwrap();
    let service = counted(&idempotent_layer(MemoryStore::new(), policy), &reached);
    let path = format!("/pay/{}", "a".repeat(20_000));
    for _ in 0..3 {
        let (status, _) = send(&service, request("POST", &path, "alice", Some("k"))).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _) = send(&service, request("POST", "/pay/b", "alice", Some("k"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn the_same_request_beyond_its_free_replays_is_charged() {
    // per_minute(2), two free replays by default: at most (1 + 2) × 2 = 6
    // requests reach the handler, whatever the client sends.
    let policy = || Policy::per_minute(2).name("payments").build().unwrap();
    let clock = manual_clock();
    for (what, services, reached) in memory_and_redis("hostile-replays", &clock, policy).await {
        let mut statuses = Vec::new();
        for i in 0..10 {
            let service = &services[i % services.len()];
            let (status, _) = send(service, request("POST", "/pay", "mallory", Some("k"))).await;
            statuses.push(status.as_u16());
        }
        assert_eq!(
            statuses,
            [200, 200, 200, 200, 200, 200, 429, 429, 429, 429],
            "{what}: charged, two free retries, charged, two free retries, then limited"
        );
        assert_eq!(reached.load(Ordering::SeqCst), 6, "{what}");
    }
}

// Row 2: locked out past the policy by its own retry.

#[tokio::test]
async fn a_denied_request_retried_after_its_retry_after_is_decided_afresh() {
    let policy = || Policy::per_minute(1).name("payments").build().unwrap();
    let clock = manual_clock();
    for (what, services, _) in memory_and_redis("hostile-denied", &clock, policy).await {
        let first = &services[0];
        let last = &services[services.len() - 1];
        let (ok, _) = send(first, request("POST", "/pay", "alice", Some("a"))).await;
        assert_eq!(ok, StatusCode::OK, "{what}");
        let (limited, response) = send(last, request("POST", "/pay", "alice", Some("b"))).await;
        assert_eq!(limited, StatusCode::TOO_MANY_REQUESTS, "{what}");
        let retry_after: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry_after > 0, "{what}");
        clock.advance(Duration::from_secs(retry_after));
        let (again, _) = send(first, request("POST", "/pay", "alice", Some("b"))).await;
        assert_eq!(
            again,
            StatusCode::OK,
            "{what}: the retry after Retry-After is decided afresh, not the denial replayed"
        );
        // The clock is shared by the stores: the next round starts later.
        clock.advance(Duration::from_secs(120));
    }
}

// Row 3: pick its own class, or the best by sending none.

/// A class an authentication layer grants, read by `User`.
#[derive(Clone)]
struct Granted(&'static str);

impl fmt::Display for Granted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

fn classed_policy() -> Policy {
    Policy::per_minute(10)
        .name("api")
        .class("critical", 0)
        .class("batch", 50)
        .build()
        .unwrap()
}

fn classed_layer<St: Store>(store: St) -> RateLimitLayer<St, Global> {
    RateLimitLayer::builder(store)
        .policy(classed_policy())
        .key(Global)
        .priority(User::<Granted>::new())
        .build()
        .unwrap()
}

fn classed_request(class: Option<&'static str>, claimed: Option<&str>) -> Request<()> {
    let mut builder = Request::builder().uri("/");
    if let Some(class) = class {
        builder = builder.extension(Granted(class));
    }
    if let Some(claimed) = claimed {
        // What a client sends: never read by the layer.
        builder = builder.header("x-priority", claimed);
    }
    builder.body(()).unwrap()
}

/// Floods with no class, then with an unknown class, then grants
/// `critical`; the admitted counts of each.
async fn class_flood(services: &[Svc]) -> [usize; 3] {
    let mut admitted = [0; 3];
    for i in 0..60 {
        let service = &services[i % services.len()];
        let (class, phase) = match i {
            0..20 => (None, 0),
            20..40 => (Some("urgent"), 1),
            _ => (Some("critical"), 2),
        };
        let (status, response) = send(service, classed_request(class, Some("critical"))).await;
        if status == StatusCode::OK {
            admitted[phase] += 1;
        } else {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            let body = String::from_utf8_lossy(response.body());
            assert!(
                response.headers().contains_key("retry-after") && !body.contains("class"),
                "a class denial says when to retry and echoes nothing: {body}"
            );
        }
    }
    admitted
}

#[tokio::test]
async fn no_class_and_an_unknown_class_get_the_most_reserved_class() {
    let reached = Arc::new(AtomicU64::new(0));
    let memory = counted(&classed_layer(MemoryStore::new()), &reached);
    // No class: the default, batch (5 of 10 reserved); an unknown class:
    // the same, nothing left; critical takes the reserve.
    assert_eq!(class_flood(&[memory]).await, [5, 0, 5]);
    let clock = manual_clock();
    let (a, b) = two_instances("hostile-classes", &clock).await;
    let services = [
        counted(&classed_layer(a), &reached),
        counted(&classed_layer(b), &reached),
    ];
    assert_eq!(class_flood(&services).await, [5, 0, 5]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fallback_store_keeps_the_default_class_while_redis_is_down() {
    // Redis unreachable: the fallback store decides, with the classes.
    let down = RedisStore::builder()
        .url(format!(
            "redis://127.0.0.1:{}",
            portcullis_tests::free_port()
        ))
        .timeout(Duration::from_millis(200))
        .lazy_connect(true)
        .build()
        .await
        .expect("building lazily never connects");
    let layer = RateLimitLayer::builder(down)
        .policy(classed_policy())
        .key(Global)
        .priority(User::<Granted>::new())
        .on_store_failure(FailurePolicy::fallback(MemoryStore::new()))
        .build()
        .unwrap();
    let reached = Arc::new(AtomicU64::new(0));
    let service = counted(&layer, &reached);
    let mut admitted = 0;
    for _ in 0..20 {
        let (status, _) = send(&service, classed_request(None, Some("critical"))).await;
        admitted += usize::from(status == StatusCode::OK);
    }
    assert_eq!(admitted, 5, "no class is batch in the fallback store too");
}

// Row 4: spend a class's reserve through shaping.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shaped_recheck_keeps_the_requests_class_and_key() {
    // 5 per second, batch keeps 3: however the waits line up, batch never
    // takes the state below 3 remaining, and each admitted request with a
    // key leaves its record (the re-check carries the key).
    let policy = Policy::per_second(5)
        .name("api")
        .class("critical", 0)
        .class("batch", 50)
        .build()
        .unwrap();
    let store = MemoryStore::new();
    let layer = RateLimitLayer::builder(store.clone())
        .policy(policy.clone())
        .key(Global)
        .priority(User::<Granted>::new())
        .idempotency_key(header("idempotency-key"), Duration::from_secs(600))
        .mode(Mode::Shape {
            // Long enough for six at 5 per second on the slowest machine.
            max_wait: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    let reached = Arc::new(AtomicU64::new(0));
    let service = counted(&layer, &reached);
    let requests = (0..6).map(|i| {
        let service = service.clone();
        tokio::spawn(async move {
            let request = Request::builder()
                .uri("/")
                .extension(Granted("batch"))
                .header("idempotency-key", format!("job-{i}"))
                .body(())
                .unwrap();
            service.oneshot(request).await.unwrap().status()
        })
    });
    let statuses = futures::future::join_all(requests).await;
    let admitted = statuses
        .iter()
        .filter(|status| *status.as_ref().unwrap() == StatusCode::OK)
        .count();
    assert_eq!(admitted, 6, "shaping waits until each may go: {statuses:?}");
    let policies = [policy];
    let remaining = store.peek("global", &policies).await.unwrap().decisions()[0].remaining();
    assert!(
        remaining >= 3,
        "batch's reserve of 3 held through the re-checks: {remaining} remaining"
    );
    assert_eq!(store.idempotency_records(), 6, "each admission recorded");
}

// Row 5: grow state and evict other tenants.

#[tokio::test]
async fn fresh_keys_from_one_tenant_never_evict_another_tenants_record() {
    let clock = manual_clock();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(100_000)
        .build();
    let policies = [Policy::per_minute(1_000_000).name("api").build().unwrap()];
    let keyed = |key: String| CheckOptions::new().idempotency_key(key, Duration::from_secs(600));
    let empty = store.memory_bytes();
    let first = store
        .check_with("victim", &policies, 1, &keyed("pay-1".into()))
        .await
        .unwrap();
    assert!(first.verdict().is_allowed() && !first.is_replay());
    let one = store.memory_bytes();
    assert!(
        one > empty,
        "a record counts in memory_bytes: {empty} -> {one}"
    );
    for i in 0..10_000 {
        let checked = store
            .check_with("mallory", &policies, 1, &keyed(format!("fresh-{i}")))
            .await
            .unwrap();
        assert!(checked.verdict().is_allowed());
    }
    assert!(
        store.idempotency_records() <= 1 + 64,
        "mallory holds at most 64 records: {}",
        store.idempotency_records()
    );
    let after = store.memory_bytes();
    assert!(
        after - one < 64 * 1024,
        "10 000 fresh keys grew the store by {} bytes",
        after - one
    );
    let retry = store
        .check_with("victim", &policies, 1, &keyed("pay-1".into()))
        .await
        .unwrap();
    assert!(retry.is_replay(), "the victim's record survived the flood");
}

#[tokio::test]
async fn denied_requests_write_no_record_in_memory_or_redis() {
    let clock = manual_clock();
    let policies = [Policy::per_minute(1).name("api").build().unwrap()];
    let keyed =
        |i: u32| CheckOptions::new().idempotency_key(format!("k-{i}"), Duration::from_secs(600));
    let memory = MemoryStore::with_clock(clock.clone());
    let prefix = unique_prefix("hostile-records");
    let redis = standalone(&prefix, client(&clock)).await;
    for i in 0..2_000 {
        let a = memory
            .check_with("mallory", &policies, 1, &keyed(i))
            .await
            .unwrap();
        let b = redis
            .check_with("mallory", &policies, 1, &keyed(i))
            .await
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.verdict().is_allowed(), i == 0);
    }
    assert_eq!(memory.idempotency_records(), 1, "only the admission");
    let mut connection = redis_common::raw(&portcullis_tests::redis_url());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut connection)
        .unwrap();
    assert_eq!(
        keys.len(),
        2,
        "the state and the admitted request's record, no key per denial: {keys:?}"
    );
}

#[tokio::test]
async fn a_full_record_table_never_answers_retry_after_zero() {
    // One shard holding at most 16 subjects and 16 records, denying new
    // subjects when full: records beyond the bound are not kept, and the
    // request is still decided (no refusal, no `Retry-After: 0`).
    // A manual clock: no refill while the loop runs, however slow.
    let store = MemoryStore::builder()
        .clock(manual_clock())
        .shards(1)
        .max_keys(16)
        .when_full(WhenFull::Deny)
        .build();
    let policies = [Policy::per_minute(1_000).name("api").build().unwrap()];
    for i in 0..2_000 {
        let options =
            CheckOptions::new().idempotency_key(format!("k-{i}"), Duration::from_secs(600));
        let checked = store.check_with("tenant", &policies, 1, &options).await;
        match checked {
            Ok(checked) => assert_eq!(
                checked.verdict().is_allowed(),
                i < 1_000,
                "check {i} decided as the policy says"
            ),
            Err(error) => panic!("check {i} refused for want of room for its record: {error}"),
        }
    }
    assert!(
        store.idempotency_records() <= 16,
        "{}",
        store.idempotency_records()
    );
}

// Row 6: flood the log, read operator text.

/// Runs `body` on a current-thread runtime whose clock stands still (the
/// layers' once-a-second logs then see one instant, however slow the
/// machine) under a subscriber that captures `INFO` and above; returns
/// what was logged.
fn logged(body: impl std::future::Future<Output = ()>) -> String {
    let captured = Captured::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    tracing::dispatcher::with_default(&captured.dispatch(tracing::Level::INFO), || {
        runtime.block_on(body)
    });
    captured.text()
}

#[test]
fn bogus_classes_and_oversize_costs_flood_neither_the_log_nor_the_client() {
    let log = logged(async {
        let reached = Arc::new(AtomicU64::new(0));
        let classes = counted(&classed_layer(MemoryStore::new()), &reached);
        for _ in 0..1_000 {
            let (status, response) = send(&classes, classed_request(Some("urgent"), None)).await;
            let body = String::from_utf8_lossy(response.body()).into_owned();
            assert!(
                !body.contains("PolicyBuilder") && !body.contains("urgent"),
                "{status}: {body}"
            );
        }
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .policy(Policy::per_minute(5).name("api").build().unwrap())
            .key(Global)
            .cost(|request: &RequestHead<'_>| {
                request
                    .headers()
                    .get("x-cost")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            })
            .build()
            .unwrap();
        let costs = counted(&layer, &reached);
        for _ in 0..1_000 {
            let request = Request::builder()
                .header("x-cost", "1000")
                .body(())
                .unwrap();
            let (status, response) = send(&costs, request).await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            let body = String::from_utf8_lossy(response.body()).into_owned();
            assert!(
                body.contains("costs more than the rate limit ever allows"),
                "{body}"
            );
            assert!(
                !body.contains("capacity") && !body.contains("api"),
                "{body}"
            );
        }
    });
    // Within one instant: the bogus classes log nothing, the oversize
    // costs one line with their count.
    let lines = log.lines().count();
    assert_eq!(
        lines, 1,
        "2 000 hostile requests logged {lines} lines (at most one a second):\n{log}"
    );
    assert!(!log.contains("urgent"), "{log}");
}

// Row 9: the wrong advice.

#[test]
fn a_missing_api_key_is_answered_in_the_extractors_words_over_http_and_grpc() {
    let log = logged(async {
        let reached = Arc::new(AtomicU64::new(0));
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .policy(Policy::per_minute(5).build().unwrap())
            .key(ApiKey::new())
            .build()
            .unwrap();
        let service = counted(&layer, &reached);
        for _ in 0..100 {
            let (status, response) = send(&service, Request::get("/").body(()).unwrap()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            let body = String::from_utf8_lossy(response.body()).into_owned();
            assert!(
                body.contains("an API key in the x-api-key header"),
                "{body}"
            );
            assert!(!body.contains("Axum") && !body.contains("peer"), "{body}");
        }
        let grpc = Request::post("/pkg.Service/Method")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let (status, response) = send(&service, grpc).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "gRPC errors travel in trailers-only responses"
        );
        assert_eq!(response.headers()["grpc-status"], "3", "INVALID_ARGUMENT");
        // Percent-encoded, as gRPC sends it.
        let message = response.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .replace("%20", " ");
        assert!(message.contains("API key"), "{message}");
        assert!(!message.contains("Axum"), "{message}");
        // The concurrency layer answers and logs alike.
        let concurrency = ConcurrencyLimitLayer::builder(MemoryStore::new())
            .policy(
                ConcurrencyPolicy::max_in_flight(2)
                    .name("streams")
                    .build()
                    .unwrap(),
            )
            .key(ApiKey::new())
            .build()
            .unwrap();
        let service = counted(&concurrency, &reached);
        let (status, response) = send(&service, Request::get("/").body(()).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(response.body()).contains("API key"));
        assert_eq!(reached.load(Ordering::SeqCst), 0);
    });
    let warnings: Vec<&str> = log.lines().filter(|line| line.contains("WARN")).collect();
    assert_eq!(
        warnings.len(),
        2,
        "one line per layer for 102 rejections within a second:\n{log}"
    );
    assert!(
        warnings.iter().all(|line| line.contains("x-api-key")),
        "{log}"
    );
    assert!(
        !log.contains("connect_info"),
        "ApiKey's log gives no peer-IP advice:\n{log}"
    );
}

#[test]
fn a_missing_key_over_grpc_is_logged_as_grpc() {
    let log = logged(async {
        let reached = Arc::new(AtomicU64::new(0));
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .policy(Policy::per_minute(5).build().unwrap())
            .key(ApiKey::new())
            .build()
            .unwrap();
        let service = counted(&layer, &reached);
        let grpc = Request::post("/pkg.Service/Method")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        send(&service, grpc).await;
    });
    assert!(log.contains("gRPC status 3"), "{log}");
    assert!(!log.contains("status=400"), "{log}");
}
