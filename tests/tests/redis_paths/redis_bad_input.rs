//! Bad input: refused requests, and subjects that could break keys
//! (braces, newlines, 1 MB) stored under hashed keys that never collide and
//! land in the right Cluster slot.

use crate::redis_common;

use std::time::Duration;

use portcullis_core::subject::encode_subject;
use portcullis_core::{Algorithm, Policy, Store, StoreError};
use portcullis_redis::{ClockMode, RedisStore};
use portcullis_tests::unique_prefix;

fn policy(algorithm: Algorithm, name: &str, limit: u64) -> Policy {
    Policy::per(limit, Duration::from_secs(60))
        .algorithm(algorithm)
        .name(name)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_refused_before_reaching_redis() {
    let store = redis_common::standalone(&unique_prefix("bad"), ClockMode::Redis).await;
    let two = [
        policy(Algorithm::Gcra, "a", 5),
        policy(Algorithm::FixedWindow, "b", 3),
    ];
    match store.check("s", &two, 4).await {
        Err(StoreError::CostTooHigh {
            policy,
            cost: 4,
            capacity: 3,
        }) => assert_eq!(policy, "b"),
        other => panic!("expected CostTooHigh, got {other:?}"),
    }
    assert!(matches!(
        store.check("s", &[], 1).await,
        Err(StoreError::NoPolicies)
    ));
    let duplicate = [
        policy(Algorithm::Gcra, "a", 5),
        policy(Algorithm::SlidingLog, "a", 5),
    ];
    assert!(matches!(
        store.check("s", &duplicate, 1).await,
        Err(StoreError::DuplicatePolicy { name }) if name == "a"
    ));
    // None of that charged anything.
    let verdict = store.peek("s", &two).await.unwrap();
    assert_eq!(verdict.decisions()[0].remaining(), 5);
    assert_eq!(verdict.decisions()[1].remaining(), 3);
}

fn odd_subjects() -> Vec<String> {
    vec![
        "}{".to_owned(),
        "{user}".to_owned(),
        "a}b{c".to_owned(),
        "line\nbreak".to_owned(),
        "line\r\nbreak".to_owned(),
        "tab\there".to_owned(),
        "space here".to_owned(),
        String::new(),
        "\u{0}".to_owned(),
        "ünïcødé".to_owned(),
        "#".to_owned(),
        "*".to_owned(),
        "x".repeat(129),
        "x".repeat(1 << 20),
        "y".repeat(1 << 20),
    ]
}

/// Each odd subject has its own limit (no two collide, none collides with
/// a plain subject) and is stored under `<prefix>:{#<sha256>}:<policy>`.
async fn odd_subjects_get_their_own_hashed_keys(store: &RedisStore, urls: &[String]) {
    let policies: Vec<Policy> = Algorithm::ALL
        .iter()
        .enumerate()
        .map(|(i, algorithm)| policy(*algorithm, &format!("p{i}"), 2))
        .collect();
    let subjects = odd_subjects();
    for subject in &subjects {
        let first = store.check(subject, &policies, 2).await.unwrap();
        assert!(
            first.is_allowed(),
            "{:?}: a fresh subject",
            &subject[..subject.len().min(20)]
        );
        let second = store.check(subject, &policies, 1).await.unwrap();
        assert!(!second.is_allowed(), "its own limit is reached");
    }
    // A subject equal to the hash of another ("}{", whose limit is
    // reached) is still separate: it is hashed again.
    let hashed = encode_subject("}{", false).into_owned();
    assert!(hashed.starts_with('#'));
    assert!(store
        .check(&hashed, &policies, 2)
        .await
        .unwrap()
        .is_allowed());

    for subject in &subjects {
        let encoded = encode_subject(subject, false);
        assert!(encoded.starts_with('#') && encoded.len() == 65);
        let key = store.key_for(subject, "p0");
        assert_eq!(key, format!("{}:{{{encoded}}}:p0", store.prefix()));
        let found = urls.iter().any(|url| {
            let mut raw = redis_common::raw(url);
            redis::cmd("EXISTS")
                .arg(&key)
                .query::<i64>(&mut raw)
                .map(|n| n == 1)
                .unwrap_or(false)
        });
        assert!(found, "{key} exists");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn odd_subjects_standalone() {
    let store = redis_common::standalone(&unique_prefix("bad-subjects"), ClockMode::Redis).await;
    odd_subjects_get_their_own_hashed_keys(&store, &[portcullis_tests::redis_url()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn odd_subjects_cluster() {
    let store = redis_common::cluster(&unique_prefix("bad-subjects"), ClockMode::Redis).await;
    let urls = portcullis_tests::cluster_urls();
    odd_subjects_get_their_own_hashed_keys(&store, &urls).await;
    // Every key of a subject is in the slot of its hash tag, on the node
    // that serves that slot (EXISTS without MOVED from that node).
    let mut any = redis_common::raw(&urls[0]);
    for subject in odd_subjects() {
        let encoded = encode_subject(&subject, false);
        let tag_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&*encoded)
            .query(&mut any)
            .unwrap();
        for i in 0..Algorithm::ALL.len() {
            let key = store.key_for(&subject, &format!("p{i}"));
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query(&mut any)
                .unwrap();
            assert_eq!(slot, tag_slot, "{key}");
        }
    }
}

/// Subjects marked secret are hashed even when plain.
#[tokio::test(flavor = "multi_thread")]
async fn hashed_subjects_never_reach_redis() {
    let prefix = unique_prefix("secret");
    let store = RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .prefix(&prefix)
        .hash_subjects(true)
        .timeout(redis_common::TEST_TIMEOUT)
        .build()
        .await
        .unwrap();
    let token = "sk-live-0123456789";
    let policies = [policy(Algorithm::Gcra, "api", 3)];
    assert!(store.check(token, &policies, 1).await.unwrap().is_allowed());
    let keys = redis_common::scan_ttls(&portcullis_tests::redis_url(), &format!("{prefix}:*"));
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(!keys[0].0.contains(token), "{keys:?}");
    assert_eq!(
        keys[0].0,
        format!("{prefix}:{{{}}}:api", encode_subject(token, true))
    );
}

/// State of another type under a store key (someone wrote it by hand) is
/// read as no state and replaced, never a script error.
#[tokio::test(flavor = "multi_thread")]
async fn foreign_values_under_a_key_count_as_no_state() {
    let prefix = unique_prefix("foreign");
    let store = redis_common::standalone(&prefix, ClockMode::Redis).await;
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    for (i, algorithm) in Algorithm::ALL.iter().enumerate() {
        let policies = [policy(*algorithm, "p", 2)];
        let subject = format!("s{i}");
        let key = store.key_for(&subject, "p");
        // A hash, a string that is not a state, and a sorted set of junk.
        for setup in 0..3 {
            // Written with its TTL in one transaction: no key of the tests
            // is ever without one (the TTL test scans for that).
            let mut setup_pipe = redis::pipe();
            setup_pipe.atomic().del(&key).ignore();
            match setup {
                0 => setup_pipe.hset(&key, "f", "v").ignore(),
                1 => setup_pipe.set(&key, "gcra:not:numbers").ignore(),
                _ => setup_pipe.zadd(&key, "junk", 1).ignore(),
            };
            setup_pipe.pexpire(&key, 60_000).ignore();
            let () = setup_pipe.query(&mut raw).unwrap();
            let verdict = store.check(&subject, &policies, 2).await;
            let verdict = verdict.unwrap_or_else(|e| panic!("{algorithm} over setup {setup}: {e}"));
            // A sorted set of junk scored 1 µs after the epoch is outside
            // every window, so every algorithm starts full.
            assert!(verdict.is_allowed(), "{algorithm} over setup {setup}");
            assert!(!store
                .check(&subject, &policies, 1)
                .await
                .unwrap()
                .is_allowed());
        }
    }
}

/// An error Redis answers for a check (here its scripts' `TIME` renamed
/// away) reaches the caller as `StoreError::Rejected` with the redis-rs
/// error as its `source()`, scoped to the subject: not a store-wide
/// failure that would open a circuit breaker.
#[tokio::test(flavor = "multi_thread")]
async fn an_error_redis_answers_keeps_the_redis_error_as_its_source() {
    let server = portcullis_tests::OwnedRedis::start(&["--rename-command", "TIME", "TIME_renamed"]);
    let store = RedisStore::builder()
        .url(redis_common::path_url(server.url()))
        .prefix(unique_prefix("rejected"))
        .timeout(redis_common::TEST_TIMEOUT)
        // build()'s probe would refuse this server at once.
        .lazy_connect(true)
        .build()
        .await
        .unwrap();
    for algorithm in [Algorithm::Gcra, Algorithm::SlidingLog] {
        let policies = [policy(algorithm, "api", 5)];
        let error = store.check("s", &policies, 1).await.unwrap_err();
        assert!(
            matches!(error, StoreError::Rejected { .. }),
            "{algorithm}: {error:?}"
        );
        assert_eq!(error.scope(), portcullis_core::ErrorScope::Subject);
        let source = std::error::Error::source(&error).expect("a source");
        let redis = source
            .downcast_ref::<portcullis_redis::RedisCause>()
            .unwrap_or_else(|| panic!("{algorithm}: source is not redis-rs's error: {source:?}"));
        assert!(
            redis.to_string().to_ascii_lowercase().contains("unknown"),
            "{algorithm}: {redis}"
        );
        assert!(error.to_string().contains("refused"), "{error}");
    }
}
