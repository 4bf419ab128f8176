//! The token layer's warnings are rate-limited per layer: a flood of
//! requests refused as sent logs at most one line a second per layer, with
//! the count since the last. Its own test binary: `tracing` caches each
//! callsite's interest process-wide, and a test that counts log lines
//! under a scoped subscriber can miss its lines when another test hits the
//! same callsite on another thread at the moment the subscriber is set
//! (seen once: the tokens suite's hostile-estimates test refuses the same
//! way, and this test read no line).

mod log_capture;

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use portcullis_core::{ManualClock, MemoryStore, Policy, Store, TokenBudget};
use portcullis_tower::{ApiKey, Estimate, KeyExtractor, TokenBudgetLayer, TokenRequestBody};
use tower::{Layer, ServiceExt};

fn budget() -> TokenBudget {
    TokenBudget::tokens(Policy::per_hour(1_000).name("tokens").build().unwrap())
        .build()
        .unwrap()
}

fn upstream() -> impl tower::Service<
    Request<TokenRequestBody<Full<Bytes>>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(|_: Request<TokenRequestBody<Full<Bytes>>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
    })
}

/// Tokens left to `sk-1`.
async fn left(store: &MemoryStore, budget: &TokenBudget) -> u64 {
    let request = Request::post("/")
        .header("x-api-key", "sk-1")
        .body(())
        .unwrap();
    let subject = ApiKey::new().extract(&request.into_parts().0).unwrap();
    store
        .peek(&subject, &budget.token_policies()[..1])
        .await
        .unwrap()
        .decisions()[0]
        .remaining()
}

/// A request refused as sent logs a warning; a flood of them logs at most
/// one line a second per layer, with the count since the last, and one
/// layer's lines do not hide another's.
#[tokio::test]
async fn refused_estimates_do_not_flood_the_log() {
    let captured = log_capture::Captured::default();
    let _guard = tracing::dispatcher::set_default(&captured.dispatch(tracing::Level::WARN));
    let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000));
    let layer = |store: MemoryStore| {
        TokenBudgetLayer::builder(store, budget(), ApiKey::new())
            .estimate(Estimate::header(http::HeaderName::from_static(
                "x-estimate",
            )))
            .build()
            .layer(upstream())
    };
    let (first, second) = (layer(store.clone()), layer(store.clone()));
    let too_many = || {
        Request::post("/")
            .header("x-api-key", "sk-1")
            .header("x-estimate", "1001")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let started = std::time::Instant::now();
    let floods = 200_u64;
    for _ in 0..floods {
        let response = first.clone().oneshot(too_many()).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    let response = second.oneshot(too_many()).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let lines = captured.lines("refused to reserve");
    let seconds = started.elapsed().as_secs();
    // The first of each layer is logged at once; the rest wait for the
    // next second.
    assert!(lines.len() >= 2, "{lines:?}");
    assert!(
        lines.len() as u64 <= 2 + seconds,
        "{} lines in {seconds} s",
        lines.len()
    );
    assert_eq!(left(&store, &budget()).await, 1_000, "nothing was reserved");
}
