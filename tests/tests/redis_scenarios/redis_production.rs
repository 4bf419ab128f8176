//! Redis as production runs it (issue 9): TLS with and without client
//! certificates, an ACL user allowed only `ACL_COMMANDS`, password-only
//! URLs, an application's own pool and clients, and the errors `build()`
//! gives when credentials, permissions or the address are wrong.
//!
//! The servers come from `cargo xtask test` (`PORTCULLIS_REDIS_TLS_URL`,
//! `PORTCULLIS_REDIS_MTLS_URL`, `PORTCULLIS_REDIS_ACL_URL`, …); a missing
//! variable fails the test.

use crate::redis_common;

use std::error::Error as _;
use std::time::Duration;

use portcullis_core::{Algorithm, Clock as _, ManualClock, Policy, Store, StoreError};
use portcullis_redis::{BuildError, RedisStore, RedisStoreBuilder, ACL_COMMANDS};
use portcullis_tests::unique_prefix;
use redis_common::{client, manual_clock, TEST_TIMEOUT};

fn policies() -> Vec<Policy> {
    Algorithm::ALL
        .iter()
        .enumerate()
        .map(|(i, algorithm)| {
            Policy::per(5, Duration::from_secs(10))
                .algorithm(*algorithm)
                .name(format!("p{i}"))
                .build()
                .unwrap()
        })
        .collect()
}

/// Runs the same fixed sequence of checks (every algorithm, costs 1 to 3,
/// time moving on a manual clock) and returns every decision as text.
async fn decisions(builder: RedisStoreBuilder, start_micros: u64) -> Vec<String> {
    let clock = ManualClock::new(start_micros);
    let store = builder
        .prefix(unique_prefix("prod"))
        .timeout(TEST_TIMEOUT)
        .clock(client(&clock))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .unwrap_or_else(|e| panic!("the store should build: {e:#?}"));
    let policies = policies();
    let mut out = Vec::new();
    for step in 0..24_u64 {
        let subject = format!("user-{}", step % 3);
        let cost = 1 + step % 3;
        let verdict = store
            .check(&subject, &policies, cost)
            .await
            .unwrap_or_else(|e| panic!("check {step}: {e:#?}"));
        out.push(format!("{step}: {:?}", verdict.decisions()));
        for policy in &policies {
            let single = store
                .check(&subject, std::slice::from_ref(policy), cost)
                .await
                .unwrap_or_else(|e| panic!("check {step} {}: {e:#?}", policy.name()));
            out.push(format!(
                "{step} {}: {:?}",
                policy.name(),
                single.decisions()
            ));
        }
        clock.advance(Duration::from_millis(700));
    }
    store.reset("user-0", &policies).await.unwrap();
    out
}

fn tcp() -> RedisStoreBuilder {
    RedisStore::builder().url(portcullis_tests::acl_url())
}

fn tls() -> RedisStoreBuilder {
    RedisStore::builder()
        .url(portcullis_tests::tls_url())
        .tls_ca(portcullis_tests::tls_ca())
}

fn mtls() -> RedisStoreBuilder {
    let (cert, key) = portcullis_tests::tls_client_cert();
    RedisStore::builder()
        .url(portcullis_tests::mtls_url())
        .tls_ca(portcullis_tests::tls_ca())
        .tls_client_cert(cert, key)
}

/// One start time for both runs of a comparison (ahead of Redis' clock,
/// see `manual_clock`), on a whole minute so windows align alike.
fn start() -> u64 {
    let now = manual_clock().now_micros();
    now - now % 60_000_000
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_over_tls_equal_those_over_tcp() {
    let start = start();
    let over_tcp = decisions(tcp(), start).await;
    let over_tls = decisions(tls(), start).await;
    assert_eq!(over_tcp.len(), 24 * (1 + Algorithm::ALL.len()));
    assert_eq!(over_tls, over_tcp);
    // Something was denied along the way (the sequence is not trivial).
    assert!(
        over_tcp.iter().any(|d| d.contains("allowed: false")),
        "{over_tcp:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_over_a_tls_cluster_equal_those_over_tcp() {
    let start = start();
    let over_tls = decisions(
        RedisStore::builder()
            .cluster(portcullis_tests::tls_cluster_urls())
            .tls_ca(portcullis_tests::tls_ca()),
        start,
    )
    .await;
    assert_eq!(over_tls, decisions(tcp(), start).await);
}

/// The TLS Cluster's URLs as the ACL user `user` (the TLS servers' password).
fn tls_cluster_as(user: &str) -> Vec<String> {
    let tls_url = portcullis_tests::tls_url();
    let (head, _) = tls_url.rsplit_once('@').unwrap();
    let password = head.rsplit_once(':').unwrap().1;
    portcullis_tests::tls_cluster_urls()
        .iter()
        .map(|url| {
            format!(
                "rediss://{user}:{password}@{}",
                url.rsplit_once('@').unwrap().1
            )
        })
        .collect()
}

/// On a Cluster an ACL user also needs `ACL_CLUSTER_COMMANDS` (the Cluster
/// client reads `CLUSTER SLOTS`); without them `build()` names the rule.
#[tokio::test(flavor = "multi_thread")]
async fn an_acl_user_works_on_a_tls_cluster() {
    let start = start();
    let over_tls = decisions(
        RedisStore::builder()
            .cluster(tls_cluster_as("portcullis"))
            .tls_ca(portcullis_tests::tls_ca()),
        start,
    )
    .await;
    assert_eq!(over_tls, decisions(tcp(), start).await);

    let error = build_error(
        RedisStore::builder()
            .cluster(tls_cluster_as("portcullis-no-cluster"))
            .tls_ca(portcullis_tests::tls_ca()),
    )
    .await;
    match &error {
        BuildError::Permission { permission, .. } => {
            // Redis 6.2 names only the command in an ACL refusal of a
            // subcommand ("the 'cluster' command or its subcommand").
            if portcullis_tests::server_has_functions() {
                assert_eq!(permission, "+cluster|slots");
            } else {
                assert_eq!(permission, "+cluster");
            }
            assert!(portcullis_redis::ACL_CLUSTER_COMMANDS.contains(permission.as_str()));
        }
        other => panic!("expected Permission, got {other:#?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_over_mutual_tls_equal_those_over_tcp() {
    let start = start();
    assert_eq!(
        decisions(mtls(), start).await,
        decisions(tcp(), start).await
    );
}

/// The error chain down to redis-rs's error, as `{:#}` / anyhow would show.
fn chain(error: &dyn std::error::Error) -> Vec<String> {
    let mut out = vec![error.to_string()];
    let mut source = error.source();
    while let Some(error) = source {
        out.push(error.to_string());
        source = error.source();
    }
    out
}

fn has_redis_source(error: &BuildError) -> bool {
    let mut source = error.source();
    while let Some(error) = source {
        if error
            .downcast_ref::<portcullis_redis::RedisCause>()
            .is_some()
        {
            return true;
        }
        source = error.source();
    }
    false
}

async fn build_error(builder: RedisStoreBuilder) -> BuildError {
    builder
        .prefix(unique_prefix("prod-err"))
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("build() should refuse this configuration")
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_without_a_client_certificate_fails_at_build() {
    let error = build_error(
        RedisStore::builder()
            .url(portcullis_tests::mtls_url())
            .tls_ca(portcullis_tests::tls_ca()),
    )
    .await;
    assert!(matches!(error, BuildError::Connect { .. }), "{error:#?}");
    assert!(has_redis_source(&error), "{:?}", chain(&error));
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_an_untrusted_ca_fails_at_build() {
    // Without .tls_ca the system roots do not know the test CA.
    let error = build_error(RedisStore::builder().url(portcullis_tests::tls_url())).await;
    assert!(matches!(error, BuildError::Connect { .. }), "{error:#?}");
    assert!(error.to_string().contains("tls_ca"), "{error}");
    assert!(has_redis_source(&error), "{:?}", chain(&error));
    assert!(
        chain(&error).iter().any(|e| e.contains("certificate")),
        "{:?}",
        chain(&error)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_fails_at_build_naming_the_user() {
    let url = portcullis_tests::acl_url();
    let (head, host) = url.rsplit_once('@').unwrap();
    let (user_part, _password) = head.rsplit_once(':').unwrap();
    let wrong = format!("{user_part}:not-the-password@{host}");
    let error = build_error(RedisStore::builder().url(&wrong)).await;
    match &error {
        BuildError::Auth { user, .. } => assert_eq!(user, "portcullis"),
        other => panic!("expected Auth, got {other:#?}"),
    }
    let text = error.to_string();
    assert!(text.contains("password"), "{text}");
    // Nowhere in the chain (the redis-rs error is the source).
    assert!(
        !chain(&error).iter().any(|e| e.contains("not-the-password")),
        "the password leaked: {:?}",
        chain(&error)
    );
    assert!(has_redis_source(&error), "{:?}", chain(&error));

    // Over TLS, and with the setter instead of the URL: the same error.
    let error = build_error(tls().password("not-the-password")).await;
    assert!(matches!(error, BuildError::Auth { .. }), "{error:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_only_url_and_the_setters_work() {
    let admin = portcullis_tests::acl_admin_url();
    assert!(admin.starts_with("redis://:"), "{admin}");
    let store = RedisStore::builder()
        .url(&admin)
        .prefix(unique_prefix("prod-pw"))
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap();
    assert!(store.check("u", &policies(), 1).await.unwrap().is_allowed());

    // The same credentials given through the setters, none in the URL.
    let url = portcullis_tests::acl_url();
    let (head, host) = url.rsplit_once('@').unwrap();
    let (_user, password) = head.trim_start_matches("redis://").split_once(':').unwrap();
    let builder = RedisStore::builder()
        .url(format!("redis://{host}"))
        .username("portcullis")
        .password(password)
        .prefix(unique_prefix("prod-setters"))
        .timeout(TEST_TIMEOUT);
    assert!(!format!("{builder:?}").contains(password));
    let store = builder.build().await.unwrap();
    assert!(!format!("{store:?}").contains(password));
    assert!(store.check("u", &policies(), 1).await.unwrap().is_allowed());

    // Without any password the server refuses: an Auth error at build().
    let error = build_error(RedisStore::builder().url(format!("redis://{host}"))).await;
    assert!(matches!(error, BuildError::Auth { .. }), "{error:#?}");
}

/// Creates an ACL user on the ACL server with `rules`, returning its URL.
fn acl_user(name: &str, rules: &[&str]) -> String {
    let admin = portcullis_tests::acl_admin_url();
    let mut connection = redis_common::raw(&admin);
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(">pw");
    for rule in rules {
        setuser.arg(*rule);
    }
    let () = setuser.query(&mut connection).unwrap();
    let host = admin.rsplit_once('@').unwrap().1;
    format!("redis://{name}:pw@{host}")
}

async fn permission_error(prefix: &str, rules: &[&str]) -> (String, BuildError) {
    let user = format!("pc-noperm-{}", &prefix[prefix.len() - 6..]);
    let url = acl_user(&user, rules);
    let error = RedisStore::builder()
        .url(url)
        .prefix(prefix)
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .expect_err("a user without a needed permission must fail at build()");
    (user, error)
}

/// All of portcullis's rules but `without`.
fn rules_without<'a>(prefix_rule: &'a str, without: &str) -> Vec<&'a str> {
    let mut rules = vec![prefix_rule];
    rules.extend(ACL_COMMANDS.split(' ').filter(|rule| *rule != without));
    rules
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_permission_fails_at_build_naming_it() {
    for missing in ACL_COMMANDS.split(' ') {
        let prefix = unique_prefix("prod-acl");
        let key_rule = format!("~{prefix}:*");
        let (user, error) = permission_error(&prefix, &rules_without(&key_rule, missing)).await;
        eprintln!("without {missing}: {error}");
        match &error {
            BuildError::Permission {
                user: named,
                permission,
                ..
            } => {
                assert_eq!(named, &user);
                // Redis 6.2 names only the command of a refused
                // subcommand: `+script` for `+script|load`.
                let named_command = missing.split('|').next().unwrap_or(missing);
                assert!(
                    permission.contains(missing)
                        || (!portcullis_tests::server_has_functions()
                            && permission == named_command),
                    "{missing}: {permission}"
                );
            }
            other => panic!("{missing}: expected Permission, got {other:#?}"),
        }
        let text = error.to_string();
        assert!(text.contains(&format!("ACL SETUSER {user}")), "{text}");
        assert!(text.contains(ACL_COMMANDS), "{text}");
        assert!(has_redis_source(&error), "{:?}", chain(&error));
    }
    // Keys outside the user's pattern.
    let prefix = unique_prefix("prod-acl");
    let mut rules = vec!["~somewhere-else:*"];
    rules.extend(ACL_COMMANDS.split(' '));
    let (_user, error) = permission_error(&prefix, &rules).await;
    match &error {
        BuildError::Permission { permission, .. } => {
            assert_eq!(permission, &format!("~{prefix}:*"));
        }
        other => panic!("expected Permission, got {other:#?}"),
    }
}

/// `ACL_COMMANDS` on the prefix's keys is enough for every algorithm,
/// resets, redis-cell's throttle and the rate limiter.
#[tokio::test(flavor = "multi_thread")]
async fn the_documented_acl_grant_is_enough() {
    let prefix = unique_prefix("prod-grant");
    let key_rule = format!("~{prefix}:*");
    let mut rules = vec![key_rule.as_str()];
    rules.extend(ACL_COMMANDS.split(' '));
    let user = format!("pc-grant-{}", &prefix[prefix.len() - 6..]);
    let store = RedisStore::builder()
        .url(acl_user(&user, &rules))
        .prefix(&prefix)
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap();
    let policies = policies();
    for _ in 0..6 {
        store.check("s", &policies, 1).await.unwrap();
    }
    assert!(!store.check("s", &policies, 1).await.unwrap().is_allowed());
    store.reset("s", &policies).await.unwrap();
    assert!(store.check("s", &policies, 1).await.unwrap().is_allowed());
    store.throttle("cell", 2, 10, 60, 1).await.unwrap();
    let limiter = store.rate_limiter("grant");
    limiter
        .try_set_rate(
            portcullis_redis::redisson::RateType::Overall,
            5,
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_server_fails_at_build_with_the_redis_error() {
    let port = portcullis_tests::free_port();
    let error = build_error(RedisStore::builder().url(format!("redis://127.0.0.1:{port}"))).await;
    assert!(matches!(error, BuildError::Connect { .. }), "{error:#?}");
    assert!(error.to_string().contains("lazy_connect"), "{error}");
    assert!(has_redis_source(&error), "{:?}", chain(&error));
}

/// Store errors keep redis-rs's error as their source.
#[tokio::test(flavor = "multi_thread")]
async fn store_errors_keep_the_redis_error() {
    let port = portcullis_tests::free_port();
    let store = RedisStore::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_secs(1))
        .lazy_connect(true)
        .build()
        .await
        .unwrap();
    let error = store.check("u", &policies(), 1).await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
    // Not only "timed out waiting for a connection": the connect error.
    let mut source = error.source();
    let mut found = false;
    while let Some(error) = source {
        found |= error
            .downcast_ref::<portcullis_redis::RedisCause>()
            .is_some();
        source = error.source();
    }
    assert!(found, "no redis error in {:?}", chain(&error));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_applications_pool_and_clients_are_accepted() {
    let url = portcullis_tests::redis_url();
    let manager = portcullis::redis::upstream::RedisConnectionManager::new(url.as_str()).unwrap();
    let pool = portcullis::redis::upstream::Pool::builder()
        .max_size(2)
        .build(manager)
        .await
        .unwrap();
    let from_pool = RedisStore::builder()
        .pool(pool.clone())
        .prefix(unique_prefix("prod-pool"));
    let from_client = RedisStore::builder()
        .client(redis::Client::open(url.as_str()).unwrap())
        .prefix(unique_prefix("prod-client"));
    let cluster_client = redis::cluster::ClusterClient::builder(portcullis_tests::cluster_urls())
        .retries(0)
        .build()
        .unwrap();
    let from_cluster_client = RedisStore::builder()
        .cluster_client(cluster_client)
        .prefix(unique_prefix("prod-cluster-client"));
    for builder in [from_pool, from_client, from_cluster_client] {
        let store = builder.timeout(TEST_TIMEOUT).build().await.unwrap();
        let policies = policies();
        for expected in (0..5).rev() {
            let verdict = store.check("s", &policies, 1).await.unwrap();
            assert_eq!(verdict.decisions()[0].remaining(), expected);
        }
        assert!(!store.check("s", &policies, 1).await.unwrap().is_allowed());
    }
    // The application's pool still works for its own calls.
    let mut connection = pool.get().await.unwrap();
    let pong: String = redis::cmd("PING")
        .query_async(&mut *connection)
        .await
        .unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_settings_on_a_plain_url_are_refused() {
    let error = RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .tls_ca(portcullis_tests::tls_ca())
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(error, BuildError::TlsSettingsWithoutTls { .. }),
        "{error:#?}"
    );
    assert!(error.to_string().contains("rediss://"), "{error}");
}

/// The quickstart's setup (Axum, five per minute per peer IP) on a store
/// reached by `rediss://` as the ACL user: the layer answers 200 five
/// times, then 429 with `Retry-After`, and the state is in Redis under the
/// user's prefix.
#[tokio::test(flavor = "multi_thread")]
async fn an_axum_app_limits_over_tls_as_an_acl_user() {
    use std::net::SocketAddr;

    use axum::routing::get;
    use portcullis::tower::{PeerIp, RateLimitLayer};

    let prefix = unique_prefix("prod-e2e");
    let store = portcullis::redis::RedisStore::builder()
        .url(portcullis_tests::tls_url())
        .tls_ca(portcullis_tests::tls_ca())
        .prefix(&prefix)
        .build()
        .await
        .unwrap();
    let key = store.key_for("127.0.0.1", "quickstart");
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(5).name("quickstart").build().unwrap())
        .key(PeerIp::new())
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route("/", get(|| async { "hello" }))
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
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..7 {
        let response = client.get(format!("http://{addr}/")).send().await.unwrap();
        if response.status() == 429 {
            assert!(response.headers().contains_key("retry-after"));
        }
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    // The state is on the server, read over plain TCP as the same user.
    let mut raw = redis_common::raw(&portcullis_tests::acl_url());
    let value: String = redis::cmd("GET").arg(&key).query(&mut raw).unwrap();
    // A whole-microsecond GCRA state: the theoretical arrival time in hex,
    // within the minute the five requests spent, and the units it is
    // written in (the policy's "@<limit>:<period_us>:<capacity>").
    let (tat, shape) = value
        .split_once('@')
        .unwrap_or_else(|| panic!("{key} = {value}: no shape"));
    assert_eq!(shape, "5:60000000:5", "{key} = {value}");
    let tat_us = u64::from_str_radix(tat, 16).unwrap_or_else(|e| panic!("{key} = {value}: {e}"));
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        tat_us > now_us && tat_us <= now_us + 60_000_000,
        "{key} = {value} ({tat_us} µs), now {now_us}"
    );
}
