//! The deployments the service's store supports, through the binary:
//! mutual TLS as the store's ACL user, a Cluster, Sentinels (plain and
//! TLS), all started by `cargo xtask test`; and a server that is not
//! there.

use std::time::Duration;

use portcullis::redis::RedisStore;
use portcullis::{
    ConcurrencyPolicy, LeaseId, LeaseStore as _, Policy, ReservationId, ReservationStore as _,
    Store as _, TokenBudget,
};

use crate::{code, json, portcullis, prefix, required, stderr, stdout};

#[test]
fn an_unreachable_store_is_exit_4_with_the_password_hidden() {
    let out = portcullis(&[
        "inspect",
        "alice",
        "--policy",
        "api",
        "--redis",
        "redis://user:s3cret@127.0.0.1:1",
        "--timeout",
        "2s",
    ]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(!stderr(&out).contains("s3cret"), "{}", stderr(&out));
    assert!(stderr(&out).contains("127.0.0.1:1"), "{}", stderr(&out));
}

#[tokio::test]
async fn inspect_and_reset_over_mutual_tls_as_the_stores_acl_user() {
    let prefix = prefix("mtls");
    let url = required("PORTCULLIS_REDIS_MTLS_URL");
    let (ca, cert, key) = (
        required("PORTCULLIS_REDIS_TLS_CA"),
        required("PORTCULLIS_REDIS_TLS_CLIENT_CERT"),
        required("PORTCULLIS_REDIS_TLS_CLIENT_KEY"),
    );
    let read = |path: &str| std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let store = RedisStore::builder()
        .url(url.as_str())
        .prefix(prefix.as_str())
        .tls_ca(read(&ca))
        .tls_client_cert(read(&cert), read(&key))
        .timeout(Duration::from_secs(5))
        // Generous: TLS handshakes of parallel tests on a loaded machine.
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("the mutual-TLS store should build");
    let policies = [Policy::per_hour(3).name("hourly").build().unwrap()];
    for _ in 0..2 {
        assert!(store
            .check("dave", &policies, 1)
            .await
            .unwrap()
            .is_allowed());
    }
    let tls = [
        "--redis",
        &url,
        "--prefix",
        &prefix,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ];
    let mut args = vec![
        "--json", "inspect", "dave", "--policy", "hourly", "--budget", "plain",
    ];
    args.extend(tls);
    let out = portcullis(&args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["policies"][0]["decision"]["remaining"], 1);
    // The store's ACL user is not granted SCAN: said, not a failure.
    assert_eq!(
        json(&out)["reservations"][0]["found_by"],
        "scan not permitted"
    );
    assert!(!stdout(&out).contains(&url), "the password is printed");

    let mut args = vec!["reset", "--yes", "dave", "--policy", "hourly"];
    args.extend(tls);
    let out = portcullis(&args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        store.peek("dave", &policies).await.unwrap().decisions()[0].remaining(),
        3
    );
}

#[tokio::test]
async fn inspect_and_reset_on_a_cluster_touch_only_the_subject() {
    let prefix = prefix("cluster");
    let urls = required("PORTCULLIS_REDIS_CLUSTER_URLS");
    let store = RedisStore::builder()
        .cluster(urls.split(','))
        .prefix(prefix.as_str())
        .timeout(Duration::from_secs(5))
        // Generous: TLS handshakes of parallel tests on a loaded machine.
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("the Cluster store should build");
    let policies = [Policy::per_hour(10).name("hourly").build().unwrap()];
    // Subjects on different slots, each charged a different number of times.
    let subjects: Vec<String> = (1..=6).map(|n| format!("user-{n}")).collect();
    for (n, subject) in subjects.iter().enumerate() {
        for _ in 0..=n {
            assert!(store
                .check(subject, &policies, 1)
                .await
                .unwrap()
                .is_allowed());
        }
    }
    let cluster = ["--cluster", "--redis", &urls, "--prefix", &prefix];
    for (n, subject) in subjects.iter().enumerate() {
        let mut args = vec!["--json", "inspect", subject.as_str(), "--policy", "hourly"];
        args.extend(cluster);
        let out = portcullis(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(
            json(&out)["policies"][0]["decision"]["remaining"],
            9 - n,
            "{subject}"
        );
    }
    let mut args = vec!["reset", "--yes", "user-3", "--policy", "hourly"];
    args.extend(cluster);
    let out = portcullis(&args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for (n, subject) in subjects.iter().enumerate() {
        let remaining = store.peek(subject, &policies).await.unwrap().decisions()[0].remaining();
        let expected = if subject == "user-3" {
            10
        } else {
            9 - n as u64
        };
        assert_eq!(remaining, expected, "{subject}");
    }
}

/// On a Cluster, each subject's leases and reservations are read on the
/// node of its slot: the open set, and the scan for a budget without one.
#[tokio::test]
async fn leases_and_reservations_on_a_cluster_are_each_subjects_own() {
    let prefix = prefix("cluster-rsv");
    let urls = required("PORTCULLIS_REDIS_CLUSTER_URLS");
    let store = RedisStore::builder()
        .cluster(urls.split(','))
        .prefix(prefix.as_str())
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("the Cluster store should build");
    let exports = ConcurrencyPolicy::max_in_flight(5)
        .name("exports")
        .build()
        .unwrap();
    let tokens = Policy::per_minute(10_000).name("tpm").build().unwrap();
    let streams = TokenBudget::tokens(tokens.clone())
        .name("streams")
        .max_in_flight(4)
        .build()
        .unwrap();
    let plain = TokenBudget::tokens(tokens).name("plain").build().unwrap();
    // Subjects on different slots, each holding n leases and reservations
    // of n x 100 tokens.
    let subjects: Vec<String> = (1..=4).map(|n| format!("tenant-{n}")).collect();
    for (n, subject) in subjects.iter().enumerate() {
        for _ in 0..=n {
            assert!(store
                .acquire(subject, &exports, LeaseId::generate())
                .await
                .unwrap()
                .is_granted());
        }
        for budget in [&streams, &plain] {
            let estimate = 100 * (n as u64 + 1);
            assert!(store
                .reserve(subject, budget, estimate, ReservationId::generate())
                .await
                .unwrap()
                .is_admitted());
        }
    }
    for (n, subject) in subjects.iter().enumerate() {
        let args = [
            "--json",
            "inspect",
            subject.as_str(),
            "--policy",
            "api",
            "--lease",
            "exports",
            "--budget",
            "streams",
            "--budget",
            "plain",
            "--cluster",
            "--redis",
            &urls,
            "--prefix",
            &prefix,
        ];
        let out = portcullis(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let report = json(&out);
        assert_eq!(report["leases"][0]["live"], n + 1, "{subject}");
        for (i, found_by) in [(0, "open set"), (1, "scan")] {
            let view = &report["reservations"][i];
            assert_eq!(view["found_by"], found_by, "{subject}: {view}");
            assert_eq!(view["open"], 1, "{subject}: {view}");
            assert_eq!(view["tokens_held"], 100 * (n + 1), "{subject}: {view}");
        }
    }
}

#[tokio::test]
async fn inspect_and_reset_through_sentinels_plain_and_tls() {
    let master = required("PORTCULLIS_REDIS_SENTINEL_MASTER");
    let ca = required("PORTCULLIS_REDIS_TLS_CA");
    let ca_pem = std::fs::read(&ca).unwrap_or_else(|e| panic!("{ca}: {e}"));
    for (variable, tls) in [
        ("PORTCULLIS_REDIS_SENTINEL_URLS", false),
        ("PORTCULLIS_REDIS_TLS_SENTINEL_URLS", true),
    ] {
        let prefix = prefix(if tls { "tls-sentinel" } else { "sentinel" });
        let urls = required(variable);
        let mut builder = RedisStore::builder()
            .sentinel(master.as_str(), urls.split(','))
            .prefix(prefix.as_str())
            .timeout(Duration::from_secs(5))
            // Generous: TLS handshakes of parallel tests on a loaded machine.
            .connect_timeout(Duration::from_secs(5));
        if tls {
            builder = builder.tls_ca(ca_pem.clone());
        }
        let store = builder
            .build()
            .await
            .expect("the Sentinel store should build");
        let policies = [Policy::per_hour(4).name("hourly").build().unwrap()];
        for _ in 0..3 {
            assert!(store
                .check("frank", &policies, 1)
                .await
                .unwrap()
                .is_allowed());
        }
        let mut options = vec!["--sentinel", &master, "--redis", &urls, "--prefix", &prefix];
        if tls {
            options.extend(["--tls-ca", &ca]);
        }
        let mut args = vec!["--json", "inspect", "frank", "--policy", "hourly"];
        args.extend(&options);
        let out = portcullis(&args);
        assert_eq!(code(&out), 0, "{variable}: {}", stderr(&out));
        assert_eq!(
            json(&out)["policies"][0]["decision"]["remaining"],
            1,
            "{variable}"
        );

        let mut args = vec!["reset", "--yes", "frank", "--policy", "hourly"];
        args.extend(&options);
        let out = portcullis(&args);
        assert_eq!(code(&out), 0, "{variable}: {}", stderr(&out));
        let remaining = store.peek("frank", &policies).await.unwrap().decisions()[0].remaining();
        assert_eq!(remaining, 4, "{variable}");
    }
}
