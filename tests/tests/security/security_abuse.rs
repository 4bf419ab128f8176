//! Abuse: forged forwarding headers from an untrusted peer never change the
//! key; addresses rotating inside one IPv6 /56 share one limit; one hot
//! subject at full load costs the store at least 10× fewer calls per denied
//! request with the local deny cache, while the other subjects keep their
//! limits (their latency is printed, never asserted).

use std::time::Duration;

use portcullis_core::MemoryStore;
use portcullis_redis::RedisStore;
use portcullis_tests::reliability::{
    hot_subject, ipv6_rotation, no_hang, spoofed_forwarded_for, table, HotSubject,
};
use portcullis_tests::OwnedRedis;

async fn redis_store(what: &str) -> RedisStore {
    RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .prefix(portcullis_tests::unique_prefix(&format!("abuse-{what}")))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn spoofed_forwarding_headers_never_change_the_key() {
    for (store, row) in [
        (
            "memory",
            spoofed_forwarded_for(MemoryStore::new(), 300, 10).await,
        ),
        (
            "redis",
            spoofed_forwarded_for(redis_store("spoof").await, 300, 10).await,
        ),
    ] {
        println!("{store}:\n{}", table(std::slice::from_ref(&row)));
        assert_eq!(
            row.wrong, 0,
            "{store}: the key stays the peer's, exactly the limit passes"
        );
        assert_eq!(
            row.failures.get("429").copied(),
            Some(580),
            "{store}: {row:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rotating_ipv6_addresses_in_one_prefix_share_one_limit() {
    for (store, row) in [
        ("memory", ipv6_rotation(MemoryStore::new(), 200, 10).await),
        (
            "redis",
            ipv6_rotation(redis_store("v6").await, 200, 10).await,
        ),
    ] {
        println!("{store}:\n{}", table(std::slice::from_ref(&row)));
        assert_eq!(
            row.wrong, 0,
            "{store}: one key for the /56, exactly the limit passes"
        );
        assert_eq!(
            row.failures.get("429").copied(),
            Some(380),
            "{store}: {row:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deny_cache_cuts_store_calls_for_a_hot_subject_tenfold() {
    // A server of its own: the scenario resets and reads INFO commandstats.
    let server = tokio::task::block_in_place(|| OwnedRedis::start(&[]));
    let config = HotSubject::quick();
    let report = no_hang(
        Duration::from_secs(120),
        "the hot-subject scenario",
        hot_subject(&server.url(), &config),
    )
    .await;
    println!("{}", table(std::slice::from_ref(&report.row)));

    for phase in [&report.baseline, &report.with_cache, &report.without_cache] {
        assert_eq!(
            phase.others_not_admitted, 0,
            "the other subjects keep their own limits: {phase:?}"
        );
    }
    for phase in [&report.with_cache, &report.without_cache] {
        assert!(
            phase.hot_admitted_is_exact(config.limit),
            "the hot subject gets its burst plus the refill, cache or not: {phase:?}"
        );
    }
    assert!(
        (report.without_cache.calls_per_denied() - 1.0).abs() < f64::EPSILON,
        "without the cache every denial is a store call: {:?}",
        report.without_cache
    );
    assert!(
        report.reduction() >= 10.0,
        "the deny cache cuts store calls per denied request at least 10×: {:.1}× ({:?} vs {:?})",
        report.reduction(),
        report.with_cache,
        report.without_cache
    );
    // Redis' own count agrees: the cached phase ran far fewer scripts.
    assert!(report.with_cache.evalsha_calls * 5 < report.without_cache.evalsha_calls);
}
