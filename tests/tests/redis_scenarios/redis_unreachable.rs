//! An unreachable Redis gives a typed `Unavailable` error within the
//! timeout, never a hang or a panic (stores built with `lazy_connect`; a
//! store built normally fails at `build()` instead, see
//! `redis_production.rs`).

use std::time::Duration;

use portcullis_core::{Policy, Store, StoreError};
use portcullis_redis::RedisStore;

/// Bounds the whole test, so a hang fails it instead of blocking the run.
const HANG: Duration = Duration::from_secs(30);

fn policies() -> [Policy; 1] {
    [Policy::per_second(10).name("api").build().unwrap()]
}

async fn assert_unavailable(store: &RedisStore) {
    for attempt in 0..5 {
        let result = tokio::time::timeout(HANG, store.check("user", &policies(), 1))
            .await
            .expect("a check against a closed port must not hang");
        match result {
            Err(error @ StoreError::Unavailable { .. }) => {
                assert!(error.is_backend());
                assert!(error.to_string().contains("nothing was charged"), "{error}");
            }
            other => panic!("attempt {attempt}: expected Unavailable, got {other:?}"),
        }
    }
    let ping = tokio::time::timeout(HANG, store.ping())
        .await
        .expect("ping must not hang");
    assert!(
        matches!(ping, Err(StoreError::Unavailable { .. })),
        "{ping:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn closed_port_is_unavailable() {
    let port = portcullis_tests::free_port();
    let store = RedisStore::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(200))
        .lazy_connect(true)
        .build()
        .await
        .expect("building lazily never connects");
    assert_unavailable(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn closed_cluster_ports_are_unavailable() {
    let urls: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}", portcullis_tests::free_port()))
        .collect();
    let store = RedisStore::builder()
        .cluster(urls)
        .timeout(Duration::from_millis(200))
        .lazy_connect(true)
        .build()
        .await
        .expect("building lazily never connects");
    assert_unavailable(&store).await;
}

/// A server that accepts connections but never answers: the call times out
/// within the deadline with a typed error.
#[tokio::test(flavor = "multi_thread")]
async fn silent_server_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and hold connections without ever replying.
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let store = RedisStore::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .lazy_connect(true)
        .build()
        .await
        .unwrap();
    let result = tokio::time::timeout(HANG, store.check("user", &policies(), 1))
        .await
        .expect("must not hang");
    // The handshake never completes, so nothing was sent: Unavailable.
    assert!(
        matches!(result, Err(StoreError::Unavailable { .. })),
        "{result:?}"
    );
    holder.abort();
}
