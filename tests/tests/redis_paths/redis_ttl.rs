//! Every key the store writes has a TTL: after a workload over every
//! algorithm and API, and for every key any Redis test left behind.

use crate::redis_common;

use std::time::Duration;

use portcullis_core::{Algorithm, Policy, Store};
use portcullis_redis::redisson::RateType;
use portcullis_redis::{ClockMode, RedisStore};
use portcullis_tests::{unique_prefix, TEST_PREFIX};
use redis_common::{client, manual_clock};

async fn workload(store: &RedisStore) {
    let policies: Vec<Policy> = Algorithm::ALL
        .iter()
        .enumerate()
        .map(|(i, algorithm)| {
            Policy::per(3, Duration::from_secs(60 * (i as u64 + 1)))
                .algorithm(*algorithm)
                .name(format!("p{i}"))
                .build()
                .unwrap()
        })
        .collect();
    for subject in ["a", "b", "{odd subject}"] {
        for cost in [1, 0, 2, 1, 3] {
            store.check(subject, &policies, cost).await.unwrap();
            for policy in &policies {
                store
                    .check(subject, std::slice::from_ref(policy), cost)
                    .await
                    .unwrap();
            }
        }
    }
    store.throttle("cell", 5, 10, 60, 1).await.unwrap();
    let limiter = store.rate_limiter("limiter");
    limiter
        .try_set_rate(RateType::PerClient, 5, Duration::from_secs(60))
        .await
        .unwrap();
    limiter.try_acquire(2).await.unwrap();
    store.rate_limiter("limiter").try_acquire(1).await.unwrap();
}

/// Asserts every key matching `pattern` has a TTL and there are at least
/// `at_least`; returns how many there are.
fn assert_all_have_ttl(url: &str, pattern: &str, at_least: usize) -> usize {
    let keys = redis_common::scan_ttls(url, pattern);
    assert!(
        keys.len() >= at_least,
        "{pattern}: only {} keys",
        keys.len()
    );
    let immortal: Vec<_> = keys.iter().filter(|(_, ttl)| *ttl == -1).collect();
    assert!(immortal.is_empty(), "keys without a TTL: {immortal:?}");
    keys.len()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_key_written_has_a_ttl() {
    let url = portcullis_tests::redis_url();
    let prefix = unique_prefix("ttl");
    workload(&redis_common::standalone(&prefix, ClockMode::Redis).await).await;
    let clock = manual_clock();
    let manual = format!("{prefix}-manual");
    workload(&redis_common::standalone(&manual, client(&clock)).await).await;
    // 7 policies × 3 subjects + throttle + limiter config and two clients.
    assert_all_have_ttl(&url, &format!("{prefix}:*"), 7 * 3 + 4);
    assert_all_have_ttl(&url, &format!("{manual}:*"), 7 * 3 + 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_key_written_has_a_ttl_on_the_cluster() {
    let prefix = unique_prefix("ttl-cluster");
    workload(&redis_common::cluster(&prefix, ClockMode::Redis).await).await;
    let mut total = 0;
    for url in portcullis_tests::cluster_urls() {
        total += assert_all_have_ttl(&url, &format!("{prefix}:*"), 0);
    }
    assert!(total >= 7 * 3 + 4, "only {total} keys");
}

/// Whatever the other Redis tests left (they all write under `pc-test`),
/// nothing is immortal. Keys written in the same instant as their TTL, in
/// one script, so this holds while other tests run.
#[test]
fn no_test_key_anywhere_is_immortal() {
    let pattern = format!("{TEST_PREFIX}*");
    assert_all_have_ttl(&portcullis_tests::redis_url(), &pattern, 0);
    for url in portcullis_tests::cluster_urls() {
        assert_all_have_ttl(&url, &pattern, 0);
    }
}
