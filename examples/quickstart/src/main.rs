// Run with: cargo run -p quickstart
//! The quickstart: an Axum app whose `GET /` is limited per client IP.
//!
//! State lives in process memory, or in Redis when `REDIS_URL` is set
//! (`REDIS_URL=redis://127.0.0.1:6379 cargo run -p quickstart`). The server
//! listens on 127.0.0.1:3000, or on the port in `PORT`. Try it:
//!
//! ```text
//! for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! curl -i http://127.0.0.1:3000/
//! ```
//!
//! **Behind a reverse proxy or load balancer**, every request comes from
//! the proxy's address, so keying by the peer IP would put every client in
//! one bucket. Set `TRUSTED_PROXIES` to the proxies' networks and the
//! client address is read from `X-Forwarded-For`, walking from the right
//! past those proxies only (a client cannot spoof it):
//!
//! ```text
//! TRUSTED_PROXIES=10.0.0.0/8,127.0.0.1/32 cargo run -p quickstart
//! curl -H 'x-forwarded-for: 198.51.100.7' http://127.0.0.1:3000/
//! ```
//!
//! Logs (fail-open passes, the circuit breaker opening and closing) go to
//! stderr; `RUST_LOG=portcullis_tower=debug` shows every decision.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::routing::get;
use axum::Router;
use portcullis::redis::store_from_env;
use portcullis::tower::{BoxKeyExtractor, ClientIp, PeerIp, RateLimitLayer};
use portcullis::{BoxLeaseStore, Policy};

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(start().await)
}

async fn start() -> Result<(), Box<dyn Error>> {
    // Without a subscriber, the limiter's warnings (requests let through
    // because the store failed, the circuit breaker opening) are lost.
    // Five requests per minute per client IP: a burst of five, then one
    // every twelve seconds (GCRA, the default algorithm).
    let policy = Policy::per_minute(5).name("quickstart").build()?;
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|e| format!("PORT={port:?} is not a port number: {e}"))?,
        Err(_) => 3000,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));

    // Redis when REDIS_URL holds a URL, else process memory; one type
    // either way, so nothing below is generic over the store.
    let store = store_from_env("REDIS_URL").await?;

    match std::env::var("TRUSTED_PROXIES") {
        Ok(networks) if !networks.is_empty() => {
            let networks = networks
                .split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .map_err(|e| format!("TRUSTED_PROXIES: {n:?} is not a CIDR network: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            println!("client IP read from X-Forwarded-For behind {networks:?}");
            serve(
                store,
                BoxKeyExtractor::new(ClientIp::trusting(networks)),
                policy,
                addr,
            )
            .await
        }
        _ => serve(store, BoxKeyExtractor::new(PeerIp::new()), policy, addr).await,
    }
}

/// `key` is chosen at start-up (`PeerIp` or `ClientIp`, two types), so it is
/// held as a `BoxKeyExtractor`.
async fn serve(
    store: BoxLeaseStore,
    key: BoxKeyExtractor,
    policy: Policy,
    addr: SocketAddr,
) -> Result<(), Box<dyn Error>> {
    let layer = RateLimitLayer::builder(store)
        .policy(policy.clone())
        .key(key)
        .build()?;
    // `keep_body`: responses stay in Axum's own `Body`, so Axum does not
    // box a wrapper body on every response (the cheapest way on Axum).
    let app = Router::new()
        .route("/", get(|| async { "Hello from portcullis!\n" }))
        .layer(layer.keep_body());

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "portcullis quickstart listening on http://{}/",
        listener.local_addr()?
    );
    println!(
        "policy {:?}: {} requests per {} s per client ({})",
        policy.name(),
        policy.limit(),
        policy.period().as_secs(),
        policy.algorithm(),
    );
    println!("try: for i in $(seq 7); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/; done");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
