//! End to end: a real Tonic gRPC server (the standard health service) with
//! the rate-limit layer, called by a real Tonic client, with the memory
//! store and with Redis. Limited calls fail with `RESOURCE_EXHAUSTED`, and
//! the client decodes `google.rpc.RetryInfo` and `QuotaFailure` from the
//! status details.

use std::net::SocketAddr;

use portcullis::redis::RedisStore;
use portcullis::tower::{PeerIp, RateLimitLayer};
use portcullis::{MemoryStore, Policy, Store};
use portcullis_tests::redis_url;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

async fn serve<St: Store>(store: St) -> SocketAddr {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(2).name("grpc").build().unwrap())
        .key(PeerIp::new())
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn limited_calls_fail_with_resource_exhausted<St: Store>(store: St) {
    let addr = serve(store).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let request = || HealthCheckRequest {
        service: String::new(),
    };
    for remaining in ["1", "0"] {
        let response = client.check(request()).await.unwrap();
        // Serving = 1; the peer address was found (else INVALID_ARGUMENT).
        assert_eq!(response.get_ref().status, 1);
        let rate = response
            .metadata()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap();
        assert!(
            rate.starts_with(&format!("\"grpc\";r={remaining};t=")),
            "{rate}"
        );
    }
    let status = client.check(request()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("rate limit \"grpc\" exceeded"),
        "{}",
        status.message()
    );
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let pushback: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((retry_after - 1) * 1000 < pushback && pushback <= retry_after * 1000);
    assert!(status.metadata().get("ratelimit").is_some());
    assert!(status.metadata().get("ratelimit-policy").is_some());
    // The standard details gRPC clients and retry policies read.
    let retry = status
        .get_details_retry_info()
        .expect("google.rpc.RetryInfo in grpc-status-details-bin");
    // The pushback header is the same delay in whole milliseconds.
    assert_eq!(retry.retry_delay.unwrap().as_millis(), u128::from(pushback));
    let quota = status
        .get_details_quota_failure()
        .expect("google.rpc.QuotaFailure in grpc-status-details-bin");
    assert_eq!(quota.violations.len(), 1);
    assert_eq!(quota.violations[0].subject, "grpc");
    assert!(
        quota.violations[0].description.contains("limit of 2 per"),
        "{}",
        quota.violations[0].description
    );
}

#[tokio::test]
async fn memory_limited_calls_fail_with_resource_exhausted() {
    limited_calls_fail_with_resource_exhausted(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_limited_calls_fail_with_resource_exhausted() {
    let store = RedisStore::builder()
        .url(redis_url())
        .prefix(portcullis_tests::unique_prefix("e2e-grpc"))
        .build()
        .await
        .unwrap();
    limited_calls_fail_with_resource_exhausted(store).await;
}
