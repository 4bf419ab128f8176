//! Keyed concurrency limits end to end: `MemoryStore` and `RedisStore`
//! (standalone and Cluster) hold leases identically (differential); three
//! OS processes sharing one Redis never have more than `max_in_flight`
//! handlers of one subject running at once; a process killed with leases
//! held gives them back by the TTL (on Redis' clock); a cancelled request,
//! a dropped body and a client that disconnects release their permit;
//! renewals keep a long request's lease past its TTL; the layer stacks
//! with `RateLimitLayer`; a layer over `BoxLeaseStore::new(RedisStore)`
//! (the store an app picks at start-up) never runs more than
//! `max_in_flight` at once.

mod concurrency_limit_layer;
use crate::redis_common;

use std::convert::Infallible;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use portcullis_core::{
    BoxLeaseStore, Clock, ConcurrencyPolicy, LeaseId, LeaseStore, ManualClock, MemoryStore,
};
use portcullis_redis::{ClockMode, RedisStore};
use portcullis_tests::{redis_url, unique_prefix};
use portcullis_tower::{ConcurrencyLimitLayer, Global};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis_common::{client, manual_clock, path_url};
use tower::{Layer, ServiceExt};

// ---------------------------------------------------------------- differential

#[derive(Debug, Clone)]
enum Op {
    Acquire(u8),
    Renew(usize),
    Release(usize),
    /// Move the clock forward (µs).
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3).prop_map(Op::Acquire),
        2 => (0usize..12).prop_map(Op::Renew),
        2 => (0usize..12).prop_map(Op::Release),
        3 => prop_oneof![0u64..10, 0u64..2_000_000].prop_map(Op::Wait),
    ]
}

fn differential(redis: &RedisStore, clock: &ManualClock, what: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let strategy = (
        1u64..4,
        10u64..2_000,
        proptest::collection::vec(op(), 1..40),
    );
    runner
        .run(&strategy, |(max, ttl_ms, ops)| {
            let memory = MemoryStore::with_clock(clock.clone());
            let policy = ConcurrencyPolicy::max_in_flight(max)
                .lease_ttl(Duration::from_millis(ttl_ms))
                .name(format!("c{max}-{ttl_ms}"))
                .build()
                .unwrap();
            // Fresh subjects per case (the clock only moves forward).
            let case = LeaseId::generate().to_string();
            let subject = |s: u8| format!("{case}-{s}");
            let mut held: Vec<(u8, LeaseId)> = Vec::new();
            runtime.block_on(async {
                for op in ops {
                    match op {
                        Op::Acquire(s) => {
                            let id = LeaseId::generate();
                            let want = memory.acquire(&subject(s), &policy, id).await.unwrap();
                            let got = redis.acquire(&subject(s), &policy, id).await.unwrap();
                            prop_assert_eq!(got, want, "{}: acquire", what);
                            if got.is_granted() {
                                held.push((s, id));
                            }
                        }
                        Op::Renew(i) => {
                            let Some(&(s, id)) = held.get(i) else {
                                continue;
                            };
                            let want = memory.renew(&subject(s), &policy, id).await.unwrap();
                            let got = redis.renew(&subject(s), &policy, id).await.unwrap();
                            prop_assert_eq!(got, want, "{}: renew", what);
                        }
                        Op::Release(i) => {
                            let Some(&(s, id)) = held.get(i) else {
                                continue;
                            };
                            let want = memory.release(&subject(s), &policy, id).await.unwrap();
                            let got = redis.release(&subject(s), &policy, id).await.unwrap();
                            prop_assert_eq!(got, want, "{}: release", what);
                        }
                        Op::Wait(us) => clock.advance(Duration::from_micros(us)),
                    }
                }
                Ok::<(), TestCaseError>(())
            })
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_and_redis_standalone_agree() {
    let clock = manual_clock();
    let redis = redis_common::standalone(&unique_prefix("lease-diff"), client(&clock)).await;
    tokio::task::spawn_blocking(move || differential(&redis, &clock, "standalone"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_and_redis_cluster_agree() {
    let clock = manual_clock();
    let redis = redis_common::cluster(&unique_prefix("lease-diff"), client(&clock)).await;
    tokio::task::spawn_blocking(move || differential(&redis, &clock, "cluster"))
        .await
        .unwrap();
}

// ---------------------------------------------------------------- Redis keys

/// Redis' `TIME` in microseconds.
fn server_now(connection: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(connection).unwrap();
    secs * 1_000_000 + micros
}

#[tokio::test]
async fn the_lease_key_expires_with_its_last_lease_and_goes_when_empty() {
    let prefix = unique_prefix("lease-key");
    let store = redis_common::standalone(&prefix, ClockMode::Redis).await;
    let policy = ConcurrencyPolicy::max_in_flight(3)
        .lease_ttl(Duration::from_secs(20))
        .name("keys")
        .build()
        .unwrap();
    let a = store
        .acquire("tenant", &policy, LeaseId::generate())
        .await
        .unwrap()
        .lease()
        .unwrap();
    let b = store
        .acquire("tenant", &policy, LeaseId::generate())
        .await
        .unwrap()
        .lease()
        .unwrap();
    let key = store.lease_key_for("tenant", "keys");
    assert!(key.contains("{tenant}"), "{key}");
    let mut connection = redis_common::raw(&redis_url());
    let expire_ms: i64 = redis_common::pexpiretime(&mut connection, &key).unwrap();
    let last = a.expires_at_micros().max(b.expires_at_micros());
    // No later than the last lease's expiry, rounded up to Redis' ms.
    assert_eq!(expire_ms as u64, last.div_ceil(1000), "{key}");
    let members: u64 = redis::cmd("ZCARD")
        .arg(&key)
        .query(&mut connection)
        .unwrap();
    assert_eq!(members, 2);
    assert!(store.release("tenant", &policy, a.id()).await.unwrap());
    assert!(store.release("tenant", &policy, b.id()).await.unwrap());
    let exists: u64 = redis::cmd("EXISTS")
        .arg(&key)
        .query(&mut connection)
        .unwrap();
    assert_eq!(exists, 0, "an empty lease set is no key");
    assert!(!store.release("tenant", &policy, a.id()).await.unwrap());
    assert_eq!(store.renew("tenant", &policy, b.id()).await.unwrap(), None);
}

// ---------------------------------------------------------------- processes

const PROCESSES: usize = 3;
const MAX_IN_FLIGHT: u64 = 3;

/// `PROCESSES` `lease_worker load` processes on `target` (`--url U` or
/// `--cluster U1,U2,..`): never more than `MAX_IN_FLIGHT` handlers of the
/// subject inside at once, counted by `INCRBY` on one Redis key.
fn processes_never_exceed_max_in_flight(target: [&str; 2]) {
    let prefix = unique_prefix("lease-procs");
    let counter = format!("{prefix}:inside");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_lease_worker"))
                .arg("load")
                .args(target)
                .args(["--prefix", &prefix, "--subject", "tenant-1"])
                .args(["--max", &MAX_IN_FLIGHT.to_string(), "--ttl-ms", "30000"])
                .args(["--tasks", "8", "--requests", "25"])
                .args(["--counter", &counter])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the lease_worker binary should start")
        })
        .collect();
    let mut admitted = 0;
    let mut limited = 0;
    for child in children {
        let output = child
            .wait_with_output()
            .expect("lease_worker should finish");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "lease_worker failed: {stdout} {stderr}"
        );
        let field = |name: &str| -> u64 {
            stdout
                .split_whitespace()
                .find_map(|item| item.strip_prefix(&format!("{name}=")))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {stdout:?} {stderr}"))
        };
        assert_eq!(field("errors"), 0, "{stdout} {stderr}");
        let inside = field("max_inside");
        // A process may get no permit at all (the others held every one
        // while it ran): 0 is fine, more than the max is not.
        assert!(
            inside <= MAX_IN_FLIGHT,
            "{inside} handlers of one subject were inside at once (max {MAX_IN_FLIGHT}): {stdout}"
        );
        admitted += field("admitted");
        limited += field("limited");
    }
    assert_eq!(admitted + limited, PROCESSES as u64 * 8 * 25);
    assert!(admitted > 0);
    println!("admitted {admitted}, limited {limited} across {PROCESSES} processes");
}

#[test]
fn three_processes_never_exceed_max_in_flight() {
    processes_never_exceed_max_in_flight(["--url", &path_url(redis_url())]);
}

#[test]
fn three_processes_never_exceed_max_in_flight_on_the_cluster() {
    let urls: Vec<String> = portcullis_tests::cluster_urls()
        .into_iter()
        .map(path_url)
        .collect();
    processes_never_exceed_max_in_flight(["--cluster", &urls.join(",")]);
}

/// A `lease_worker hold` process on `target` takes every permit and is
/// SIGKILLed; its leases come back by their TTL on Redis' clock (`TIME`
/// of `time_url`), and not before.
async fn a_killed_process_gives_its_leases_back(
    target: [&str; 2],
    store: RedisStore,
    time_url: &str,
) {
    let prefix = store.prefix().to_owned();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lease_worker"))
        .arg("hold")
        .args(target)
        .args(["--prefix", &prefix, "--subject", "tenant-k"])
        .args(["--max", "2", "--ttl-ms", "1500"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the lease_worker binary should start");
    let mut line = String::new();
    {
        use std::io::BufRead;
        let stdout = child.stdout.take().unwrap();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
    }
    let expiry: u64 = line
        .strip_prefix("held ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("lease_worker printed {line:?}"));
    child.kill().expect("SIGKILL"); // Child::kill is SIGKILL on Unix
    child.wait().unwrap();

    let policy = ConcurrencyPolicy::max_in_flight(2)
        .lease_ttl(Duration::from_millis(1500))
        .name("workers")
        .build()
        .unwrap();
    let mut connection = redis_common::raw(time_url);
    let mut denied_while_held = 0;
    loop {
        let before = server_now(&mut connection);
        let decision = store
            .acquire("tenant-k", &policy, LeaseId::generate())
            .await
            .unwrap();
        let after = server_now(&mut connection);
        if after < expiry {
            // Both of the dead process's leases are still live.
            assert!(!decision.is_granted(), "granted at {after} < {expiry}");
            assert_eq!(decision.in_flight(), 2);
            denied_while_held += 1;
        } else if before >= expiry {
            // Past their TTL on Redis' clock: they came back by themselves.
            assert!(
                decision.is_granted(),
                "still denied at {before} >= {expiry}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("denied {denied_while_held} times while the dead process's leases were live");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_process_gives_its_leases_back_by_the_ttl() {
    let store = redis_common::standalone(&unique_prefix("lease-kill"), ClockMode::Redis).await;
    let url = path_url(redis_url());
    a_killed_process_gives_its_leases_back(["--url", &url], store, &redis_url()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_process_gives_its_leases_back_by_the_ttl_on_the_cluster() {
    let store = redis_common::cluster(&unique_prefix("lease-kill"), ClockMode::Redis).await;
    let urls: Vec<String> = portcullis_tests::cluster_urls()
        .into_iter()
        .map(path_url)
        .collect();
    let time_url = portcullis_tests::cluster_urls()[0].clone();
    a_killed_process_gives_its_leases_back(["--cluster", &urls.join(",")], store, &time_url).await;
}

// ---------------------------------------------------------------- the layer

fn concurrency_policy(ttl: Duration) -> ConcurrencyPolicy {
    ConcurrencyPolicy::max_in_flight(1)
        .lease_ttl(ttl)
        .name("one")
        .build()
        .unwrap()
}

/// A handler that signals when it is entered and then waits for `release`.
fn blocking_handler(
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    release: Arc<tokio::sync::Notify>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_: Request<Full<Bytes>>| {
        let entered = entered.clone();
        let release = Arc::clone(&release);
        async move {
            let _ = entered.send(());
            release.notified().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    })
}

/// Waits until `store` grants `subject` a permit again, and asserts that
/// it happened before the lease could have expired (`deadline_us`, on
/// `now`'s clock): it was released, not expired.
async fn assert_released<St: LeaseStore>(
    store: &St,
    policy: &ConcurrencyPolicy,
    subject: &str,
    now: impl Fn() -> u64,
    deadline_us: u64,
) {
    loop {
        let id = LeaseId::generate();
        let granted = store.acquire(subject, policy, id).await.unwrap();
        let at = now();
        if granted.is_granted() {
            assert!(at < deadline_us, "granted only once the lease expired");
            store.release(subject, policy, id).await.unwrap();
            return;
        }
        assert!(at < deadline_us, "never released before the lease expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cancelled_request_releases<St: LeaseStore + Clone>(store: St, now: impl Fn() -> u64) {
    let policy = concurrency_policy(Duration::from_secs(60));
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy.clone())
        .key(Global)
        .build()
        .unwrap();
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let service = layer.layer(blocking_handler(entered_tx, Arc::clone(&release)));
    let started = now();
    let task = tokio::spawn(
        service
            .clone()
            .oneshot(Request::new(Full::new(Bytes::new()))),
    );
    entered.recv().await.unwrap();
    // While the handler runs, the only permit is taken.
    let second = service
        .clone()
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(second.headers().contains_key(http::header::RETRY_AFTER));
    // Cancel the request: its future is dropped inside the handler.
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_released(&store, &policy, "global", &now, started + 60_000_000).await;

    // A body dropped unread releases too.
    let response = service
        .clone()
        .oneshot(Request::new(Full::new(Bytes::new())));
    release.notify_one();
    let response = tokio::spawn(response);
    entered.recv().await.unwrap();
    let response = response.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let denied = service
        .clone()
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(
        denied.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the unsent body holds the permit"
    );
    drop(response);
    assert_released(&store, &policy, "global", &now, started + 60_000_000).await;
}

#[tokio::test]
async fn memory_cancelled_requests_and_dropped_bodies_release() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    // Each look at the clock moves it a second on: a permit that was never
    // released fails the test once its 60 s lease would have expired,
    // rather than hanging.
    cancelled_request_releases(store, move || {
        clock.advance(Duration::from_secs(1));
        clock.now_micros()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_cancelled_requests_and_dropped_bodies_release() {
    let store = redis_common::standalone(&unique_prefix("lease-cancel"), ClockMode::Redis).await;
    let now = move || server_now(&mut redis_common::raw(&redis_url()));
    cancelled_request_releases(store, now).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_cluster_cancelled_requests_release() {
    let store = redis_common::cluster(&unique_prefix("lease-cancel"), ClockMode::Redis).await;
    let url = portcullis_tests::cluster_urls()[0].clone();
    let now = move || server_now(&mut redis_common::raw(&url));
    cancelled_request_releases(store, now).await;
}

// ---------------------------------------------------------------- boxed

/// Requests inside the handler now, and the most there ever were at once.
#[derive(Clone, Default)]
struct Inside {
    now: Arc<AtomicU64>,
    most: Arc<AtomicU64>,
}

/// A handler that counts itself in `inside`, signals `entered`, waits for
/// a permit of `gate`, pauses `pause` (to overlap with other requests),
/// and counts itself out before it answers (so before its lease is
/// released).
fn counting_handler(
    inside: Inside,
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    gate: Arc<tokio::sync::Semaphore>,
    pause: Duration,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_: Request<Full<Bytes>>| {
        let inside = inside.clone();
        let entered = entered.clone();
        let gate = Arc::clone(&gate);
        async move {
            let now = inside.now.fetch_add(1, Ordering::SeqCst) + 1;
            inside.most.fetch_max(now, Ordering::SeqCst);
            let _ = entered.send(());
            gate.acquire().await.unwrap().forget();
            tokio::time::sleep(pause).await;
            inside.now.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    })
}

/// Sends one request through `service` and reads its whole body (the
/// permit is released once the body has been sent); the status.
async fn status_after_body<S, B>(service: S) -> StatusCode
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let response = service
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

/// A `ConcurrencyLimitLayer` over `BoxLeaseStore::new(redis)`: with
/// `max_in_flight` requests held inside the handler, every other request
/// is `429` and Redis itself refuses a permit; once they finish, their
/// permits come back (released through the box, before the TTL); under a
/// burst of concurrent requests no more than `max_in_flight` are ever
/// inside the handler at once.
async fn boxed_redis_never_exceeds_max_in_flight(redis: RedisStore, now: impl Fn() -> u64) {
    const MAX: u64 = 2;
    const BURST: usize = 24;
    let store = BoxLeaseStore::new(redis);
    let policy = ConcurrencyPolicy::max_in_flight(MAX)
        .lease_ttl(Duration::from_secs(60))
        .name("boxed")
        .build()
        .unwrap();
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy.clone())
        .key(Global)
        .build()
        .unwrap();
    let started = now();

    // Hold MAX requests inside.
    let inside = Inside::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let service = layer.layer(counting_handler(
        inside.clone(),
        entered_tx,
        Arc::clone(&gate),
        Duration::ZERO,
    ));
    let held: Vec<_> = (0..MAX)
        .map(|_| tokio::spawn(status_after_body(service.clone())))
        .collect();
    for _ in 0..MAX {
        // A guard against a hang (a held request denied never enters),
        // not a timing assertion.
        tokio::time::timeout(Duration::from_secs(30), entered.recv())
            .await
            .expect("each of the first MAX requests enters the handler")
            .unwrap();
    }
    for _ in 0..4 {
        let denied = service
            .clone()
            .oneshot(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(denied.headers().contains_key(http::header::RETRY_AFTER));
    }
    assert_eq!(inside.now.load(Ordering::SeqCst), MAX);
    let direct = store
        .acquire("global", &policy, LeaseId::generate())
        .await
        .unwrap();
    assert!(!direct.is_granted(), "Redis holds MAX leases: {direct:?}");
    assert_eq!(direct.in_flight(), MAX);
    gate.add_permits(MAX as usize);
    for task in held {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(inside.most.load(Ordering::SeqCst), MAX);
    assert_released(&store, &policy, "global", &now, started + 60_000_000).await;

    // A burst: never more than MAX inside at once.
    let inside = Inside::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(BURST));
    let (entered_tx, _entered) = tokio::sync::mpsc::unbounded_channel();
    let service = layer.layer(counting_handler(
        inside.clone(),
        entered_tx,
        gate,
        Duration::from_millis(20),
    ));
    let burst: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(status_after_body(service.clone())))
        .collect();
    let (mut admitted, mut limited) = (0, 0);
    for task in burst {
        match task.await.unwrap() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    let most = inside.most.load(Ordering::SeqCst);
    assert!(
        most <= MAX,
        "{most} requests were inside at once (max {MAX})"
    );
    assert_eq!(admitted + limited, BURST);
    assert!(admitted > 0);
    println!("burst through a boxed RedisStore: admitted {admitted}, limited {limited}, most inside {most}");
    assert_released(&store, &policy, "global", &now, started + 60_000_000).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_boxed_redis_store_never_runs_more_than_max_in_flight() {
    let redis = redis_common::standalone(&unique_prefix("lease-boxed"), ClockMode::Redis).await;
    let now = move || server_now(&mut redis_common::raw(&redis_url()));
    boxed_redis_never_exceeds_max_in_flight(redis, now).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_boxed_redis_cluster_store_never_runs_more_than_max_in_flight() {
    let redis = redis_common::cluster(&unique_prefix("lease-boxed"), ClockMode::Redis).await;
    let url = portcullis_tests::cluster_urls()[0].clone();
    let now = move || server_now(&mut redis_common::raw(&url));
    boxed_redis_never_exceeds_max_in_flight(redis, now).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_disconnects_releases_its_permit() {
    use tokio::io::AsyncWriteExt;

    let store =
        redis_common::standalone(&unique_prefix("lease-disconnect"), ClockMode::Redis).await;
    let policy = concurrency_policy(Duration::from_secs(60));
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy.clone())
        .key(Global)
        .build()
        .unwrap();
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::get(move || {
                let entered = entered_tx.clone();
                let release = Arc::clone(&release);
                async move {
                    let _ = entered.send(());
                    release.notified().await;
                    "never"
                }
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let started = server_now(&mut redis_common::raw(&redis_url()));
    let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    entered.recv().await.unwrap();
    assert!(!store
        .acquire("global", &policy, LeaseId::generate())
        .await
        .unwrap()
        .is_granted());
    drop(client); // the client goes away mid-request
    assert_released(
        &store,
        &policy,
        "global",
        || server_now(&mut redis_common::raw(&redis_url())),
        started + 60_000_000,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn renewals_keep_a_long_request_past_its_ttl() {
    let prefix = unique_prefix("lease-renew");
    let store = redis_common::standalone(&prefix, ClockMode::Redis).await;
    let ttl = Duration::from_secs(3);
    let policy = concurrency_policy(ttl);
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy.clone())
        .key(Global)
        .build()
        .unwrap();
    let key = store.lease_key_for("global", "one");
    let handler_store = store.clone();
    let handler_policy = policy.clone();
    let service = layer.layer(tower::service_fn(move |_: Request<Full<Bytes>>| {
        let key = key.clone();
        let store = handler_store.clone();
        let policy = handler_policy.clone();
        async move {
            let mut connection = redis_common::raw(&redis_url());
            let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(&mut connection)
                .unwrap();
            assert_eq!(first.len(), 1, "the request holds one lease");
            let (member, first_expiry) = (first[0].0.clone(), first[0].1 as u64);
            // Run until well past the lease's first expiry, on Redis' clock.
            while server_now(&mut connection) < first_expiry + 1_000_000 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let score: Option<f64> = redis::cmd("ZSCORE")
                .arg(&key)
                .arg(&member)
                .query(&mut connection)
                .unwrap();
            let now = server_now(&mut connection);
            assert!(
                score.is_some_and(|s| s as u64 > now),
                "the lease was renewed past its TTL (score {score:?}, now {now})"
            );
            let other = store
                .acquire("global", &policy, LeaseId::generate())
                .await
                .unwrap();
            assert!(
                !other.is_granted(),
                "the renewed lease still holds the permit"
            );
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"long"))))
        }
    }));
    let response = service
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"long");
    // The body ended: released (spawned), well before a 3 s TTL.
    let started = server_now(&mut redis_common::raw(&redis_url()));
    assert_released(
        &store,
        &policy,
        "global",
        || server_now(&mut redis_common::raw(&redis_url())),
        started + 3_000_000,
    )
    .await;
}

/// At maxmemory with `noeviction`, on both call paths: a subject holding
/// leases still acquires, renews and releases (the allow-oom twin); a new
/// subject is refused with `OutOfMemory` (the layer answers `429`).
#[tokio::test(flavor = "multi_thread")]
async fn out_of_memory_keeps_held_subjects_and_refuses_new_ones() {
    use portcullis_core::StoreError;
    let (server, functions, evalsha) = redis_common::full_redis_stores("lease-oom").await;
    let policy = ConcurrencyPolicy::max_in_flight(3)
        .lease_ttl(Duration::from_secs(60))
        .name("oom")
        .build()
        .unwrap();
    let mut held = Vec::new();
    for store in [&functions, &evalsha] {
        let lease = store
            .acquire("held", &policy, LeaseId::generate())
            .await
            .unwrap()
            .lease()
            .unwrap();
        held.push(lease.id());
    }
    portcullis_tests::reliability::fill_past_maxmemory(&server.url()).await;
    for (store, first) in [(&functions, held[0]), (&evalsha, held[1])] {
        let path = store.call_path();
        let second = store
            .acquire("held", &policy, LeaseId::generate())
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(second.is_granted(), "{path}");
        assert_eq!(second.in_flight(), 2, "{path}");
        assert!(
            store.renew("held", &policy, first).await.unwrap().is_some(),
            "{path}"
        );
        assert!(
            store.release("held", &policy, first).await.unwrap(),
            "{path}"
        );
        let fresh = store.acquire("fresh", &policy, LeaseId::generate()).await;
        assert!(
            matches!(fresh, Err(StoreError::OutOfMemory { .. })),
            "{path}: {fresh:?}"
        );
    }
    redis_common::lift_maxmemory(&server);
}
