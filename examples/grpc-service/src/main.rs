// Run with: cargo run -p grpc-service
//! A Tonic gRPC server with the rate-limit layer, per peer IP.
//!
//! The service is the standard gRPC health service (`grpc.health.v1.Health`,
//! from `tonic-health`), so the example needs no `.proto` compiler. At start
//! a client in the same process calls it four times against a limit of
//! three per minute; the fourth call fails with `RESOURCE_EXHAUSTED`, and
//! the client reads `google.rpc.RetryInfo` and `QuotaFailure` from the
//! status details (`tonic_types::StatusExt`). The
//! server keeps running on 127.0.0.1:50051 (or `PORT`) for your own client.
//! State lives in process memory, or in Redis when `REDIS_URL` is set; logs
//! go to stderr (`RUST_LOG`):
//!
//! ```text
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;

use portcullis::redis::store_from_env;
use portcullis::tower::{PeerIp, RateLimitLayer};
use portcullis::{BoxLeaseStore, Policy};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(start().await)
}

async fn start() -> Result<(), Box<dyn Error>> {
    // Without a subscriber, the limiter's warnings (requests let through
    // because the store failed, the circuit breaker opening) are lost.
    // Picked at start-up; `BoxLeaseStore` holds either store, so `run` is not
    // generic.
    let store = store_from_env("REDIS_URL").await?;
    run(store).await
}

async fn run(store: BoxLeaseStore) -> Result<(), Box<dyn Error>> {
    let policy = Policy::per_minute(3).name("grpc").build()?;
    let layer = RateLimitLayer::builder(store)
        .policy(policy)
        .key(PeerIp::new())
        .build()?;
    let (_reporter, health) = tonic_health::server::health_reporter();

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(50051);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!("gRPC health service listening on http://{addr} (policy \"grpc\": 3 per minute per peer IP)");
    let server = tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = tokio::signal::ctrl_c().await;
            }),
    );

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for call in 1..=4 {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        match client.check(request).await {
            Ok(response) => {
                let rate = response
                    .metadata()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                println!(
                    "call {call}: OK, status {:?}, ratelimit: {rate}",
                    response.get_ref().status()
                );
            }
            Err(status) => {
                // The standard details, as gRPC clients read them.
                let retry = status
                    .get_details_retry_info()
                    .and_then(|info| info.retry_delay);
                let quota = status.get_details_quota_failure();
                let violation = quota.as_ref().and_then(|q| q.violations.first());
                println!(
                    "call {call}: {:?}: {} (RetryInfo: {retry:?}; QuotaFailure: {:?})",
                    status.code(),
                    status.message(),
                    violation.map(|v| (&v.subject, &v.description)),
                );
            }
        }
    }
    println!("serving until Ctrl-C");
    server.await??;
    Ok(())
}
