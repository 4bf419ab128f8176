//! The layer over a `BoxStore`: a store chosen at run time behaves as the
//! concrete store, and any store can be the fallback store.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use portcullis_core::{BoxStore, MemoryStore, Policy, Store, StoreError, Verdict};
use portcullis_tower::{FailurePolicy, RateLimitLayer};
use tower::{service_fn, Layer, ServiceExt};

/// A store that answers only through its future, as a network store does.
struct Deferred(MemoryStore);

impl Store for Deferred {
    type CheckFuture = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send>>;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        let answer = self.0.check_now(subject, policies, cost);
        Box::pin(async move {
            tokio::task::yield_now().await;
            answer.expect("the memory store answers now")
        })
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.0.reset(subject, policies)
    }
}

/// A store that is always down.
struct Down;

impl Store for Down {
    type CheckFuture = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send>>;

    fn check(&self, _: &str, _: &[Policy], _: u64) -> Self::CheckFuture {
        Box::pin(async { Err(StoreError::unavailable("connection refused")) })
    }

    fn reset(
        &self,
        _: &str,
        _: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        std::future::ready(Ok(()))
    }
}

fn request() -> Request<()> {
    let peer: SocketAddr = "192.0.2.9:4711".parse().unwrap();
    Request::get("/").extension(peer).body(()).unwrap()
}

/// The statuses of `n` requests through a layer on `store`.
async fn statuses(store: BoxStore, n: usize) -> Vec<u16> {
    let layer = RateLimitLayer::new(store, Policy::per_minute(2).name("m").build().unwrap());
    let service = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            service
                .clone()
                .oneshot(request())
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    out
}

/// What an app does at start-up: one type, whichever store.
fn pick(redis_like: bool) -> BoxStore {
    if redis_like {
        BoxStore::new(Deferred(MemoryStore::new()))
    } else {
        BoxStore::new(MemoryStore::new())
    }
}

#[tokio::test]
async fn a_boxed_store_limits_as_the_store_does() {
    for redis_like in [false, true] {
        assert_eq!(
            statuses(pick(redis_like), 3).await,
            [200, 200, 429],
            "redis_like = {redis_like}"
        );
    }
}

#[tokio::test]
async fn any_store_can_be_the_fallback() {
    for fallback in [
        FailurePolicy::fallback(Deferred(MemoryStore::new())),
        FailurePolicy::fallback(MemoryStore::new()),
        FailurePolicy::Fallback(pick(true)),
    ] {
        let layer = RateLimitLayer::builder(Down)
            .policy(Policy::per_minute(1).name("m").build().unwrap())
            .on_store_failure(fallback.clone())
            .circuit_breaker(0, std::time::Duration::ZERO)
            .build()
            .unwrap();
        let service = layer.layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }));
        let first = service.clone().oneshot(request()).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK, "{fallback:?}");
        let second = service.oneshot(request()).await.unwrap();
        assert_eq!(
            second.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "the fallback {fallback:?} limits"
        );
    }
}
