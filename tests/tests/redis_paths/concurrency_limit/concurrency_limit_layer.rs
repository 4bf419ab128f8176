//! Layer-only tests of `concurrency_limit` (no Redis): stacking with
//! `RateLimitLayer`, gRPC answers, configuration errors, and a request
//! cancelled or timed out while its acquire is under way.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use portcullis_core::{ConcurrencyPolicy, LeaseId, LeaseStore, MemoryStore, Policy};
use portcullis_tower::{ConcurrencyLimitLayer, Global, RateLimitLayer};
use tower::{Layer, ServiceExt};

use super::concurrency_policy;

#[tokio::test]
async fn stacks_with_rate_limit_layer() {
    let store = MemoryStore::new();
    let rate = RateLimitLayer::builder(store.clone())
        .policy(Policy::per_minute(100).name("rate").build().unwrap())
        .key(Global)
        .build()
        .unwrap();
    let concurrency = ConcurrencyLimitLayer::builder(store)
        .policy(concurrency_policy(Duration::from_secs(30)))
        .key(Global)
        .build()
        .unwrap();
    let service = tower::ServiceBuilder::new()
        .layer(rate)
        .layer(concurrency)
        .service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        });
    let first = service
        .clone()
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers().contains_key("ratelimit"));
    let second = service
        .clone()
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.headers()["retry-after"], "30");
    let body = second.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("concurrency limit \"one\""));
    drop(first);
    let third = service
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(third.status(), StatusCode::OK);
}

#[tokio::test]
async fn grpc_requests_get_resource_exhausted() {
    let layer = ConcurrencyLimitLayer::builder(MemoryStore::new())
        .policy(concurrency_policy(Duration::from_secs(30)))
        .key(Global)
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    }));
    let grpc = || {
        Request::builder()
            .header("content-type", "application/grpc")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let held = service.clone().oneshot(grpc()).await.unwrap();
    let denied = service.oneshot(grpc()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::OK);
    assert_eq!(denied.headers()["grpc-status"], "8");
    assert!(denied.headers().contains_key("grpc-retry-pushback-ms"));
    drop(held);
}

#[test]
fn a_store_boxed_with_its_leases_builds() {
    // A `BoxStore` (rates only) is not a `LeaseStore`: the compiler refuses
    // it here. Boxed with its leases, the same store builds.
    assert!(ConcurrencyLimitLayer::builder(
        portcullis_core::BoxLeaseStore::new(MemoryStore::new())
    )
    .policy(concurrency_policy(Duration::from_secs(30)))
    .build()
    .is_ok());
}

/// A lease store whose acquires are granted at once (in memory) but
/// answered only when `answer` is notified: an acquire under way.
#[derive(Clone)]
struct Slow {
    memory: MemoryStore,
    answer: Arc<tokio::sync::Notify>,
}

impl LeaseStore for Slow {
    type AcquireFuture = std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<portcullis_core::LeaseDecision, portcullis_core::StoreError>,
                > + Send,
        >,
    >;

    fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Self::AcquireFuture {
        let granted = self.memory.acquire(subject, policy, lease).into_inner();
        let answer = Arc::clone(&self.answer);
        Box::pin(async move {
            answer.notified().await;
            granted
        })
    }

    fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<Option<u64>, portcullis_core::StoreError>>
           + Send
           + 'static {
        self.memory.renew(subject, policy, lease)
    }

    fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<bool, portcullis_core::StoreError>> + Send + 'static
    {
        self.memory.release(subject, policy, lease)
    }
}

#[tokio::test]
async fn a_request_cancelled_or_timed_out_while_acquiring_releases_the_lease() {
    let memory = MemoryStore::new();
    let slow = Slow {
        memory: memory.clone(),
        answer: Arc::new(tokio::sync::Notify::new()),
    };
    let policy = concurrency_policy(Duration::from_secs(60));
    let ok = || {
        tower::service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    };
    // Cancelled while the acquire is under way (it was granted meanwhile).
    let layer = ConcurrencyLimitLayer::builder(slow.clone())
        .policy(policy.clone())
        .key(Global)
        .acquire_timeout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let service = layer.layer(ok());
    let mut future = Box::pin(service.oneshot(Request::new(Full::new(Bytes::new()))));
    assert!(futures::poll!(future.as_mut()).is_pending());
    assert!(!memory
        .acquire("global", &policy, LeaseId::generate())
        .into_inner()
        .unwrap()
        .is_granted());
    drop(future);
    let again = memory
        .acquire("global", &policy, LeaseId::generate())
        .into_inner()
        .unwrap();
    assert!(
        again.is_granted(),
        "the cancelled acquire's lease was released"
    );
    memory
        .release("global", &policy, again.lease().unwrap().id())
        .await
        .unwrap();

    // Timed out (fail open: the request runs without a permit), and the
    // lease it may have been granted is released.
    let layer = ConcurrencyLimitLayer::builder(slow)
        .policy(policy.clone())
        .key(Global)
        .acquire_timeout(Duration::from_millis(10))
        .build()
        .unwrap();
    let response = layer
        .layer(ok())
        .oneshot(Request::new(Full::new(Bytes::new())))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(memory
        .acquire("global", &policy, LeaseId::generate())
        .into_inner()
        .unwrap()
        .is_granted());
}
