// Run with: cargo run -p tiered-api
//! Per-API-token and per-user limits, with plans.
//!
//! Two layers:
//!
//! 1. Outermost, per bearer token (hashed): 20 per second. It runs before
//!    authentication, so even unknown tokens cannot hammer the token lookup.
//! 2. After authentication, per user: the user's plan picks a tier, and each
//!    tier has two policies checked together (a per-minute rate and a daily
//!    quota). Free: 5 per minute and 50 per day; pro: 60 per minute and
//!    10 000 per day.
//!
//! Each response lists both layers' policies in `RateLimit` and
//! `RateLimit-Policy` (the outer layer appends to the inner one's lists).
//!
//! State lives in process memory, or in Redis when `REDIS_URL` is set (so
//! several instances share one limit), picked at start-up into a
//! `BoxLeaseStore` so the app is not generic over the store. Logs go to stderr (`RUST_LOG`).
//! Listens on 127.0.0.1:3000 or the port in `PORT`. Try:
//!
//! ```text
//! curl -i -H 'authorization: Bearer free-token' http://127.0.0.1:3000/me
//! curl -i -H 'authorization: Bearer pro-token'  http://127.0.0.1:3000/me
//! ```

use std::error::Error;
use std::fmt;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use portcullis::redis::store_from_env;
use portcullis::tower::{BearerToken, MissingKey, RateLimitInfo, RateLimitLayer, User};
use portcullis::{BoxLeaseStore, Policy};

/// The authenticated user, put in the extensions by `authenticate`.
#[derive(Debug, Clone)]
struct UserId(&'static str);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user:{}", self.0)
    }
}

/// The user's plan.
#[derive(Debug, Clone, Copy)]
enum Plan {
    Free,
    Pro,
}

/// A stand-in for a token table: token → user and plan.
fn lookup(token: &str) -> Option<(UserId, Plan)> {
    match token {
        "free-token" => Some((UserId("alice"), Plan::Free)),
        "pro-token" | "pro-token-2" => Some((UserId("bob"), Plan::Pro)),
        _ => None,
    }
}

async fn authenticate(mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token.and_then(lookup) {
        Some((user, plan)) => {
            request.extensions_mut().insert(user);
            request.extensions_mut().insert(plan);
            next.run(request).await
        }
        None => (StatusCode::UNAUTHORIZED, "unknown token\n").into_response(),
    }
}

async fn me(
    Extension(user): Extension<UserId>,
    Extension(limit): Extension<RateLimitInfo>,
) -> String {
    let quotas: Vec<String> = limit
        .policies()
        .iter()
        .zip(limit.verdict().decisions())
        .map(|(policy, decision)| format!("{}: {} left", policy.name(), decision.remaining()))
        .collect();
    format!(
        "hello {user} (tier {}): {}\n",
        limit.tier(),
        quotas.join(", ")
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(start().await)
}

async fn start() -> Result<(), Box<dyn Error>> {
    // Without a subscriber, the limiter's warnings (requests let through
    // because the store failed, the circuit breaker opening) are lost.
    // The store is picked at start-up; `BoxLeaseStore` holds either, so nothing
    // below is generic over it.
    let store = store_from_env("REDIS_URL").await?;
    serve(store).await
}

/// Both layers share `store` (a clone shares its state).
async fn serve(store: BoxLeaseStore) -> Result<(), Box<dyn Error>> {
    // Per token, before authentication; requests without a token get 401.
    let per_token = RateLimitLayer::builder(store.clone())
        .policy(Policy::per_second(20).name("token-burst").build()?)
        .key(BearerToken::new())
        .on_missing_key(MissingKey::reject(
            StatusCode::UNAUTHORIZED,
            "send a bearer token\n",
        ))
        .build()?;

    // Per user, after authentication, by plan. Bob's two tokens share his
    // per-user limit.
    let per_user = RateLimitLayer::builder(store)
        .key(User::<UserId>::new())
        .policies([
            Policy::per_minute(5).name("free-minute").build()?,
            Policy::per_day(50).name("free-day").build()?,
        ])
        .tier(
            "pro",
            [
                Policy::per_minute(60).name("pro-minute").build()?,
                Policy::per_day(10_000).name("pro-day").build()?,
            ],
        )
        .tier_by(|request| match request.extensions().get::<Plan>()? {
            Plan::Pro => Some("pro"),
            Plan::Free => None,
        })
        .legacy_headers(true)
        .info_in_extensions(true)
        .build()?;

    // The last layer added runs first: per token, then authenticate, then
    // per user.
    let app = Router::new()
        .route("/me", get(me))
        .layer(per_user)
        .layer(middleware::from_fn(authenticate))
        .layer(per_token);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!("tiered API listening on http://{addr}/me");
    println!("policies: per token 20/s; free users 5/min + 50/day; pro users 60/min + 10000/day");
    println!("try: curl -i -H 'authorization: Bearer free-token' http://{addr}/me");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
