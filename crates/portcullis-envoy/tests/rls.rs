//! The RLS v3 service against real stores: the memory store, and a real
//! Redis (`PORTCULLIS_REDIS_URL`, set by `cargo xtask test`; the Redis
//! tests fail when it is missing, never skip). Limits of N admit exactly
//! N, a request's descriptors are decided all or nothing, and what a
//! request carries (descriptors, values, hits) cannot pass a limit, grow
//! state beyond what the configuration allows, or change another
//! request's decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use portcullis_core::MemoryStore;
use portcullis_envoy::{Config, ConfigFile, DescriptorStore, LiveConfig, RlsService};
use portcullis_redis::RedisStore;
use tonic::Code as GrpcCode;

const CONFIG: &str = r#"
[[domains]]
name = "edge"

[[domains.descriptors]]
key = "user"
limit = 10
period = "1h"

[[domains.descriptors]]
key = "route"
value = "/x"
limit = 1
period = "1h"

[[domains.descriptors]]
key = "path"
value = "/login"
limit = 3
period = "1h"
name = "login"

[[domains.descriptors]]
key = "tenant"
limit = 5
period = "1m"
algorithm = "sliding_window"

[[domains.descriptors.descriptors]]
key = "plan"
value = "free"
limit = 2
period = "1h"
algorithm = "token_bucket"

[[domains.descriptors]]
key = "canary"
limit = 1
period = "1h"
shadow_mode = true
"#;

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: hits,
    }
}

fn service(store: impl DescriptorStore) -> RlsService {
    let config = Config::parse("rls-test.toml", CONFIG).unwrap();
    RlsService::builder(LiveConfig::new(config), store).build()
}

fn is_ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

fn codes(response: &RateLimitResponse) -> Vec<i32> {
    response.statuses.iter().map(|s| s.code).collect()
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A name no other test (or earlier run against the same Redis) uses.
fn unique(label: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{label}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn redis_store() -> RedisStore {
    let url = std::env::var("PORTCULLIS_REDIS_URL").expect(
        "PORTCULLIS_REDIS_URL is not set: run these tests with `cargo xtask test` \
         (or start a server with `cargo xtask redis` and export the URL it prints)",
    );
    RedisStore::builder()
        .url(url)
        .prefix(unique("envoy"))
        .build()
        .await
        .expect("Redis at PORTCULLIS_REDIS_URL must answer")
}

// ---- a limit of N admits exactly N, under concurrency ----

async fn exactly_n_under_concurrency(service: RlsService) {
    let user = unique("u");
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let service = service.clone();
        let user = user.clone();
        tasks.push(tokio::spawn(async move {
            let response = service
                .decide(&request("edge", &[&[("user", &user)]], 0))
                .await
                .unwrap();
            is_ok(&response)
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    assert_eq!(
        admitted, 10,
        "a limit of 10 per hour admitted {admitted} of 40"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_limit_of_n_admits_exactly_n() {
    exactly_n_under_concurrency(service(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_limit_of_n_admits_exactly_n() {
    exactly_n_under_concurrency(service(redis_store().await)).await;
}

// ---- all or nothing across a request's descriptors ----

async fn all_or_nothing(service: RlsService) {
    let user = unique("u");
    let both: &[&[(&str, &str)]] = &[&[("user", &user)], &[("route", "/x")]];
    // The route's own subject is shared across runs on one Redis: use a
    // user of its own and check the route's figures relative to it.
    let first = service.decide(&request("edge", both, 0)).await.unwrap();
    assert!(is_ok(&first), "{first:?}");
    assert_eq!(first.statuses[0].limit_remaining, 9);
    assert_eq!(first.statuses[1].limit_remaining, 0);
    let second = service.decide(&request("edge", both, 0)).await.unwrap();
    assert!(!is_ok(&second));
    assert_eq!(codes(&second), [OK, OVER]);
    // The user was not charged by the denied request: its status is a peek.
    assert_eq!(second.statuses[0].limit_remaining, 9);
    let alone = service
        .decide(&request("edge", &[&[("user", &user)]], 0))
        .await
        .unwrap();
    assert!(is_ok(&alone));
    assert_eq!(alone.statuses[0].limit_remaining, 8);
}

#[tokio::test]
async fn memory_descriptors_are_decided_all_or_nothing() {
    all_or_nothing(service(MemoryStore::new())).await;
}

#[tokio::test]
async fn redis_descriptors_are_decided_all_or_nothing() {
    all_or_nothing(service(redis_store().await)).await;
}

// ---- hits_addend is the cost ----

async fn hits_are_the_cost(service: RlsService) {
    let user = unique("u");
    let one: &[&[(&str, &str)]] = &[&[("user", &user)]];
    let remaining = |r: &RateLimitResponse| r.statuses[0].limit_remaining;
    let r = service.decide(&request("edge", one, 4)).await.unwrap();
    assert!(is_ok(&r));
    assert_eq!(remaining(&r), 6);
    let r = service.decide(&request("edge", one, 4)).await.unwrap();
    assert_eq!(remaining(&r), 2);
    let r = service.decide(&request("edge", one, 4)).await.unwrap();
    assert!(!is_ok(&r), "4 more than 2 remaining must be denied");
    let r = service.decide(&request("edge", one, 2)).await.unwrap();
    assert!(is_ok(&r));
    assert_eq!(remaining(&r), 0);
}

#[tokio::test]
async fn memory_hits_addend_is_the_cost() {
    hits_are_the_cost(service(MemoryStore::new())).await;
}

#[tokio::test]
async fn redis_hits_addend_is_the_cost() {
    hits_are_the_cost(service(redis_store().await)).await;
}

#[tokio::test]
async fn a_descriptors_own_hits_addend_is_its_cost_and_costs_must_agree() {
    let service = service(MemoryStore::new());
    let mut req = request("edge", &[&[("user", "ann")], &[("tenant", "t")]], 0);
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    let err = service.decide(&req).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
    assert!(err.message().contains("hits_addend"), "{}", err.message());
    req.descriptors[1].hits_addend = Some(UInt64Value { value: 3 });
    let r = service.decide(&req).await.unwrap();
    assert!(is_ok(&r));
    assert_eq!(r.statuses[0].limit_remaining, 7);
    assert_eq!(r.statuses[1].limit_remaining, 2);
}

#[tokio::test]
async fn a_cost_above_the_capacity_is_denied_and_charges_nothing() {
    let store = MemoryStore::new();
    let service = service(store.clone());
    let r = service
        .decide(&request("edge", &[&[("user", "ann")]], 11))
        .await
        .unwrap();
    assert!(!is_ok(&r), "a cost above the limit can never pass");
    assert_eq!(codes(&r), [OVER]);
    assert_eq!(store.len(), 0, "nothing charged");
    // u32::MAX hits: still a clean denial.
    let r = service
        .decide(&request("edge", &[&[("user", "ann")]], u32::MAX))
        .await
        .unwrap();
    assert!(!is_ok(&r));
}

// ---- what a status carries ----

#[tokio::test]
async fn statuses_carry_the_limit_remaining_and_reset() {
    let service = service(MemoryStore::new());
    let r = service
        .decide(&request(
            "edge",
            &[&[("path", "/login")], &[("nothing", "here")]],
            0,
        ))
        .await
        .unwrap();
    assert!(is_ok(&r));
    let limited = &r.statuses[0];
    let limit = limited.current_limit.as_ref().unwrap();
    assert_eq!(limit.name, "login");
    assert_eq!(limit.requests_per_unit, 3);
    assert_eq!(limit.unit, Unit::Hour as i32);
    assert_eq!(limited.limit_remaining, 2);
    let reset = limited.duration_until_reset.unwrap();
    assert!(reset.seconds > 0 && reset.seconds <= 3600, "{reset:?}");
    // A descriptor no rule limits: OK, no limit.
    assert_eq!(r.statuses[1].code, OK);
    assert!(r.statuses[1].current_limit.is_none());
    // A nested rule, other algorithms.
    let r = service
        .decide(&request(
            "edge",
            &[&[("tenant", "t1"), ("plan", "free")]],
            0,
        ))
        .await
        .unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, r.statuses[0].limit_remaining),
        (2, 1)
    );
}

#[tokio::test]
async fn a_repeated_descriptor_is_charged_once() {
    let service = service(MemoryStore::new());
    let r = service
        .decide(&request(
            "edge",
            &[&[("user", "ann")], &[("user", "ann")]],
            0,
        ))
        .await
        .unwrap();
    assert_eq!(codes(&r), [OK, OK]);
    assert_eq!(r.statuses[0].limit_remaining, 9);
    assert_eq!(r.statuses[1], r.statuses[0]);
}

#[tokio::test]
async fn shadow_mode_counts_but_never_denies() {
    let store = MemoryStore::new();
    let service = service(store.clone());
    let req = request("edge", &[&[("canary", "c")], &[("user", "ann")]], 0);
    let first = service.decide(&req).await.unwrap();
    assert!(is_ok(&first));
    assert_eq!(first.statuses[0].limit_remaining, 0);
    let second = service.decide(&req).await.unwrap();
    assert!(is_ok(&second), "a shadow rule never denies");
    assert_eq!(codes(&second), [OK, OK]);
    assert_eq!(second.statuses[1].limit_remaining, 8);
    assert!(store.len() >= 2, "the shadow rule is counted");
}

// ---- bad requests: a clear error, nothing charged, no state ----

#[tokio::test]
async fn bad_requests_are_invalid_arguments_and_leave_no_state() {
    let store = MemoryStore::new();
    let service = service(store.clone());
    let long = "v".repeat(portcullis_envoy::MAX_ENTRY_LEN + 1);
    let deep: Vec<(&str, &str)> = vec![("user", "x"); portcullis_envoy::MAX_ENTRIES + 1];
    let many: Vec<&[(&str, &str)]> = vec![&[("user", "x")]; portcullis_envoy::MAX_DESCRIPTORS + 1];
    let cases: Vec<(RateLimitRequest, &str)> = vec![
        (request("", &[&[("user", "x")]], 0), "domain is empty"),
        (request("nope", &[&[("user", "x")]], 0), "unknown domain"),
        (
            request(&"d".repeat(100_000), &[&[("user", "x")]], 0),
            "unknown domain",
        ),
        (request("edge", &[], 0), "no descriptors"),
        (request("edge", &many, 0), "descriptors in one request"),
        (request("edge", &[&[]], 0), "no entries"),
        (request("edge", &[&deep], 0), "entries, more than"),
        (request("edge", &[&[("user", &long)]], 0), "longer than"),
        (request("edge", &[&[("", "x")]], 0), "empty key"),
        // A bad descriptor after a good one: the good one is not charged.
        (
            request("edge", &[&[("user", "x")], &[("user", &long)]], 0),
            "longer than",
        ),
    ];
    for (req, says) in cases {
        let err = service.decide(&req).await.unwrap_err();
        assert_eq!(err.code(), GrpcCode::InvalidArgument, "{says}: {err:?}");
        assert!(err.message().contains(says), "{says}: {}", err.message());
        assert!(
            err.message().len() < 300,
            "the message echoes at most a clip"
        );
    }
    let mut negative = request("edge", &[&[("user", "x")]], 0);
    negative.descriptors[0].is_negative_hits = true;
    let err = service.decide(&negative).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
    assert_eq!(store.len(), 0, "no bad request left state");
    // Another client's decision is untouched.
    let r = service
        .decide(&request("edge", &[&[("user", "x")]], 0))
        .await
        .unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn values_and_keys_the_configuration_does_not_limit_grow_no_state() {
    let store = MemoryStore::new();
    let service = service(store.clone());
    for i in 0..500 {
        let value = format!("/random-{i}");
        let r = service
            .decide(&request(
                "edge",
                &[
                    &[("path", &value)],
                    &[(&format!("k{i}"), "v")],
                    &[("route", &value)],
                ],
                0,
            ))
            .await
            .unwrap();
        assert!(is_ok(&r));
        assert!(r.statuses.iter().all(|s| s.current_limit.is_none()));
    }
    assert_eq!(
        store.len(),
        0,
        "only configured keys and values create state"
    );
}

#[tokio::test]
async fn per_value_state_stays_within_the_stores_bound() {
    let store = MemoryStore::builder().max_keys(64).build();
    let service = service(store.clone());
    for i in 0..1_000 {
        let user = format!("user-{i}-{}", "x".repeat(i % 300));
        let r = service
            .decide(&request("edge", &[&[("user", &user)]], 0))
            .await
            .unwrap();
        assert!(is_ok(&r), "a fresh user has its limit");
    }
    assert!(store.len() <= 64, "{} subjects held", store.len());
}

// ---- live configuration ----

#[tokio::test]
async fn a_live_change_takes_effect_on_the_next_request() {
    let live = LiveConfig::new(Config::parse("a.toml", CONFIG).unwrap());
    let service = RlsService::builder(live.clone(), MemoryStore::new()).build();
    let req = request("edge", &[&[("route", "/x")]], 0);
    assert!(is_ok(&service.decide(&req).await.unwrap()));
    assert!(!is_ok(&service.decide(&req).await.unwrap()));
    live.replace(
        Config::parse(
            "b.toml",
            &CONFIG.replace(
                "limit = 1\nperiod = \"1h\"\n\n[[domains.descriptors]]\nkey = \"path\"",
                "limit = 3\nperiod = \"1h\"\n\n[[domains.descriptors]]\nkey = \"path\"",
            ),
        )
        .unwrap(),
    );
    // The same state, read through the new limit of 3: two more.
    assert!(is_ok(&service.decide(&req).await.unwrap()));
    assert!(is_ok(&service.decide(&req).await.unwrap()));
    assert!(!is_ok(&service.decide(&req).await.unwrap()));
    // A domain removed: refused.
    live.replace(Config::parse("c.toml", "[[domains]]\nname = \"other\"\n").unwrap());
    let err = service.decide(&req).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
}

#[tokio::test]
async fn a_config_file_reload_applies_valid_files_and_keeps_the_last_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.toml");
    std::fs::write(&path, "[[domains]]\nname = \"edge\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 1\nperiod = \"1h\"\n").unwrap();
    let file = ConfigFile::open(&path).unwrap();
    let service = RlsService::builder(file.live(), MemoryStore::new()).build();
    let req = request("edge", &[&[("k", "v")]], 0);
    assert!(is_ok(&service.decide(&req).await.unwrap()));
    assert!(!is_ok(&service.decide(&req).await.unwrap()));
    std::fs::write(&path, "[[domains]]\nname = \"edge\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 2\nperiod = \"1h\"\n").unwrap();
    assert!(file.reload().unwrap());
    assert!(!file.reload().unwrap(), "unchanged text");
    assert!(is_ok(&service.decide(&req).await.unwrap()));
    std::fs::write(&path, "[[domains]]\nname = \"edge\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 0\nperiod = \"1h\"\n").unwrap();
    let err = file.reload().unwrap_err().to_string();
    assert!(err.contains("envoy.toml:5"), "{err}");
    // The limit of 2 stays in force.
    assert!(!is_ok(&service.decide(&req).await.unwrap()));
}

// ---- the store down ----

/// A `redis-server` of the test's own on a free port, killed when dropped.
struct OwnRedis {
    child: std::process::Child,
    port: u16,
}

impl OwnRedis {
    fn start() -> Self {
        let server = std::env::var("PORTCULLIS_REDIS_SERVER").unwrap_or_else(|_| {
            panic!(
                "PORTCULLIS_REDIS_SERVER is not set: run these tests with `cargo xtask test`, \
                 which finds redis-server"
            )
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(server)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must start");
        Self { child, port }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_store_that_is_down_is_answered_unavailable() {
    let mut redis = OwnRedis::start();
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let mut store = None;
    for _ in 0..100 {
        match RedisStore::builder()
            .url(&url)
            .timeout(Duration::from_millis(500))
            .build()
            .await
        {
            Ok(built) => {
                store = Some(built);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let service = service(store.expect("the test's redis-server must accept connections"));
    let req = request("edge", &[&[("user", "ann")]], 0);
    assert!(is_ok(&service.decide(&req).await.unwrap()));
    redis.child.kill().unwrap();
    redis.child.wait().unwrap();
    let err = service.decide(&req).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::Unavailable, "{err:?}");
    assert!(
        err.message().contains("failure_mode_deny"),
        "{}",
        err.message()
    );
}

// ---- Redis Cluster: one subject per atomic check ----

#[tokio::test]
async fn on_a_cluster_one_descriptor_is_exact_and_several_subjects_are_refused_clearly() {
    let urls = std::env::var("PORTCULLIS_REDIS_CLUSTER_URLS").expect(
        "PORTCULLIS_REDIS_CLUSTER_URLS is not set: run these tests with `cargo xtask test`",
    );
    let store = RedisStore::builder()
        .cluster(urls.split(','))
        .prefix(unique("envoy-cluster"))
        .build()
        .await
        .expect("the Cluster at PORTCULLIS_REDIS_CLUSTER_URLS must answer");
    let service = service(store);
    let user = unique("u");
    let one = request("edge", &[&[("user", &user)]], 0);
    for remaining in (0..10).rev() {
        let r = service.decide(&one).await.unwrap();
        assert!(is_ok(&r));
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    assert!(!is_ok(&service.decide(&one).await.unwrap()));
    let two = request("edge", &[&[("user", &unique("u"))], &[("route", "/x")]], 0);
    let err = service.decide(&two).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("Cluster"), "{}", err.message());
}

#[tokio::test]
async fn rate_limit_headers_name_each_limit_checked() {
    let config = Config::parse("rls-test.toml", CONFIG).unwrap();
    let service = RlsService::builder(LiveConfig::new(config), MemoryStore::new())
        .rate_limit_headers(true)
        .build();
    let r = service
        .decide(&request(
            "edge",
            &[&[("path", "/login")], &[("nothing", "x")]],
            0,
        ))
        .await
        .unwrap();
    let fields: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(fields[0], ("ratelimit-policy", "\"login\";q=3;w=3600"));
    assert_eq!(fields[1].0, "ratelimit");
    assert!(
        fields[1].1.starts_with("\"login\";r=2;t="),
        "{}",
        fields[1].1
    );
    // Off by default.
    let plain = service_without_headers()
        .decide(&request("edge", &[&[("path", "/login")]], 0))
        .await
        .unwrap();
    assert!(plain.response_headers_to_add.is_empty());
}

fn service_without_headers() -> RlsService {
    service(MemoryStore::new())
}
