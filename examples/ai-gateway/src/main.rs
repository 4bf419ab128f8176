// Run with: cargo run -p ai-gateway
//! An OpenAI-compatible gateway with token budgets per API key: tokens
//! per minute, requests per minute and streams in flight, reserved when a
//! request arrives and settled from the (streamed) response when it ends.
//! The model behind it is an in-process fake (`src/upstream.rs`), so it
//! runs without network; `src/lib.rs` says what the gateway does.
//!
//! State lives in process memory, or in Redis when `REDIS_URL` is set
//! (`REDIS_URL=redis://127.0.0.1:6379 cargo run -p ai-gateway`), so
//! several instances share the budgets. The server listens on
//! 127.0.0.1:3000, or on the port in `PORT`. Try it with curl, or any
//! OpenAI client pointed at `http://127.0.0.1:3000/v1`:
//!
//! ```text
//! curl -sN http://127.0.0.1:3000/v1/chat/completions -H 'authorization: Bearer sk-demo' \
//!   -H 'content-type: application/json' \
//!   -d '{"model":"fake","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}'
//! ```
//!
//! The answer streams word by word and ends with a `usage` event; the
//! response's `RateLimit` header shows the key's tokens after the
//! reservation. Send the same request with `"max_tokens":30000` and it is
//! refused with `400` (more than the 20 000 tokens a minute ever holds);
//! send ten of `"max_tokens":5000` at once and the ones that do not fit
//! are answered `429` naming `tokens-per-minute` (or `api-key-in-flight`
//! past two streams at once). `RUST_LOG=portcullis_tower=debug` shows
//! each settlement.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;

use ai_gateway::{app, Limits};
use portcullis::redis::RedisStore;
use portcullis::{MemoryStore, ReservationStore};

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
        Err(_) => 3000,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => {
            let store = RedisStore::builder().url(url.trim()).build().await?;
            println!(
                "budgets in Redis at {}",
                portcullis::redis::redact_url(url.trim())
            );
            serve(store, addr).await
        }
        _ => {
            println!("budgets in process memory (set REDIS_URL to share them)");
            serve(MemoryStore::new(), addr).await
        }
    }
}

async fn serve<St: ReservationStore>(store: St, addr: SocketAddr) -> Result<(), Box<dyn Error>> {
    let app = app(store, &Limits::default())?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "ai-gateway listening on http://{}/v1",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
