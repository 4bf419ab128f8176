// Run with: cargo run -p slow-exports
//! A slow endpoint limited per tenant in two ways at once: at most two
//! exports **running** per tenant (a [`ConcurrencyLimitLayer`]: leases that
//! are released when the response has been sent, renewed while the export
//! runs, and expire if the instance dies), and at most ten **started** per
//! minute per tenant (a [`RateLimitLayer`]).
//!
//! State lives in process memory, or in Redis when `REDIS_URL` is set
//! (`REDIS_URL=redis://127.0.0.1:6379 cargo run -p slow-exports`): then
//! every instance shares both limits. Either way it is one
//! [`BoxLeaseStore`] from
//! [`store_from_env`], boxed with its leases, so one store serves both
//! layers and nothing is generic over it (where the state lives is logged
//! at start-up). The server listens on
//! 127.0.0.1:3001, or on the port in `PORT`. Each export takes
//! `EXPORT_SECS` seconds (default 5). Try three at once for one tenant:
//!
//! ```text
//! for i in 1 2 3; do curl -s -X POST -H 'x-tenant: acme' http://127.0.0.1:3001/exports & done; wait
//! ```
//!
//! Two run; the third gets `429` with `Retry-After` (when the earliest
//! running export's lease would expire). Another tenant is not affected:
//! `curl -X POST -H 'x-tenant: globex' http://127.0.0.1:3001/exports`.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::http::{HeaderName, StatusCode};
use axum::routing::post;
use axum::Router;
use portcullis::redis::store_from_env;
use portcullis::tower::{ConcurrencyLimitLayer, Header, MissingKey, RateLimitLayer};
use portcullis::{BoxLeaseStore, ConcurrencyPolicy, Policy};

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(start().await)
}

async fn start() -> Result<(), Box<dyn Error>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|e| format!("PORT={port:?} is not a port number: {e}"))?,
        Err(_) => 3001,
    };
    let export_secs: u64 = match std::env::var("EXPORT_SECS") {
        Ok(secs) => secs
            .parse()
            .map_err(|e| format!("EXPORT_SECS={secs:?} is not a number of seconds: {e}"))?,
        Err(_) => 5,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // Redis when REDIS_URL holds a URL (connected now, so a wrong URL fails
    // here), else process memory; one type either way, with leases.
    let store = store_from_env("REDIS_URL").await?;
    serve(store, addr, export_secs).await
}

async fn serve(
    store: BoxLeaseStore,
    addr: SocketAddr,
    export_secs: u64,
) -> Result<(), Box<dyn Error>> {
    let tenant = Header::new(HeaderName::from_static("x-tenant"));
    let missing = MissingKey::reject(StatusCode::BAD_REQUEST, "send an x-tenant header\n");
    // At most two exports running per tenant. A lease lives 30 s unless the
    // instance renews it (every 10 s while the export runs).
    let running = ConcurrencyLimitLayer::builder(store.clone())
        .policy(
            ConcurrencyPolicy::max_in_flight(2)
                .lease_ttl(Duration::from_secs(30))
                .name("exports-running")
                .build()?,
        )
        .key(tenant.clone())
        .on_missing_key(missing.clone())
        .build()?;
    // At most ten exports started per minute per tenant.
    let started = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(10).name("exports-started").build()?)
        .key(tenant)
        .on_missing_key(missing)
        .build()?;
    let app = Router::new()
        .route(
            "/exports",
            post(move || async move {
                tokio::time::sleep(Duration::from_secs(export_secs)).await;
                "export ready\n"
            }),
        )
        // The rate limit (outer) runs first; only requests it admits take
        // a concurrency permit.
        .layer(running)
        .layer(started);

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "slow-exports listening on http://{}/exports",
        listener.local_addr()?
    );
    println!("per tenant (x-tenant header): 2 exports running at once, 10 started per minute; each takes {export_secs} s");
    println!("try: for i in 1 2 3; do curl -s -X POST -H 'x-tenant: acme' http://{addr}/exports & done; wait");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
