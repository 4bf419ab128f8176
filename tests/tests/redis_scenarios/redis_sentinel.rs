//! Redis Sentinel: a store built with `.sentinel(master, urls)` decides as
//! a store on the primary does (also with `rediss://` Sentinels and a TLS
//! primary), an unknown master name fails at `build()`,
//! and a failover (`SENTINEL FAILOVER`, and a killed primary) is followed
//! without a restart and without a wrong decision.
//!
//! The shared Sentinel set comes from `cargo xtask test`
//! (`PORTCULLIS_REDIS_SENTINEL_URLS`, `PORTCULLIS_REDIS_SENTINEL_MASTER`); the
//! failover tests start their own ([`portcullis_tests::OwnedSentinelSet`]),
//! since they take its primary away.

use crate::redis_common;

use std::time::Duration;

use portcullis_core::{Algorithm, Policy, Store};
use portcullis_redis::{BuildError, RedisStore, RedisStoreBuilder};
use portcullis_tests::reliability::{sentinel_failover, SentinelFault};
use portcullis_tests::unique_prefix;
use redis_common::{client, manual_clock, TEST_TIMEOUT};

async fn remaining_sequence(builder: RedisStoreBuilder) -> Vec<(bool, u64)> {
    let clock = manual_clock();
    // Connecting asks the Sentinels, then opens the primary: over TLS that
    // is several handshakes of a debug build, which a 2-core machine busy
    // with builds and other tests has taken more than the default 1 s for
    // (seen once, Redis 7.4.1): this test is about decisions, not speed.
    let store = builder
        .prefix(unique_prefix("sentinel"))
        .timeout(TEST_TIMEOUT)
        .connect_timeout(TEST_TIMEOUT)
        .clock(client(&clock))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .unwrap_or_else(|e| panic!("the store should build: {e:#?}"));
    let policies: Vec<Policy> = Algorithm::ALL
        .iter()
        .enumerate()
        .map(|(i, algorithm)| {
            Policy::per(4, Duration::from_secs(3600))
                .algorithm(*algorithm)
                .name(format!("p{i}"))
                .build()
                .unwrap()
        })
        .collect();
    let mut out = Vec::new();
    for _ in 0..6 {
        let verdict = store.check("subject", &policies, 1).await.unwrap();
        out.extend(
            verdict
                .decisions()
                .iter()
                .map(|d| (d.is_allowed(), d.remaining())),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_through_the_sentinels_equal_those_of_a_plain_server() {
    let through_sentinels = remaining_sequence(RedisStore::builder().sentinel(
        portcullis_tests::sentinel_master(),
        portcullis_tests::sentinel_urls(),
    ))
    .await;
    let plain = remaining_sequence(RedisStore::builder().url(portcullis_tests::redis_url())).await;
    assert_eq!(through_sentinels, plain);
    assert!(plain.iter().any(|(allowed, _)| !allowed), "{plain:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_through_tls_sentinels_equal_those_of_a_plain_server() {
    // `rediss://` Sentinels: the client talks TLS to the Sentinels and to
    // the primary whose TLS address they hand out, trusting the test CA.
    let urls = portcullis_tests::tls_sentinel_urls();
    assert!(
        urls.iter().all(|url| url.starts_with("rediss://")),
        "{urls:?}"
    );
    let through_sentinels = remaining_sequence(
        RedisStore::builder()
            .sentinel(portcullis_tests::sentinel_master(), urls.clone())
            .tls_ca(portcullis_tests::tls_ca()),
    )
    .await;
    let plain = remaining_sequence(RedisStore::builder().url(portcullis_tests::redis_url())).await;
    assert_eq!(through_sentinels, plain);
    assert!(plain.iter().any(|(allowed, _)| !allowed), "{plain:?}");

    // Without the test CA the Sentinels' certificate is not trusted: the
    // build fails, it does not fall back to plain TCP.
    let untrusted = RedisStore::builder()
        .sentinel(portcullis_tests::sentinel_master(), urls)
        .timeout(TEST_TIMEOUT)
        .build()
        .await;
    let error = untrusted.expect_err("a Sentinel with an unknown CA was trusted");
    assert!(matches!(error, BuildError::Connect { .. }), "{error:?}");
    assert!(
        error.to_string().contains(".tls_ca("),
        "the message says to trust the CA: {error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_master_fails_at_build() {
    let error = RedisStore::builder()
        .sentinel("no-such-master", portcullis_tests::sentinel_urls())
        .build()
        .await
        .unwrap_err();
    match &error {
        BuildError::UnknownSentinelMaster { master, .. } => assert_eq!(master, "no-such-master"),
        other => panic!("expected UnknownSentinelMaster, got {other:#?}"),
    }
    assert!(error.to_string().contains("SENTINEL MASTERS"), "{error}");
    assert!(std::error::Error::source(&error).is_some());
}

async fn assert_followed(fault: SentinelFault) {
    let report = sentinel_failover(fault, 50, 50).await;
    eprintln!("{fault:?}: {:?}", report.row);
    let recovered = report
        .recovered
        .unwrap_or_else(|| panic!("{fault:?}: the store never recovered: {:?}", report.row));
    eprintln!("{fault:?}: first correct decision {recovered:?} after the fault");
    assert_eq!(report.row.wrong, 0, "{fault:?}: {:?}", report.row);
    assert_eq!(report.failed_after, 0, "{fault:?}: {:?}", report.row);
    assert!(
        report.key_on_new_primary,
        "{fault:?}: the subject's key is not on the new primary"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sentinel_failover_is_followed_without_a_wrong_decision() {
    assert_followed(SentinelFault::PlannedFailover).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_primary_is_followed_without_a_wrong_decision() {
    assert_followed(SentinelFault::KillPrimary).await;
}
