//! Start-up on a full Redis (issue 20): a store built against a server at
//! `maxmemory` with `noeviction` that never loaded the function library
//! builds, runs its checks as scripts (`EVALSHA`, which Redis loads even
//! when full), decides subjects Redis holds exactly and refuses new ones
//! as `OutOfMemory`; once memory is freed it loads the library and uses
//! Functions again. The same for one full node of a Cluster, and through
//! the layer with its default settings (on Redis 6.2, which has neither
//! Functions nor allow-oom scripts, only the layer's test runs: the store
//! builds, and a full server refuses every subject).

use crate::redis_common;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use portcullis::tower::{Header, RateLimitLayer};
use portcullis_core::{Policy, Store, StoreError};
use portcullis_redis::{CallPath, RedisStore};
use portcullis_tests::reliability::{admin, command, crc16_slot, subjects_in_slot, OwnedCluster};
use portcullis_tests::{unique_prefix, OwnedRedis};
use tower::ServiceExt as _;

fn policy() -> Policy {
    Policy::per_hour(5).name("api").build().unwrap()
}

/// Fills the server at `url` with 4 MiB of keys tagged `{tag}` (so that on
/// a Cluster node they belong to a slot it serves), then caps it at 3 MB:
/// firmly past `maxmemory`, so every new key is refused.
async fn fill(url: &str, tag: &str) -> Vec<String> {
    let mut connection = admin(url).await;
    let filler = "x".repeat(64 << 10);
    let keys: Vec<String> = (0..64).map(|i| format!("filler:{{{tag}}}:{i}")).collect();
    for key in &keys {
        let () = command(&mut connection, &["SET", key, &filler])
            .await
            .expect("SET filler");
    }
    let () = command(&mut connection, &["CONFIG", "SET", "maxmemory", "3mb"])
        .await
        .expect("CONFIG SET maxmemory");
    let refused: redis::RedisResult<()> =
        command(&mut connection, &["SET", &format!("probe:{{{tag}}}"), "1"]).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.code() == Some("OOM")),
        "the server should be out of memory: {refused:?}"
    );
    keys
}

async fn free(url: &str, keys: &[String]) {
    portcullis_tests::reliability::make_room(url, keys).await;
}

async fn flush_functions(url: &str) {
    let mut connection = admin(url).await;
    let () = command(&mut connection, &["FUNCTION", "FLUSH"])
        .await
        .expect("FUNCTION FLUSH");
}

/// `FUNCTION LOAD`s the server at `url` was sent (run, rejected or failed:
/// `INFO commandstats`).
async fn function_loads(url: &str) -> u64 {
    command_calls(url, "function|load").await
}

/// How many times the server at `url` was sent `name` (run, rejected or
/// failed: `INFO commandstats`).
async fn command_calls(url: &str, name: &str) -> u64 {
    let mut connection = admin(url).await;
    let info: String = command(&mut connection, &["INFO", "commandstats"])
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{name}:");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map_or(0, |fields| {
            fields
                .split(',')
                .filter_map(|field| field.split_once('='))
                .filter(|(name, _)| matches!(*name, "calls" | "rejected_calls" | "failed_calls"))
                .filter_map(|(_, value)| value.parse::<u64>().ok())
                .sum()
        })
}

async fn library_loaded(url: &str, name: &str) -> bool {
    let mut connection = admin(url).await;
    let list: redis::Value = command(&mut connection, &["FUNCTION", "LIST"])
        .await
        .expect("FUNCTION LIST");
    format!("{list:?}").contains(name)
}

async fn remaining(store: &RedisStore, subject: &str) -> u64 {
    let verdict = store
        .check(subject, &[policy()], 1)
        .await
        .unwrap_or_else(|e| panic!("check of {subject}: {e}"));
    assert!(verdict.is_allowed(), "{subject}: {verdict:?}");
    verdict.decisions()[0].remaining()
}

/// Checks `subject` (held, with permits to spare) until the store is back
/// on Functions: one check per [`LIBRARY_RETRY`](portcullis_redis) interval
/// tries to load the library. Bounded: 100 checks 100 ms apart.
async fn until_functions(store: &RedisStore, subject: &str) -> u64 {
    let mut admitted = 0;
    for _ in 0..100 {
        let verdict = store.check(subject, &[policy()], 1).await.unwrap();
        admitted += u64::from(verdict.is_allowed());
        if store.call_path() == CallPath::Functions {
            return admitted;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the store did not return to Redis Functions after memory was freed");
}

/// The app of the examples over `store`: one route, limited per `x-user`
/// by [`policy`], every other setting at its default.
fn app(store: RedisStore) -> Router {
    let layer = RateLimitLayer::builder(store)
        .policy(policy())
        .key(Header::new(http::HeaderName::from_static("x-user")))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// One request as `user`: its status, and whether it carries `RateLimit`
/// (it was decided).
async fn ask(app: &Router, user: &str) -> (StatusCode, bool) {
    let request = Request::get("/")
        .header("x-user", user)
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    (
        response.status(),
        response.headers().contains_key("ratelimit"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_builds_on_a_full_redis_and_loads_the_library_once_there_is_room() {
    let server = OwnedRedis::start(&["--maxmemory-policy", "noeviction"]);
    let prefix = unique_prefix("full-start");
    let build = || async {
        RedisStore::builder()
            .url(server.url())
            .prefix(prefix.clone())
            .timeout(redis_common::TEST_TIMEOUT)
            .build()
            .await
    };
    // A subject held before the server filled up, by an earlier instance;
    // then the library is gone (as after a restart without persistence).
    let earlier = build().await.unwrap();
    assert_eq!(remaining(&earlier, "held").await, 4);
    drop(earlier);
    flush_functions(&server.url()).await;
    let fillers = fill(&server.url(), "fill").await;

    let store = build()
        .await
        .unwrap_or_else(|e| panic!("build() on a full Redis: {e}"));
    assert_eq!(store.call_path(), CallPath::Evalsha);
    assert!(!library_loaded(&server.url(), store.library_name()).await);
    // Held: exact. New: refused as out of memory, not as unavailable.
    assert_eq!(remaining(&store, "held").await, 3);
    let fresh = store.check("fresh", &[policy()], 1).await;
    assert!(
        matches!(&fresh, Err(StoreError::OutOfMemory { .. })),
        "{fresh:?}"
    );
    assert!(!fresh.unwrap_err().is_store_wide());
    // A peek, two GCRA policies and a post-charge run as scripts too.
    let peek = store.check("held", &[policy()], 0).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 3);

    free(&server.url(), &fillers).await;
    let admitted = until_functions(&store, "held").await;
    assert!(library_loaded(&server.url(), store.library_name()).await);
    // Every check on the way was decided exactly, on either path.
    let left = 3 - admitted.min(3);
    let verdict = store.check("held", &[policy()], 0).await.unwrap();
    assert_eq!(verdict.decisions()[0].remaining(), left);
    assert_eq!(remaining(&store, "fresh").await, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_layer_with_default_settings_starts_on_a_full_redis() {
    let server = OwnedRedis::start(&["--maxmemory-policy", "noeviction"]);
    let prefix = unique_prefix("full-layer");
    let earlier = RedisStore::builder()
        .url(server.url())
        .prefix(prefix.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(remaining(&earlier, "held-user").await, 4);
    drop(earlier);
    let functions = portcullis_tests::server_has_functions();
    if functions {
        flush_functions(&server.url()).await;
    }
    fill(&server.url(), "fill").await;

    let store = RedisStore::builder()
        .url(server.url())
        .prefix(prefix)
        .build()
        .await
        .unwrap_or_else(|e| panic!("build() on a full Redis: {e}"));
    let app = app(store);
    // The held user has exactly four permits left, each decided. (Redis 6.2
    // has no allow-oom scripts: while full it refuses every subject.)
    for _ in 0..if functions { 4 } else { 0 } {
        assert_eq!(ask(&app, "held-user").await, (StatusCode::OK, true));
    }
    assert_eq!(
        ask(&app, "held-user").await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "the request after the held user's last permit"
    );
    // New users cannot be stored: denied, never passed undecided, however
    // many (a breaker opened by them would pass them through fail-open).
    for _ in 0..20 {
        assert_eq!(ask(&app, "new-user").await.0, StatusCode::TOO_MANY_REQUESTS);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_node_full_before_it_ever_loaded_the_library() {
    let cluster = OwnedCluster::start(3, 0).await;
    let nodes = cluster.admin().nodes().await;
    let full = nodes.iter().find(|n| n.master).expect("a master").clone();
    let other = nodes
        .iter()
        .find(|n| n.master && n.id != full.id)
        .expect("a second master")
        .clone();
    let slot_of = |node: &portcullis_tests::reliability::ClusterNode| node.slots[0].0;
    let held = subjects_in_slot(slot_of(&full), 2, "held");
    let elsewhere = subjects_in_slot(slot_of(&other), 1, "other").remove(0);
    let prefix = unique_prefix("full-cluster");
    let build = || async {
        RedisStore::builder()
            .cluster(cluster.urls())
            .prefix(prefix.clone())
            .timeout(redis_common::TEST_TIMEOUT)
            .build()
            .await
    };
    let earlier = build().await.unwrap();
    assert_eq!(remaining(&earlier, &held[0]).await, 4);
    drop(earlier);
    for node in &nodes {
        flush_functions(&node.url).await;
    }
    let tag = &subjects_in_slot(slot_of(&full), 1, "fill")[0];
    assert_eq!(crc16_slot(tag.as_bytes()), slot_of(&full));
    let fillers = fill(&full.url, tag).await;

    let store = build()
        .await
        .unwrap_or_else(|e| panic!("build() on a Cluster with a full node: {e}"));
    // Through the layer with its default settings: the held user is
    // decided (one permit spent), the new one denied, never passed.
    let app = app(store.clone());
    assert_eq!(ask(&app, &held[0]).await, (StatusCode::OK, true));
    assert_eq!(ask(&app, &held[1]).await.0, StatusCode::TOO_MANY_REQUESTS);
    // The full node: held exact, new refused as out of memory.
    assert_eq!(remaining(&store, &held[0]).await, 2);
    let fresh = store.check(&held[1], &[policy()], 1).await;
    assert!(
        matches!(&fresh, Err(StoreError::OutOfMemory { .. })),
        "{fresh:?}"
    );
    // Another node with room stores new subjects.
    assert_eq!(remaining(&store, &elsewhere).await, 4);
    assert!(!library_loaded(&full.url, store.library_name()).await);

    // Only the full node's keys wait: checks on the other nodes succeed on
    // Functions without sending the full node's keys back to a library it
    // cannot load, so its FUNCTION LOAD attempts stay at about one per
    // retry interval however the checks alternate (no flapping).
    let loads = function_loads(&full.url).await;
    let fcalls = command_calls(&other.url, "fcall").await;
    let started = std::time::Instant::now();
    for _ in 0..30 {
        store.check(&elsewhere, &[policy()], 1).await.unwrap();
        store.check(&held[0], &[policy()], 1).await.unwrap();
    }
    assert_eq!(
        command_calls(&other.url, "fcall").await - fcalls,
        30,
        "every check on a node with room stays on Functions while another node is full"
    );
    let attempts = function_loads(&full.url).await - loads;
    let retries = started.elapsed().as_secs() + 2;
    assert!(
        attempts <= retries,
        "{attempts} FUNCTION LOADs on the full node in {:?}: at most one per second (and the \
         first) was expected",
        started.elapsed()
    );

    free(&full.url, &fillers).await;
    // The full node's keys try Functions again once a second.
    until_functions(&store, &held[0]).await;
    // Back on Functions: the full node loads the library at its next check.
    let verdict = store.check(&held[1], &[policy()], 1).await.unwrap();
    assert_eq!(verdict.decisions()[0].remaining(), 4);
    assert!(library_loaded(&full.url, store.library_name()).await);
}
