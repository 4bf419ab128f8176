//! Charging after the response, end to end through `RateLimitLayer` with
//! `charge_from_response` and the `Charge` handle: failed logins per (IP,
//! username), LLM tokens per API key, the debt bound, build-time refusal
//! of other algorithms; on `MemoryStore` (manual clock) and on Redis,
//! standalone and Cluster (client clock on the same manual clock), which
//! must agree. Also a differential test of `Store::charge` itself: Redis
//! (charge.lua) against `MemoryStore` (algorithms::charge), decision for
//! decision. Runs on the EVALSHA path too (`PORTCULLIS_REDIS_CALL_PATH=evalsha`).

use crate::redis_common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use portcullis_core::{Algorithm, BoxStore, Clock, ManualClock, MemoryStore, Policy, Store};
use portcullis_tests::unique_prefix;
use portcullis_tower::{Charge, ConfigError, RateLimitLayer, RequestHead};
use redis_common::{client, cluster, manual_clock, standalone};
use tower::{service_fn, Layer, Service, ServiceExt};

/// Where the stores of one scenario live.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    Standalone,
    Cluster,
}

const BACKENDS: [Backend; 3] = [Backend::Memory, Backend::Standalone, Backend::Cluster];

/// `n` stores sharing one state (one `MemoryStore` and its clones, or `n`
/// separate `RedisStore`s on one server with one prefix), all on `clock`.
async fn stores(backend: Backend, clock: &ManualClock, tag: &str, n: usize) -> Vec<BoxStore> {
    match backend {
        Backend::Memory => {
            let store = MemoryStore::with_clock(clock.clone());
            (0..n).map(|_| BoxStore::new(store.clone())).collect()
        }
        Backend::Standalone | Backend::Cluster => {
            let prefix = unique_prefix(tag);
            let mut stores = Vec::new();
            for _ in 0..n {
                let store = match backend {
                    Backend::Cluster => cluster(&prefix, client(clock)).await,
                    _ => standalone(&prefix, client(clock)).await,
                };
                stores.push(BoxStore::new(store));
            }
            stores
        }
    }
}

type Body = Full<Bytes>;

fn peer() -> SocketAddr {
    "198.51.100.7:50000".parse().unwrap()
}

/// What a client sees of a response: its status, `Retry-After` and
/// `RateLimit` (on admitted responses, the state after the charge).
type Outcome = (StatusCode, Option<String>, Option<String>);

fn status_and_retry<B>(response: &Response<B>) -> Outcome {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    (
        response.status(),
        header("retry-after"),
        header("ratelimit"),
    )
}

/// The key of a login: the peer IP and the username header.
fn ip_and_username(request: &RequestHead<'_>) -> Option<String> {
    let ip = request.extensions().get::<SocketAddr>()?.ip();
    let user = request.headers().get("x-username")?.to_str().ok()?;
    Some(format!("{ip}/{user}"))
}

/// 5 failed logins per 15 minutes per (IP, username), on two layers (two
/// separate stores sharing one state): successes never count, the sixth
/// failure is refused before the handler, other usernames are unaffected,
/// and the lock lifts one emission interval (3 minutes) after the fifth
/// failure's worth of time has passed. Returns the outcomes.
async fn failed_logins(backend: Backend) -> Vec<Outcome> {
    let clock = manual_clock();
    let stores = stores(backend, &clock, "charge-login", 2).await;
    let handled = Arc::new(AtomicU64::new(0));
    let mut services = Vec::new();
    for store in stores {
        let layer = RateLimitLayer::builder(store)
            .policy(
                Policy::per(5, Duration::from_secs(15 * 60))
                    .name("failed-logins")
                    .build()
                    .unwrap(),
            )
            .key(ip_and_username)
            // The deny cache waits on the real clock; these tests move a
            // manual one.
            .deny_cache(0)
            .charge_from_response(|parts| u64::from(parts.status == StatusCode::UNAUTHORIZED))
            .build()
            .unwrap();
        let handled = Arc::clone(&handled);
        services.push(layer.layer(service_fn(move |req: Request<()>| {
            handled.fetch_add(1, Ordering::Relaxed);
            let ok = req
                .headers()
                .get("x-password")
                .is_some_and(|p| p == "right");
            async move {
                let mut response = Response::new(Body::new(Bytes::new()));
                if !ok {
                    *response.status_mut() = StatusCode::UNAUTHORIZED;
                }
                Ok::<_, Infallible>(response)
            }
        })));
    }
    let login = |user: &str, password: &str| {
        Request::post("/login")
            .extension(peer())
            .header("x-username", user)
            .header("x-password", password)
            .body(())
            .unwrap()
    };
    let mut outcomes = Vec::new();
    let attempt = |i: usize, user: &'static str, password: &'static str| {
        let service = services[i % 2].clone();
        let request = login(user, password);
        async move {
            let response = service.oneshot(request).await.unwrap();
            status_and_retry(&response)
        }
    };
    // Successful logins never count.
    for i in 0..12 {
        let outcome = attempt(i, "alice", "right").await;
        assert_eq!(outcome.0, StatusCode::OK, "{backend:?}");
    }
    // Five failures, alternating between the two layers.
    for i in 0..5 {
        let outcome = attempt(i, "alice", "wrong").await;
        assert_eq!(
            outcome.0,
            StatusCode::UNAUTHORIZED,
            "{backend:?} failure {i}"
        );
        outcomes.push(outcome);
    }
    let before = handled.load(Ordering::Relaxed);
    // The sixth is refused without reaching the handler, on either layer,
    // and so is a correct password: the subject is locked.
    for i in 0..2 {
        let outcome = attempt(i, "alice", "wrong").await;
        assert_eq!(outcome.0, StatusCode::TOO_MANY_REQUESTS, "{backend:?}");
        outcomes.push(outcome);
    }
    let outcome = attempt(0, "alice", "right").await;
    assert_eq!(outcome.0, StatusCode::TOO_MANY_REQUESTS, "{backend:?}");
    outcomes.push(outcome);
    assert_eq!(handled.load(Ordering::Relaxed), before, "{backend:?}");
    // Another username from the same IP is not affected.
    assert_eq!(attempt(1, "bob", "wrong").await.0, StatusCode::UNAUTHORIZED);
    // One failure's worth (3 minutes) later, one more attempt.
    clock.advance(Duration::from_secs(180) - Duration::from_micros(1));
    outcomes.push(attempt(1, "alice", "wrong").await);
    assert_eq!(outcomes.last().unwrap().0, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_micros(1));
    outcomes.push(attempt(1, "alice", "wrong").await);
    assert_eq!(outcomes.last().unwrap().0, StatusCode::UNAUTHORIZED);
    outcomes.push(attempt(0, "alice", "right").await);
    assert_eq!(outcomes.last().unwrap().0, StatusCode::TOO_MANY_REQUESTS);
    outcomes
}

#[tokio::test]
async fn the_sixth_failed_login_is_refused_everywhere_alike() {
    let mut seen = Vec::new();
    for backend in BACKENDS {
        seen.push((backend, failed_logins(backend).await));
    }
    for (backend, outcomes) in &seen[1..] {
        assert_eq!(outcomes, &seen[0].1, "{backend:?} disagrees with memory");
    }
    // The sixth failure waits one emission interval: 3 minutes.
    assert_eq!(seen[0].1[5].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen[0].1[5].1.as_deref(), Some("180"));
    // The fifth failure's response reports what it left: nothing, for 3
    // minutes.
    assert_eq!(
        seen[0].1[4].2.as_deref(),
        Some("\"failed-logins\";r=0;t=180")
    );
}

/// An LLM endpoint: 10 000 tokens per minute per API key, each response
/// reporting what it used in `x-tokens-used` (3 000, 4 000, 5 000, …),
/// with a `Charge` handle adjusting by `x-add` / `x-refund` request
/// headers. Returns the outcomes.
async fn llm(backend: Backend, algorithm: Algorithm) -> Vec<Outcome> {
    let clock = manual_clock();
    let stores = stores(backend, &clock, "charge-llm", 1).await;
    let store = stores.into_iter().next().unwrap();
    let policies = [Policy::per_minute(10_000)
        .algorithm(algorithm)
        .name("tokens")
        .build()
        .unwrap()];
    let layer = RateLimitLayer::builder(store.clone())
        .policies(policies.clone())
        .key(|request: &RequestHead<'_>| {
            Some(
                request
                    .headers()
                    .get("x-api-key")?
                    .to_str()
                    .ok()?
                    .to_owned(),
            )
        })
        .deny_cache(0)
        .charge_from_response(|parts| {
            parts
                .headers
                .get("x-tokens-used")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0)
        })
        .build()
        .unwrap();
    let mut service = layer.layer(service_fn(|req: Request<u64>| async move {
        let charge = req.extensions().get::<Charge>().cloned();
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        };
        if let Some(charge) = &charge {
            if let Some(add) = header("x-add") {
                charge.add(add);
            }
            if let Some(refund) = header("x-refund") {
                charge.refund(refund);
            }
        }
        let mut response = Response::new(Body::new(Bytes::new()));
        response
            .headers_mut()
            .insert("x-tokens-used", (*req.body()).into());
        Ok::<_, Infallible>(response)
    }));
    let mut outcomes = Vec::new();
    let mut call = async |key: &str, tokens: u64, extra: &[(&str, u64)]| {
        let mut request = Request::post("/v1/complete").header("x-api-key", key);
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request.body(tokens).unwrap())
            .await
            .unwrap();
        let outcome = status_and_retry(&response);
        outcomes.push(outcome.clone());
        outcome
    };
    let mut third = None;
    for tokens in [3_000, 4_000, 5_000] {
        let outcome = call("key-1", tokens, &[]).await;
        assert_eq!(outcome.0, StatusCode::OK, "{backend:?}");
        third = Some(outcome);
    }
    // 12 000 used: 2 000 in debt. The fourth waits for 2 001 tokens, 6 ms
    // each: 12.006 s.
    let fourth = call("key-1", 1_000, &[]).await;
    assert_eq!(fourth.0, StatusCode::TOO_MANY_REQUESTS, "{backend:?}");
    assert_eq!(fourth.1.as_deref(), Some("13"), "{backend:?}");
    // The third response reported the debt it left.
    assert_eq!(
        third.and_then(|outcome| outcome.2).as_deref(),
        Some("\"tokens\";r=0;t=13"),
        "{backend:?}"
    );
    // Another key is unaffected.
    assert_eq!(call("key-2", 1, &[]).await.0, StatusCode::OK);
    clock.advance(Duration::from_micros(12_006_000 - 1));
    assert_eq!(
        call("key-1", 1_000, &[]).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_micros(1));
    // Admitted; the handler refunds 500 of the 1 000 the response reports
    // and adds 20: 520 charged.
    let refunded = call("key-1", 1_000, &[("x-refund", 500), ("x-add", 20)]).await;
    assert_eq!(refunded.0, StatusCode::OK, "{backend:?}");
    let peek = store.peek("key-1", &policies).await.unwrap();
    assert!(!peek.is_allowed(), "{backend:?}");
    // At the due time one token was free: 520 charged leave 519 of debt,
    // and one more token to wait for: 520 × 6 ms.
    assert_eq!(
        peek.retry_after(),
        Some(Duration::from_micros(520 * 6_000)),
        "{backend:?}"
    );
    // The debt bound: a response reporting a million tokens locks the key
    // for one full minute plus one token (60.006 s), not 100 minutes.
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(call("key-1", 1_000_000, &[]).await.0, StatusCode::OK);
    let peek = store.peek("key-1", &policies).await.unwrap();
    assert_eq!(peek.retry_after(), Some(Duration::from_micros(60_006_000)));
    assert_eq!(peek.decisions()[0].reset_after(), Duration::from_secs(120));
    clock.advance(Duration::from_micros(60_006_000 - 1));
    assert_eq!(call("key-1", 0, &[]).await.0, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_micros(1));
    assert_eq!(call("key-1", 0, &[]).await.0, StatusCode::OK);
    // A handler that refunds everything (a cached answer) is never charged.
    let handle_set = call("key-3", 10_000, &[("x-refund", 10_000)]).await;
    assert_eq!(handle_set.0, StatusCode::OK);
    let peek = store.peek("key-3", &policies).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 10_000, "{backend:?}");
    outcomes
}

#[tokio::test]
async fn llm_tokens_are_charged_after_the_response_everywhere_alike() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let mut seen = Vec::new();
        for backend in BACKENDS {
            seen.push((backend, llm(backend, algorithm).await));
        }
        for (backend, outcomes) in &seen[1..] {
            assert_eq!(
                outcomes, &seen[0].1,
                "{backend:?} disagrees with memory ({algorithm})"
            );
        }
    }
}

#[test]
fn other_algorithms_and_a_cost_are_refused_at_build() {
    let window = Policy::per_minute(10)
        .algorithm(Algorithm::FixedWindow)
        .name("window")
        .build()
        .unwrap();
    let err = RateLimitLayer::builder(MemoryStore::new())
        .policy(window)
        .charge_from_response(|_| 1)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::ChargeAfterResponse { .. }),
        "{err}"
    );
    // The tier here; which policy and what to give it, in the cause.
    let message = err.to_string();
    assert!(message.contains("\"default\""), "{message}");
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.contains("fixed_window"), "{cause}");
    assert!(cause.contains("Algorithm::Gcra"), "{cause}");
    let err = RateLimitLayer::builder(MemoryStore::new())
        .policy(Policy::per_minute(10).build().unwrap())
        .cost(|_| 2)
        .charge_from_response(|_| 1)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("cannot be combined"), "{err}");
}

/// A small deterministic generator (no external state, same sequence on
/// every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// One step of the charge differentials.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    Charge(u64),
}

/// `op` on both stores: the same decisions.
async fn alike(
    memory: &MemoryStore,
    redis: &BoxStore,
    subject: &str,
    policies: &[Policy],
    op: Op,
    context: &str,
) {
    let (m, r) = match op {
        Op::Check(cost) => (
            memory.check(subject, policies, cost).await,
            redis.check(subject, policies, cost).await,
        ),
        Op::Charge(cost) => (
            memory.charge(subject, policies, cost).await,
            redis.charge(subject, policies, cost).await,
        ),
    };
    let (m, r) = (m.unwrap(), r.unwrap());
    assert_eq!(m.decisions(), r.decisions(), "{context}");
}

/// `Store::charge` on Redis (charge.lua) and in memory
/// (algorithms::charge) answer identically, decision for decision, over a
/// mix of checks, peeks and charges (up to three times the capacity, so
/// the debt bound is reached), with time moving forward and back, for
/// GCRA and the token bucket with exact and fractional emission intervals
/// and two policies charged together.
#[tokio::test]
async fn redis_and_memory_charge_alike() {
    let policy_sets: Vec<Vec<Policy>> = vec![
        // A whole-microsecond interval: the GCRA fast paths (memory and
        // Redis) read the debts the charges leave.
        vec![Policy::per(4, Duration::from_secs(1))
            .name("e")
            .build()
            .unwrap()],
        vec![Policy::per(7, Duration::from_micros(999_983))
            .burst(3)
            .name("a")
            .build()
            .unwrap()],
        vec![Policy::per(5, Duration::from_secs(900))
            .algorithm(Algorithm::TokenBucket)
            .name("b")
            .build()
            .unwrap()],
        vec![
            Policy::per(3, Duration::from_secs(1))
                .name("c")
                .build()
                .unwrap(),
            Policy::per(10, Duration::from_micros(7_000_013))
                .algorithm(Algorithm::TokenBucket)
                .burst(4)
                .name("d")
                .build()
                .unwrap(),
        ],
    ];
    for backend in [Backend::Standalone, Backend::Cluster] {
        for (set, policies) in policy_sets.iter().enumerate() {
            let clock = manual_clock();
            let memory = MemoryStore::with_clock(clock.clone());
            let redis = stores(backend, &clock, "charge-diff", 1).await.remove(0);
            let capacity = policies.iter().map(Policy::capacity).min().unwrap();
            let mut rng = Lcg(set as u64 + 1);
            for step in 0..300 {
                let forward = rng.next(4) * rng.next(400_000);
                clock.advance(Duration::from_micros(forward));
                if rng.next(20) == 0 {
                    let back = rng.next(2_000_000);
                    clock.set(clock.now_micros().saturating_sub(back));
                }
                let subject = if rng.next(3) == 0 { "s2" } else { "s1" };
                let op = match rng.next(3) {
                    0 => Op::Check(rng.next(capacity + 1)),
                    _ => Op::Charge(rng.next(3 * capacity + 2)),
                };
                let context = format!("{backend:?}, set {set}, step {step}: {op:?} on {subject}");
                alike(&memory, &redis, subject, policies, op, &context).await;
            }
        }
    }
}

/// As `redis_and_memory_charge_alike`, with plan changes: each set
/// alternates with the same names and algorithms at other numbers, so
/// charges (of 0 too) read states written in other units, which both
/// stores rescale and write back alike (ALGORITHMS.md, "Changing a
/// policy").
#[tokio::test]
async fn redis_and_memory_charge_alike_across_plan_changes() {
    let gcra = |limit: u64, period_us: u64, name: &str| {
        Policy::per(limit, Duration::from_micros(period_us))
            .name(name)
            .build()
            .unwrap()
    };
    let bucket = |limit: u64, period_us: u64, burst: u64, name: &str| {
        Policy::per(limit, Duration::from_micros(period_us))
            .algorithm(Algorithm::TokenBucket)
            .burst(burst)
            .name(name)
            .build()
            .unwrap()
    };
    let plans: Vec<(Vec<Policy>, Vec<Policy>)> = vec![
        (vec![gcra(4, 1_000_000, "e")], vec![gcra(9, 999_983, "e")]),
        (
            vec![bucket(5, 900_000_000, 5, "b")],
            vec![bucket(3, 60_000_000, 7, "b")],
        ),
        (
            vec![gcra(3, 1_000_000, "c"), bucket(10, 7_000_013, 4, "d")],
            vec![gcra(7, 1_000_000, "c"), bucket(2, 1_000_000, 6, "d")],
        ),
    ];
    for backend in [Backend::Standalone, Backend::Cluster] {
        for (set, (first, second)) in plans.iter().enumerate() {
            let clock = manual_clock();
            let memory = MemoryStore::with_clock(clock.clone());
            let redis = stores(backend, &clock, "charge-plans", 1).await.remove(0);
            let mut rng = Lcg(set as u64 + 11);
            let mut policies = first;
            for step in 0..300 {
                if rng.next(6) == 0 {
                    policies = if std::ptr::eq(policies, first) {
                        second
                    } else {
                        first
                    };
                }
                let capacity = policies.iter().map(Policy::capacity).min().unwrap();
                clock.advance(Duration::from_micros(rng.next(4) * rng.next(400_000)));
                let subject = if rng.next(3) == 0 { "s2" } else { "s1" };
                let op = match rng.next(4) {
                    0 => Op::Check(rng.next(capacity + 1)),
                    1 => Op::Charge(0),
                    _ => Op::Charge(rng.next(3 * capacity + 2)),
                };
                let context = format!("{backend:?}, set {set}, step {step}: {op:?} on {subject}");
                alike(&memory, &redis, subject, policies, op, &context).await;
            }
        }
    }
}

#[tokio::test]
async fn redis_refuses_to_charge_other_algorithms() {
    let clock = manual_clock();
    let redis = stores(Backend::Standalone, &clock, "charge-refuse", 1)
        .await
        .remove(0);
    let window = [Policy::per_minute(10)
        .algorithm(Algorithm::SlidingLog)
        .build()
        .unwrap()];
    let err = redis.charge("s", &window, 1).await.unwrap_err();
    assert!(err.to_string().contains("sliding_log"), "{err}");
}

/// A charged key expires when it is back to full: its TTL is the charge's
/// `reset_after`, at most twice the full reset (here 30 minutes), on
/// Redis' own clock.
#[tokio::test]
async fn a_charged_key_expires_when_back_to_full() {
    let store = standalone(
        &unique_prefix("charge-ttl"),
        portcullis_redis::ClockMode::Redis,
    )
    .await;
    let mut connection = redis_common::raw(&portcullis_tests::redis_url());
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let policies = [Policy::per(5, Duration::from_secs(900))
            .algorithm(algorithm)
            .name(format!("ttl-{algorithm}"))
            .build()
            .unwrap()];
        let verdict = store.charge("s", &policies, 100).await.unwrap();
        let reset = verdict.decisions()[0].reset_after();
        assert_eq!(reset, Duration::from_secs(1_800), "{algorithm}");
        let key = store.key_for("s", policies[0].name());
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut connection).unwrap();
        assert!(
            pttl > 1_790_000 && pttl <= 1_800_001,
            "{algorithm}: PTTL {pttl} ms of {key}"
        );
        // A zero charge writes nothing and changes nothing.
        let again = store.charge("s", &policies, 0).await.unwrap();
        assert!(again.decisions()[0].reset_after() <= reset);
        let untouched = store.charge("t", &policies, 0).await.unwrap();
        assert!(untouched.is_allowed());
        let exists: i64 = redis::cmd("EXISTS")
            .arg(store.key_for("t", policies[0].name()))
            .query(&mut connection)
            .unwrap();
        assert_eq!(exists, 0, "{algorithm}");
    }
}
