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

use std::error::Error;
use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use tollgate::redis::RedisStore;
use tollgate::tower::{PeerIp, RateLimitLayer};
use tollgate::{MemoryStore, Policy, Store};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
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

    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let store = RedisStore::builder().url(&url).build().await?;
            store
                .ping()
                .await
                .map_err(|e| format!("cannot reach Redis at {url}: {e}"))?;
            serve(store, policy, addr, &format!("Redis at {url}")).await
        }
        _ => serve(MemoryStore::new(), policy, addr, "process memory").await,
    }
}

async fn serve<St: Store>(
    store: St,
    policy: Policy,
    addr: SocketAddr,
    store_name: &str,
) -> Result<(), Box<dyn Error>> {
    let layer = RateLimitLayer::builder(store)
        .policy(policy.clone())
        .key(PeerIp::new())
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "Hello from tollgate!\n" }))
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "tollgate quickstart listening on http://{}/",
        listener.local_addr()?
    );
    println!(
        "policy {:?}: {} requests per {} s per client IP ({}), state in {store_name}",
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
