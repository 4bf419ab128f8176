//! `TokenBudgetLayer` end to end with `tower::ServiceExt::oneshot`, on
//! `MemoryStore` and on Redis: a streamed response that used less than
//! its estimate is refunded, one that used more is charged up to the cap;
//! a client that goes away mid-stream settles at the estimate and frees
//! its place in flight; ten concurrent requests admit exactly those that
//! fit; hostile estimates, bodies and claimed usages.

use crate::redis_common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use portcullis_core::{ManualClock, MemoryStore, Policy, ReservationStore, Store, TokenBudget};
use portcullis_tests::unique_prefix;
use portcullis_tower::{ApiKey, Estimate, TokenBudgetLayer, TokenRequestBody};
use redis_common::{client, manual_clock};
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};

/// One frame of a streamed body, and a stream of them.
type Chunk = Result<http_body::Frame<Bytes>, Infallible>;
type Chunks = futures::stream::BoxStream<'static, Chunk>;
type Frames = StreamBody<Chunks>;
/// A streaming upstream of the token layer's tests.
type Upstream = tower::util::BoxCloneSyncService<
    Request<TokenRequestBody<Full<Bytes>>>,
    Response<Frames>,
    Infallible,
>;

/// 1 000 tokens and 100 requests per hour, two streams at once, overage
/// at most 100.
fn budget() -> TokenBudget {
    TokenBudget::tokens(Policy::per_hour(1_000).name("tokens").build().unwrap())
        .requests(Policy::per_hour(100).name("requests").build().unwrap())
        .max_in_flight(2)
        .max_overage(100)
        .build()
        .unwrap()
}

/// SSE chunks ending with a usage event of `total` tokens.
fn sse(total: u64) -> Vec<Bytes> {
    vec![
        Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"),
        Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n"),
        Bytes::from(format!(
            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{},\"total_tokens\":{total}}}}}\n\ndata: [DONE]\n\n",
            total - 3
        )),
    ]
}

fn streamed(chunks: Vec<Bytes>) -> Response<Frames> {
    let stream = futures::stream::iter(chunks.into_iter().map(|c| Ok(http_body::Frame::data(c))));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(StreamBody::new(stream.boxed()))
        .unwrap()
}

/// An upstream that streams `sse(total)` where `total` is the request's
/// `x-upstream-usage` header (the test's stand-in for the model).
fn upstream() -> impl Service<
    Request<TokenRequestBody<Full<Bytes>>>,
    Response = Response<Frames>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(
        |request: Request<TokenRequestBody<Full<Bytes>>>| async move {
            let total = request
                .headers()
                .get("x-upstream-usage")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(10);
            Ok::<_, Infallible>(streamed(sse(total)))
        },
    )
}

fn request(estimate: u64, usage: u64) -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("x-api-key", "sk-1")
        .header("x-upstream-usage", usage.to_string())
        .body(Full::new(Bytes::from(format!(
            "{{\"max_tokens\":{estimate},\"stream\":true}}"
        ))))
        .unwrap()
}

/// Tokens left to `key-1`'s token policy.
async fn left<St: Store>(store: &St, budget: &TokenBudget) -> u64 {
    let subject =
        portcullis_tower::KeyExtractor::extract(&ApiKey::new(), &request(0, 0).into_parts().0)
            .unwrap();
    store
        .peek(&subject, &budget.token_policies()[..1])
        .await
        .unwrap()
        .decisions()[0]
        .remaining()
}

/// The body of `{"max_tokens":N,"stream":true}` counts a quarter of its
/// bytes as prompt.
fn prompt(estimate: u64) -> u64 {
    (format!("{{\"max_tokens\":{estimate},\"stream\":true}}").len() as u64).div_ceil(4)
}

async fn refunds_and_overage<St: ReservationStore + Store + Clone>(store: St) {
    let budget = budget();
    let layer = TokenBudgetLayer::builder(store.clone(), budget.clone(), ApiKey::new())
        .estimate(Estimate::json_max_tokens())
        .build();
    let service = layer.layer(upstream());
    // Reserved 300 and the prompt; used 120: the rest refunded.
    let response = service.clone().oneshot(request(300, 120)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let ratelimit = response.headers()["ratelimit"].to_str().unwrap().to_owned();
    let reserved = 1_000 - 300 - prompt(300);
    assert!(
        ratelimit.starts_with(&format!("\"tokens\";r={reserved};")),
        "{ratelimit}"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        body.ends_with(b"data: [DONE]\n\n"),
        "the stream passes intact"
    );
    assert_eq!(left(&store, &budget).await, 880);
    // Reserved 50 and the prompt; used 400: charged up to 100 beyond.
    let response = service.clone().oneshot(request(50, 400)).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert_eq!(left(&store, &budget).await, 880 - (50 + prompt(50) + 100));
    // A request claiming a tiny usage of its own changes nothing: only the
    // upstream's report counts.
    let mut claim = request(10, 200);
    claim
        .headers_mut()
        .insert("x-usage-total-tokens", "1".parse().unwrap());
    let before = left(&store, &budget).await;
    let response = service.oneshot(claim).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert_eq!(
        left(&store, &budget).await,
        before - (10 + prompt(10) + 100)
    );
}

#[tokio::test]
async fn a_stream_is_refunded_or_charged_up_to_the_cap() {
    refunds_and_overage(MemoryStore::with_clock(manual_clock())).await;
    let clock = manual_clock();
    refunds_and_overage(
        redis_common::standalone(&unique_prefix("rsv-layer"), client(&clock)).await,
    )
    .await;
}

/// A request for `n` choices reserves `n` times its `max_tokens`: asking
/// for fifty answers to one prompt is not estimated as one.
#[tokio::test]
async fn several_choices_are_estimated_at_each_choice() {
    let store = MemoryStore::with_clock(manual_clock());
    let budget = budget();
    let layer = TokenBudgetLayer::builder(store.clone(), budget.clone(), ApiKey::new())
        .estimate(Estimate::json_max_tokens())
        .build();
    let service = layer.layer(upstream());
    let body = "{\"max_tokens\":100,\"n\":5,\"stream\":true}";
    let many = Request::post("/v1/chat/completions")
        .header("x-api-key", "sk-1")
        .header("x-upstream-usage", "10")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = service.clone().oneshot(many).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let ratelimit = response.headers()["ratelimit"].to_str().unwrap().to_owned();
    let reserved = 1_000 - 5 * 100 - (body.len() as u64).div_ceil(4);
    assert!(
        ratelimit.starts_with(&format!("\"tokens\";r={reserved};")),
        "{ratelimit}"
    );
    let zero = Request::post("/v1/chat/completions")
        .header("x-api-key", "sk-1")
        .body(Full::new(Bytes::from("{\"max_tokens\":100,\"n\":0}")))
        .unwrap();
    let refused = service.oneshot(zero).await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
}

/// An SSE upstream whose first response streams what the test sends on
/// the returned sender, and whose later responses stream `later()`.
fn streaming_upstream(later: fn() -> Chunks) -> (mpsc::UnboundedSender<Chunk>, Upstream) {
    let (sender, receiver) = mpsc::unbounded::<Chunk>();
    let receiver = Arc::new(std::sync::Mutex::new(Some(receiver)));
    let upstream = tower::service_fn(move |_request: Request<TokenRequestBody<Full<Bytes>>>| {
        let receiver = receiver.lock().ok().and_then(|mut r| r.take());
        async move {
            let stream: Chunks = match receiver {
                Some(receiver) => receiver.boxed(),
                None => later(),
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(StreamBody::new(stream))
                    .unwrap(),
            )
        }
    });
    (sender, tower::util::BoxCloneSyncService::new(upstream))
}

/// A stream the client stops reading after its first chunk: settled at
/// the estimate (no usage was seen), and its place in flight is free.
async fn disconnect<St: ReservationStore + Store + Clone>(store: St) {
    let budget = budget();
    let (sender, upstream) = streaming_upstream(|| {
        futures::stream::iter(sse(10).into_iter().map(|c| Ok(http_body::Frame::data(c)))).boxed()
    });
    let layer = TokenBudgetLayer::builder(store.clone(), budget.clone(), ApiKey::new())
        .estimate(Estimate::json_max_tokens())
        .build();
    let service = layer.layer(upstream);
    let response = service.clone().oneshot(request(200, 0)).await.unwrap();
    let mut body = response.into_body();
    sender
        .unbounded_send(Ok(http_body::Frame::data(sse(10).remove(0))))
        .unwrap();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    // Two places: this stream holds one; a second request takes the other.
    let second = service.clone().oneshot(request(10, 10)).await.unwrap();
    let third = service.clone().oneshot(request(10, 10)).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let error = third.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&error).contains("budget-in-flight"),
        "{error:?}"
    );
    second.into_body().collect().await.unwrap();
    // The client goes away.
    drop(body);
    drop(sender);
    // Redis settles on the runtime: waited for (5 s at most), not timed.
    let after = 1_000 - (200 + prompt(200)) - 10;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while left(&store, &budget).await != after && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left(&store, &budget).await, after);
    let next = service.clone().oneshot(request(10, 10)).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK, "the place was freed");
    next.into_body().collect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_settles_at_the_estimate_and_frees_its_place() {
    disconnect(MemoryStore::with_clock(manual_clock())).await;
    let clock = manual_clock();
    disconnect(redis_common::standalone(&unique_prefix("rsv-gone"), client(&clock)).await).await;
}

/// Ten requests of 150 at once against 1 000 (no place limit): six are
/// admitted; the upstream holds them until all ten are decided.
async fn ten_at_once<St: ReservationStore + Store + Clone>(store: St) {
    let budget = TokenBudget::tokens(Policy::per_hour(1_000).name("tokens").build().unwrap())
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let upstream = {
        let gate = Arc::clone(&gate);
        tower::service_fn(move |_r: Request<TokenRequestBody<Full<Bytes>>>| {
            let gate = Arc::clone(&gate);
            async move {
                let _permit = gate.acquire().await;
                Ok::<_, Infallible>(streamed(sse(150)))
            }
        })
    };
    let layer = TokenBudgetLayer::builder(store, budget, ApiKey::new())
        .estimate(Estimate::header(http::HeaderName::from_static(
            "x-estimate",
        )))
        .build();
    let service = layer.layer(upstream);
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let service = service.clone();
            let request = Request::post("/")
                .header("x-api-key", "sk-1")
                .header("x-estimate", "150")
                .body(Full::new(Bytes::new()))
                .unwrap();
            tokio::spawn(service.oneshot(request))
        })
        .collect();
    // The refused answer at once and the admitted wait at the gate; the
    // gate opens after a while, but the count holds either way (each
    // stream uses its estimate exactly, so none gives tokens back).
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.add_permits(10);
    let mut statuses = Vec::new();
    for call in calls {
        let response = call.await.unwrap().unwrap();
        statuses.push(response.status());
        response.into_body().collect().await.unwrap();
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 6, "{statuses:?}");
    assert_eq!(statuses.len() - ok, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_concurrent_requests_admit_exactly_those_that_fit() {
    ten_at_once(MemoryStore::with_clock(manual_clock())).await;
    let clock = manual_clock();
    ten_at_once(redis_common::standalone(&unique_prefix("rsv-ten-layer"), client(&clock)).await)
        .await;
}

/// Hostile estimates: answered before anything is reserved.
#[tokio::test]
async fn hostile_estimates_are_refused_before_anything_is_reserved() {
    let store = MemoryStore::with_clock(ManualClock::new(1_700_000_000_000_000));
    let budget = budget();
    let by_header = TokenBudgetLayer::builder(store.clone(), budget.clone(), ApiKey::new())
        .estimate(Estimate::header(http::HeaderName::from_static("x-estimate")).or_default(7))
        .build()
        .layer(upstream());
    for (value, status) in [
        ("-5", StatusCode::BAD_REQUEST),
        ("12abc", StatusCode::BAD_REQUEST),
        ("1e9", StatusCode::BAD_REQUEST),
        ("99999999999999999999999", StatusCode::BAD_REQUEST),
        ("1001", StatusCode::BAD_REQUEST),
    ] {
        let request = Request::post("/")
            .header("x-api-key", "sk-1")
            .header("x-estimate", value)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = by_header.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), status, "{value}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(!body.is_empty(), "{value}: a reason is given");
    }
    assert_eq!(left(&store, &budget).await, 1_000, "nothing was reserved");
    assert_eq!(store.reservations(), 0);
    // Missing: the default, 7.
    let request = Request::post("/")
        .header("x-api-key", "sk-1")
        .header("x-upstream-usage", "7")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = by_header.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    assert_eq!(left(&store, &budget).await, 993);
    // No key: 401, nothing reserved.
    let request = Request::post("/").body(Full::new(Bytes::new())).unwrap();
    let response = by_header.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("missing_key"),
        "{body:?}"
    );

    let by_body = TokenBudgetLayer::builder(store.clone(), budget.clone(), ApiKey::new())
        .estimate(Estimate::json_max_tokens().max_body(64))
        .build()
        .layer(upstream());
    for (body, status) in [
        (
            format!("{{\"max_tokens\":1,\"pad\":\"{}\"}}", "x".repeat(100)),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        ("{\"max_tokens\":-1}".to_owned(), StatusCode::BAD_REQUEST),
        ("{\"max_tokens\":2.5}".to_owned(), StatusCode::BAD_REQUEST),
        (
            "{\"max_tokens\":\"10\"}".to_owned(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "{\"max_tokens\":18446744073709551615}".to_owned(),
            StatusCode::BAD_REQUEST,
        ),
        ("not json".to_owned(), StatusCode::BAD_REQUEST),
    ] {
        let request = Request::post("/")
            .header("x-api-key", "sk-1")
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let response = by_body.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), status, "{body}");
    }
    assert_eq!(
        left(&store, &budget).await,
        993,
        "nothing more was reserved"
    );
    assert_eq!(store.reservations(), 1, "only the one admitted");
}

/// A stream that runs past the reservation TTL keeps its reservation and
/// its place in flight: the layer renews it every half TTL while it
/// streams (tokio's paused clock wakes the renewals; the store's manual
/// clock moves with it), and the usage is settled at the end.
#[tokio::test(start_paused = true)]
async fn a_stream_longer_than_the_ttl_keeps_its_reservation() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::with_clock(clock.clone());
    let budget = TokenBudget::tokens(Policy::per_hour(1_000).name("tokens").build().unwrap())
        .max_in_flight(1)
        .reservation_ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let (sender, upstream) = streaming_upstream(|| futures::stream::empty().boxed());
    let service = TokenBudgetLayer::builder(store.clone(), budget.clone(), ApiKey::new())
        .estimate(Estimate::fixed(200))
        .build()
        .layer(upstream);
    let response = service.clone().oneshot(request(200, 0)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // Three half-TTLs: 15 s, past the 10 s TTL.
    for _ in 0..3 {
        clock.advance(Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(5)).await;
        // Let the renewal run.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    // Still open: its place is held, so a second stream is refused.
    let second = service.clone().oneshot(request(10, 10)).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    second.into_body().collect().await.unwrap();
    assert_eq!(store.reservations(), 1);
    // The stream ends reporting 50 tokens: settled, 150 refunded. (An
    // expired reservation would settle as unknown, its 200 kept.) 15 s at
    // 1 000 per hour refilled 4 more.
    for chunk in sse(50) {
        sender
            .unbounded_send(Ok(http_body::Frame::data(chunk)))
            .unwrap();
    }
    drop(sender);
    while body.frame().await.is_some() {}
    drop(body);
    let refilled = 15 * 1_000 / 3_600;
    assert_eq!(left(&store, &budget).await, 1_000 - 50 + refilled);
    let next = service.oneshot(request(10, 10)).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK, "the place was freed");
}
