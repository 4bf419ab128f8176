//! No subject's traffic or stored value lifts another's limit, over real
//! HTTP against an app like the examples, with the layer's default
//! settings (fail-open, default timeout and circuit breaker):
//!
//! - a flood of distinct API keys into a full `MemoryStore` (evicting, the
//!   default, and denying);
//! - the same against a Redis at `maxmemory` with `noeviction` (a private
//!   server, `OwnedRedis`);
//! - a corrupt value planted under one client's key in Redis.
//!
//! Held subjects keep exactly their remaining permits, a fresh subject gets
//! at most its limit or is denied, no request is passed undecided (every
//! answer carries `RateLimit` or is a 429), and the breaker stays closed.

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use http::HeaderName;
use portcullis::redis::RedisStore;
use portcullis::tower::{ApiKey, Header, KeyExtractor, RateLimitLayer};
use portcullis::{MemoryStore, Policy, Store, WhenFull};
use portcullis_tests::{redis_url, unique_prefix, OwnedRedis};

/// The app of the examples: one route, limited per API key to 5 per hour
/// (per hour rather than the report's per minute: nothing refills or
/// expires during a slow run, so every count below is exact), every other
/// setting at its default.
async fn serve<St: Store, K: KeyExtractor>(store: St, key: K) -> SocketAddr {
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_hour(5).name("api").build().unwrap())
        .key(key)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// What one request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Admitted, with `RateLimit` headers: decided.
    Admitted,
    /// 429 (or 503) with `Retry-After`.
    Denied,
    /// 200 without `RateLimit`: let through undecided.
    Undecided,
}

async fn ask(client: &reqwest::Client, addr: SocketAddr, header: &str, value: &str) -> Answer {
    let response = client
        .get(format!("http://{addr}/"))
        .header(header, value)
        .send()
        .await
        .expect("the server answers");
    let status = response.status();
    let decided = response.headers().contains_key("ratelimit");
    let retry_after = response.headers().contains_key("retry-after");
    match status.as_u16() {
        200 if decided => Answer::Admitted,
        200 => Answer::Undecided,
        429 | 503 => {
            assert!(retry_after, "a denial without Retry-After ({status})");
            Answer::Denied
        }
        other => panic!("unexpected status {other}"),
    }
}

/// Asks until denied (at most `limit + 3` times); returns how many were
/// admitted, failing on any undecided pass.
async fn admitted(client: &reqwest::Client, addr: SocketAddr, header: &str, value: &str) -> u32 {
    let mut admitted = 0;
    for _ in 0..8 {
        match ask(client, addr, header, value).await {
            Answer::Admitted => admitted += 1,
            Answer::Denied => return admitted,
            Answer::Undecided => panic!("{value} was let through undecided"),
        }
    }
    panic!("{value} was never denied")
}

/// Sends one request per new key, `concurrency` at a time; returns the
/// answers.
async fn flood(addr: SocketAddr, header: &'static str, keys: usize) -> Vec<Answer> {
    let client = reqwest::Client::new();
    let mut answers = Vec::with_capacity(keys);
    for chunk in (0..keys).collect::<Vec<_>>().chunks(50) {
        let batch = chunk.iter().map(|i| {
            let client = client.clone();
            async move { ask(&client, addr, header, &format!("flood-key-{i}")).await }
        });
        answers.extend(futures::future::join_all(batch).await);
    }
    answers
}

/// The held user spends 4 of 5, the flood comes, then: held users keep
/// exactly their one permit, fresh users get at most their limit, nothing
/// is undecided. Returns the flood's answers.
async fn flood_scenario(addr: SocketAddr, header: &'static str, keys: usize) -> Vec<Answer> {
    let client = reqwest::Client::new();
    for _ in 0..4 {
        assert_eq!(
            ask(&client, addr, header, "held-user").await,
            Answer::Admitted
        );
    }
    let answers = flood(addr, header, keys).await;
    assert!(
        !answers.contains(&Answer::Undecided),
        "{} flood requests passed undecided",
        answers.iter().filter(|a| **a == Answer::Undecided).count()
    );
    // Exactly the one permit left: neither lifted nor lost.
    assert_eq!(admitted(&client, addr, header, "held-user").await, 1);
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_into_a_full_memory_store_lifts_no_limit() {
    let store = MemoryStore::builder().max_keys(1_000).build();
    let addr = serve(store, ApiKey::new()).await;
    let answers = flood_scenario(addr, "x-api-key", 2_000).await;
    // Evicting (the default): every fresh key is decided and admitted.
    assert!(answers.iter().all(|a| *a == Answer::Admitted));
    let client = reqwest::Client::new();
    assert_eq!(admitted(&client, addr, "x-api-key", "fresh-user").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_into_a_denying_memory_store_is_denied_not_passed() {
    let store = MemoryStore::builder()
        .max_keys(1_000)
        .when_full(WhenFull::Deny)
        .build();
    let addr = serve(store, ApiKey::new()).await;
    let answers = flood_scenario(addr, "x-api-key", 2_000).await;
    let denied = answers.iter().filter(|a| **a == Answer::Denied).count();
    // 999 fit beside the held user; the rest are denied.
    assert_eq!(denied, 2_000 - 999);
    let client = reqwest::Client::new();
    assert_eq!(admitted(&client, addr, "x-api-key", "fresh-user").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_into_a_redis_at_maxmemory_lifts_no_limit() {
    let server = OwnedRedis::start(&["--maxmemory-policy", "noeviction"]);
    let store = RedisStore::builder()
        .url(server.url())
        .build()
        .await
        .unwrap();
    let addr = serve(store, ApiKey::new()).await;
    let client = reqwest::Client::new();
    // A second held user, fully spent before the server fills up.
    assert_eq!(admitted(&client, addr, "x-api-key", "spent-user").await, 5);
    for _ in 0..4 {
        assert_eq!(
            ask(&client, addr, "x-api-key", "held-user").await,
            Answer::Admitted
        );
    }
    // Fill the server with 4 MiB, then cap it at 3 MB: firmly past
    // maxmemory (client buffers come and go by tens of kilobytes, so a
    // server filled just to its limit would take some writes and refuse
    // others). CONFIG SET is for this private server only.
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let fillers = 64;
    for i in 0..fillers {
        let _: () = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(vec![b'x'; 64 << 10])
            .query(&mut raw)
            .unwrap();
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("3mb")
        .query(&mut raw)
        .unwrap();
    let refused: redis::RedisResult<()> = redis::cmd("SET").arg("probe").arg("1").query(&mut raw);
    assert!(
        refused.as_ref().is_err_and(|e| e.code() == Some("OOM")),
        "the server should be out of memory: {refused:?}"
    );
    // 200 new keys: each needs a key Redis has no memory for: denied (the
    // answer of a full MemoryStore that denies), never passed.
    let answers = flood(addr, "x-api-key", 200).await;
    assert!(answers.iter().all(|a| *a == Answer::Denied), "{answers:?}");
    // Held users are still checked exactly: one permit, and none. (Redis
    // 6.2 has no allow-oom scripts: a full 6.2 refuses every subject, held
    // or new, and passes none undecided.)
    let held_left = if portcullis_tests::server_has_functions() {
        1
    } else {
        0
    };
    assert_eq!(
        admitted(&client, addr, "x-api-key", "held-user").await,
        held_left
    );
    assert_eq!(admitted(&client, addr, "x-api-key", "spent-user").await, 0);
    assert_eq!(admitted(&client, addr, "x-api-key", "fresh-user").await, 0);
    // Memory comes back: new subjects are stored again.
    let keys: Vec<String> = (0..fillers).map(|i| format!("filler:{i}")).collect();
    portcullis_tests::reliability::make_room(&server.url(), &keys).await;
    assert_eq!(admitted(&client, addr, "x-api-key", "fresh-user").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_value_in_redis_changes_no_other_subjects_limit() {
    let store = RedisStore::builder()
        .url(redis_url())
        .prefix(unique_prefix("corrupt"))
        .build()
        .await
        .unwrap();
    // A value of the wrong type under mallory's key (a hash where the
    // script keeps a string). Whatever the store makes of it (it may count
    // as absent, or fail mallory's checks), it is mallory's alone.
    let bad_key = store.key_for("mallory", "api");
    let mut raw = redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&bad_key)
        .arg("planted")
        .arg("1")
        .query(&mut raw)
        .unwrap();
    let _: () = redis::cmd("EXPIRE")
        .arg(&bad_key)
        .arg(600)
        .query(&mut raw)
        .unwrap();
    let addr = serve(store, Header::new(HeaderName::from_static("x-user"))).await;
    let client = reqwest::Client::new();
    let users = ["alice", "bob", "carol"];
    let mut admitted = [0; 3];
    let mut mallory_admitted = 0;
    for round in 0..12 {
        // Mallory's own requests are decided as a fresh subject's, or, if
        // her value makes her checks fail, answered by the failure policy
        // (fail-open: through, undecided) ...
        if round == 6 {
            // ... planted again, as a string that does not parse.
            let _: () = redis::cmd("SET")
                .arg(&bad_key)
                .arg("gcra:not-a-number")
                .arg("EX")
                .arg(600)
                .query(&mut raw)
                .unwrap();
        }
        if ask(&client, addr, "x-user", "mallory").await == Answer::Admitted {
            mallory_admitted += 1;
        }
        // ... and nobody else's decision changes.
        for (user, admitted) in users.iter().zip(&mut admitted) {
            match ask(&client, addr, "x-user", user).await {
                Answer::Admitted => *admitted += 1,
                Answer::Denied => {}
                Answer::Undecided => panic!("{user} passed undecided in round {round}"),
            }
        }
    }
    assert_eq!(admitted, [5, 5, 5]);
    // A value that does not parse counts as absent: at most a fresh limit
    // for each plant.
    assert!(
        mallory_admitted <= 10,
        "mallory admitted {mallory_admitted}"
    );
    let _: () = redis::cmd("DEL").arg(&bad_key).query(&mut raw).unwrap();
}
