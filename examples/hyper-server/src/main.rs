// Run with: cargo run -p hyper-server
//! A plain Hyper server with the rate-limit layer.
//!
//! Hyper does not record the peer address in requests, so the accept loop
//! inserts the connection's `SocketAddr` into each request's extensions,
//! where `PeerIp` finds it. State lives in process memory, or in Redis when
//! `REDIS_URL` is set; logs go to stderr (`RUST_LOG`). Listens on
//! 127.0.0.1:3000 or `PORT`:
//!
//! ```text
//! for i in $(seq 4); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use portcullis::redis::store_from_env;
use portcullis::tower::{PeerIp, RateLimitLayer};
use portcullis::{BoxLeaseStore, Policy};
use tower::{Layer, ServiceExt};

async fn hello(_request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(
        b"Hello from Hyper!\n",
    ))))
}

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(start().await)
}

async fn start() -> Result<(), Box<dyn Error>> {
    // Without a subscriber, the limiter's warnings (requests let through
    // because the store failed, the circuit breaker opening) are lost.
    // Redis when REDIS_URL holds a URL, else process memory.
    run(store_from_env("REDIS_URL").await?).await
}

async fn run(store: BoxLeaseStore) -> Result<(), Box<dyn Error>> {
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_second(1).burst(2).name("hyper").build()?)
        .key(PeerIp::new())
        .legacy_headers(true)
        .build()?;
    let service = layer.layer(tower::service_fn(hello));

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    println!(
        "Hyper server listening on http://{}/ (policy \"hyper\": 1 per second, bursts of 2, per peer IP)",
        listener.local_addr()?
    );
    loop {
        let (stream, peer) = listener.accept().await?;
        let service = service.clone();
        let per_connection = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(peer);
            service.clone().oneshot(request)
        });
        tokio::spawn(async move {
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), per_connection)
                .await
            {
                eprintln!("connection from {peer}: {error}");
            }
        });
    }
}
