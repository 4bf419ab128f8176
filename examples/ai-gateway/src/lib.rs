//! The AI gateway of `main.rs`, as a library so its tests serve it: the
//! budget per API key ([`Limits`], [`budget`]), the Axum app ([`app`])
//! and the fake model behind it (`upstream.rs`).
//!
//! A request to `POST /v1/chat/completions` carries its API key as
//! `Authorization: Bearer <key>` (hashed before it reaches a store) and an
//! OpenAI-style JSON body. The gateway reserves `max_tokens` plus a
//! quarter of the body's bytes (the prompt) against the key's tokens per
//! minute, one request against its requests per minute, and one of its
//! streams in flight, in one atomic step; a request that does not fit is
//! answered `429` with `Retry-After` and an OpenAI-style error whose
//! `code` names the budget that refused. When the response ends (the
//! last SSE event carries `usage`, as OpenAI's do with
//! `stream_options.include_usage`), the reservation is settled: the
//! unused tokens come back, usage beyond the estimate is charged up to
//! the overage cap. A client that disconnects mid-stream is charged its
//! estimate and frees its stream at once.

use std::error::Error;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use portcullis::tower::{BearerToken, Estimate, TokenBudgetLayer};
use portcullis::{Policy, ReservationStore, TokenBudget};

mod upstream;

/// The limits every API key gets.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Tokens (prompt and completion) per minute.
    pub tokens_per_minute: u64,
    /// Requests per minute.
    pub requests_per_minute: u64,
    /// Responses streaming at once.
    pub streams: u64,
    /// The most tokens beyond its estimate one response is charged.
    pub max_overage: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            tokens_per_minute: 20_000,
            requests_per_minute: 60,
            streams: 2,
            max_overage: 2_000,
        }
    }
}

/// The budget of one API key under `limits`.
///
/// # Errors
///
/// When a limit is 0 or too large (the policy error says which).
pub fn budget(limits: &Limits) -> Result<TokenBudget, Box<dyn Error>> {
    Ok(TokenBudget::tokens(
        Policy::per_minute(limits.tokens_per_minute)
            .name("tokens-per-minute")
            .build()?,
    )
    .requests(
        Policy::per_minute(limits.requests_per_minute)
            .name("requests-per-minute")
            .build()?,
    )
    .name("api-key")
    .max_in_flight(limits.streams)
    .max_overage(limits.max_overage)
    // Longer than any response of the fake model; a real gateway sets
    // its upstream timeout below it.
    .reservation_ttl(Duration::from_secs(300))
    .build()?)
}

/// The gateway: `POST /v1/chat/completions` behind the token budget of
/// `limits`, its state in `store`.
///
/// # Errors
///
/// As [`budget`].
pub fn app<St: ReservationStore>(store: St, limits: &Limits) -> Result<Router, Box<dyn Error>> {
    let layer = TokenBudgetLayer::builder(store, budget(limits)?, BearerToken::new())
        // max_tokens plus the prompt; 1 024 when max_tokens is absent;
        // bodies up to 256 KiB.
        .estimate(
            Estimate::json_max_tokens()
                .max_body(256 * 1024)
                .or_default(1_024),
        )
        .build();
    Ok(Router::new()
        .route("/v1/chat/completions", post(upstream::chat))
        .layer(layer))
}
