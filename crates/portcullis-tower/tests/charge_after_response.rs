//! Charging after the response through the layer, when the charge fails:
//! the response is kept, and a failed charge goes to the fallback store.
//! (The `Charge` handle's arithmetic is tested beside it, in
//! `src/rate_limit/charge.rs`.)

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use portcullis_core::{MemoryStore, Policy, Store, StoreError, Verdict};
use tower::{service_fn, Layer, ServiceExt};

use portcullis_tower::{FailurePolicy, RateLimitLayer};

/// A store that checks (in memory, answering later as Redis does) but
/// cannot charge: the trait's default.
struct NoCharge(MemoryStore);

impl Store for NoCharge {
    type CheckFuture =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Verdict, StoreError>> + Send>>;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        Box::pin(self.0.check(subject, policies, cost))
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static {
        self.0.reset(subject, policies)
    }
}

#[tokio::test]
async fn a_failing_charge_keeps_the_response() {
    let layer = RateLimitLayer::builder(NoCharge(MemoryStore::new()))
        .policy(Policy::per_minute(1).name("p").build().unwrap())
        .charge_from_response(|_| 5)
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("kept"))))
    }));
    let peer: SocketAddr = "192.0.2.1:4711".parse().unwrap();
    for _ in 0..3 {
        let request = Request::get("/").extension(peer).body(()).unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        // Nothing could be charged, so nothing limits; the handler's
        // response comes back whole each time.
        assert_eq!(response.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body, "kept");
    }
}

/// A store that checks in memory but whose charges fail as an
/// unreachable store's do.
struct DownForCharges(MemoryStore);

impl Store for DownForCharges {
    type CheckFuture =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Verdict, StoreError>> + Send>>;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        Box::pin(self.0.check(subject, policies, cost))
    }

    fn charge(
        &self,
        _subject: &str,
        _policies: &[Policy],
        _cost: u64,
    ) -> impl std::future::Future<Output = Result<Verdict, StoreError>> + Send + 'static {
        std::future::ready(Err(StoreError::unavailable("connection refused")))
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static {
        self.0.reset(subject, policies)
    }
}

#[tokio::test]
async fn a_failed_charge_goes_to_the_fallback_store() {
    let fallback = MemoryStore::new();
    let policies = [Policy::per_minute(10).name("p").build().unwrap()];
    let layer = RateLimitLayer::builder(DownForCharges(MemoryStore::new()))
        .policies(policies.clone())
        .charge_from_response(|_| 4)
        .on_store_failure(FailurePolicy::fallback(fallback.clone()))
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("kept"))))
    }));
    let peer: SocketAddr = "192.0.2.1:4711".parse().unwrap();
    let request = Request::get("/").extension(peer).body(()).unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let peek = fallback.peek("192.0.2.1", &policies).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 6);
}
