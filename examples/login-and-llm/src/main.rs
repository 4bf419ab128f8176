// Run with: cargo run -p login-and-llm
//! Charging after the response, on Axum: costs known only once the
//! handler has run.
//!
//! - `POST /login` (headers `x-username`, `x-password`): at most 5 **failed**
//!   logins per 15 minutes per (client IP, username). A failure is a `401`
//!   response, charged 1 after the fact; a success costs nothing. The sixth
//!   failure (and any attempt after it, right password or not) is refused
//!   with `429` before the handler runs, until a failure's worth of time
//!   (3 minutes) has passed.
//! - `POST /v1/complete` (header `x-api-key`, the prompt as the body):
//!   10 000 tokens per minute per API key, charged by the `x-tokens-used`
//!   header of each response (here 1 000 tokens per word of the prompt). A
//!   response may take the key past its budget (a debt, capped at one
//!   minute's worth); the next request waits until it is paid back. A
//!   prompt starting with `cached:` is answered from a cache and refunded
//!   through the `Charge` handle.
//!
//! State lives in process memory, or in Redis when `REDIS_URL` is set
//! (`REDIS_URL=redis://127.0.0.1:6379 cargo run -p login-and-llm`), so
//! several instances share it. The server listens on 127.0.0.1:3000, or
//! on the port in `PORT`. Try it:
//!
//! ```text
//! for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' -X POST \
//!   -H 'x-username: alice' -H 'x-password: wrong' http://127.0.0.1:3000/login; done
//! for i in $(seq 4); do curl -s -o /dev/null -w '%{http_code}\n' -X POST -H 'x-api-key: k1' \
//!   --data 'tell me a story about a rate limiter' http://127.0.0.1:3000/v1/complete; done
//! ```
//!
//! The first prints 401 five times, then 429; the second 200, 200, then
//! 429 (8 words = 8 000 tokens per answer: the second leaves a debt of
//! 6 000, paid back in 36 seconds). `RUST_LOG=portcullis_tower=debug` shows every decision and charge.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use portcullis::redis::store_from_env;
use portcullis::tower::{ApiKey, Charge, Header, PeerIp, RateLimitLayer};
use portcullis::{BoxStore, Policy};

/// Tokens a prompt "uses" in this demo: 1 000 per word.
const TOKENS_PER_WORD: u64 = 1_000;

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
    // Redis when REDIS_URL is set (connected and checked now), else memory;
    // where the state lives is logged.
    let store: BoxStore = store_from_env("REDIS_URL").await?.into();

    // 5 failed logins per 15 minutes per (client IP, username).
    let failed_logins = RateLimitLayer::builder(store.clone())
        .policy(
            Policy::per(5, Duration::from_secs(15 * 60))
                .name("failed-logins")
                .build()?,
        )
        .key((
            PeerIp::new(),
            Header::new(HeaderName::from_static("x-username")),
        ))
        .charge_from_response(|parts| u64::from(parts.status == StatusCode::UNAUTHORIZED))
        .build()?;
    // 10 000 tokens per minute per API key (hashed before it is stored).
    let tokens = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(10_000).name("llm-tokens").build()?)
        .key(ApiKey::new())
        .charge_from_response(|parts| {
            parts
                .headers
                .get("x-tokens-used")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0)
        })
        .build()?;

    let app = Router::new()
        .route("/login", post(login).layer(failed_logins))
        .route("/v1/complete", post(complete).layer(tokens));

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "login-and-llm listening on http://{}/",
        listener.local_addr()?
    );
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

/// Accepts the password `open sesame`; anything else is a `401`, which the
/// layer charges.
async fn login(headers: HeaderMap) -> (StatusCode, &'static str) {
    if headers
        .get("x-password")
        .is_some_and(|p| p.as_bytes() == b"open sesame")
    {
        (StatusCode::OK, "welcome\n")
    } else {
        (StatusCode::UNAUTHORIZED, "wrong username or password\n")
    }
}

/// A stand-in for an LLM call: reports the tokens it used in
/// `x-tokens-used`; a cached answer is refunded through the `Charge`
/// handle.
async fn complete(charge: Option<Extension<Charge>>, prompt: String) -> (HeaderMap, String) {
    let words = u64::try_from(prompt.split_whitespace().count()).unwrap_or(u64::MAX);
    let used = words.saturating_mul(TOKENS_PER_WORD);
    let mut headers = HeaderMap::new();
    headers.insert("x-tokens-used", used.into());
    if prompt.starts_with("cached:") {
        if let Some(Extension(charge)) = charge {
            // Served from a cache: costs nothing after all.
            charge.refund(used);
        }
        return (headers, "(from the cache) once upon a time…\n".to_owned());
    }
    (headers, format!("a story of {words} words…\n"))
}
