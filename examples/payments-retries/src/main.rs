// Run with: cargo run -p payments-retries
//! Idempotent charges and priority classes through `RateLimitLayer`.
//!
//! State lives in process memory, or in Redis when `REDIS_URL` is set
//! (`REDIS_URL=redis://127.0.0.1:6379 cargo run -p payments-retries`).
//! The program sends requests through the layer in process and prints what
//! each got:
//!
//! 1. **Retries are free, within reason.** A payment retried with the same
//!    `Idempotency-Key` (the client timed out, the request had in fact
//!    gone through) is answered as the first attempt was and charged
//!    nothing, twice at most; a new key is charged, and so is the same key
//!    on another request (a client cannot reuse one key to pass).
//! 2. **Critical traffic keeps its share.** One tenant's allowance of 10
//!    per hour is shared by three classes: `batch` may spend it while half
//!    remains, `interactive` while 20 % remains, `critical` all of it. The
//!    class comes from the route (the operator's choice), never from the
//!    client: a request claiming `x-priority: critical` gets nothing for it.

use std::convert::Infallible;
use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use http::{HeaderName, Request, Response};
use portcullis::redis::store_from_env;
use portcullis::tower::{Header, RateLimitLayer, RequestHead};
use portcullis::Policy;
use tower::{service_fn, Layer, ServiceExt};

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(run().await)
}

async fn run() -> Result<(), Box<dyn Error>> {
    let store = store_from_env("REDIS_URL").await?;
    // One run's subjects, so a second run against the same Redis starts fresh.
    let run_id = std::process::id();
    let handler = service_fn(|_request: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok\n")))
    });

    // 1. Payments: 3 per hour per account; retries within 10 minutes free.
    let payments = RateLimitLayer::builder(store.clone())
        .policy(Policy::per_hour(3).name("payments").build()?)
        .key(Header::new(HeaderName::from_static("x-account")))
        .idempotency_key(
            Header::new(HeaderName::from_static("idempotency-key")),
            Duration::from_secs(600),
        )
        .build()?
        .layer(handler);
    let account = format!("acme-{run_id}");
    println!("payments: 3 per hour for account {account}");
    for (path, key) in [
        ("/pay", "pay-1"),
        ("/pay", "pay-1"),
        ("/pay", "pay-1"),
        ("/refund", "pay-1"),
        ("/pay", "pay-2"),
        ("/pay", "pay-3"),
        ("/pay", "pay-3"),
    ] {
        let request = Request::post(path)
            .header("x-account", &account)
            .header("idempotency-key", key)
            .body(String::new())?;
        let response = payments.clone().oneshot(request).await?;
        let remaining = response
            .headers()
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        println!(
            "  POST {path:<7} Idempotency-Key {key}: {} ({remaining})",
            response.status()
        );
    }

    // 2. Priority classes over one shared allowance.
    let api = Policy::per_hour(10)
        .name("api")
        .class("critical", 0)
        .class("interactive", 20)
        .class("batch", 50)
        .build()?;
    // The class is granted by the route: a request names none itself.
    let class_of_route = |request: &RequestHead<'_>| {
        let class = match request.uri().path() {
            "/checkout" => "critical",
            "/search" => "interactive",
            _ => "batch",
        };
        Some(class.to_owned())
    };
    let classes = RateLimitLayer::builder(store)
        .policy(api)
        .key(Header::new(HeaderName::from_static("x-tenant")))
        .priority(class_of_route)
        .build()?
        .layer(handler);
    let tenant = format!("tenant-{run_id}");
    println!("api: 10 per hour for {tenant}; batch keeps 50 %, interactive 20 % in reserve");
    for path in ["/export"; 7]
        .into_iter()
        .chain(["/search"; 4])
        .chain(["/checkout"; 3])
    {
        let request = Request::get(path)
            .header("x-tenant", &tenant)
            // Ignored: a client does not choose its class.
            .header("x-priority", "critical")
            .body(String::new())?;
        let response = classes.clone().oneshot(request).await?;
        let retry = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(|s| format!(", Retry-After {s} s"))
            .unwrap_or_default();
        println!("  GET {path:<9} {}{retry}", response.status());
    }
    Ok(())
}
