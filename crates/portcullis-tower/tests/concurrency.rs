//! `ConcurrencyLimitLayer` against small test lease stores (no Redis): its
//! circuit breaker and its configuration errors. The Redis and
//! cross-process tests are in the workspace's `tests/` crate.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use portcullis_core::{
    ConcurrencyPolicy, LeaseDecision, LeaseId, LeaseStore, MemoryStore, StoreError,
};
use portcullis_tower::{
    ConcurrencyFailure, ConcurrencyLimitLayer, ConfigError, Global, KeyBuf, KeyExtractor,
    RequestHead,
};
use tower::{Layer, ServiceExt};

/// A lease store in memory whose acquires can be made to fail with an
/// error of a chosen kind, counting every acquire it is asked for.
#[derive(Clone)]
struct Failing {
    memory: MemoryStore,
    acquires: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
    /// The error a failing acquire answers.
    error: Arc<Mutex<fn() -> StoreError>>,
}

impl Failing {
    fn new(error: fn() -> StoreError) -> Self {
        Self {
            memory: MemoryStore::new(),
            acquires: Arc::default(),
            failing: Arc::new(AtomicBool::new(true)),
            error: Arc::new(Mutex::new(error)),
        }
    }

    fn acquires(&self) -> usize {
        self.acquires.load(Ordering::SeqCst)
    }
}

fn unavailable() -> StoreError {
    StoreError::unavailable("connection refused")
}

fn unreadable_reply() -> StoreError {
    StoreError::Protocol {
        detail: "a lease entry that does not parse".to_owned(),
    }
}

impl LeaseStore for Failing {
    type AcquireFuture = std::future::Ready<Result<LeaseDecision, StoreError>>;

    fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Self::AcquireFuture {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            let error = *self.error.lock().unwrap();
            return std::future::ready(Err(error()));
        }
        std::future::ready(self.memory.acquire(subject, policy, lease).into_inner())
    }

    fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<Option<u64>, StoreError>> + Send + 'static {
        self.memory.renew(subject, policy, lease)
    }

    fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<bool, StoreError>> + Send + 'static {
        self.memory.release(subject, policy, lease)
    }
}

fn policy() -> ConcurrencyPolicy {
    ConcurrencyPolicy::max_in_flight(10)
        .name("exports")
        .build()
        .unwrap()
}

async fn status<St: LeaseStore>(layer: &ConcurrencyLimitLayer<St, Global>) -> StatusCode {
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    service.oneshot(Request::new(())).await.unwrap().status()
}

#[tokio::test(start_paused = true)]
async fn the_circuit_breaker_stops_asking_a_store_that_fails_store_wide() {
    let store = Failing::new(unavailable);
    // The rate layer's defaults: open after 5 failures, for 1 second.
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy())
        .key(Global)
        .on_store_failure(ConcurrencyFailure::FailClosed)
        .build()
        .unwrap();
    for _ in 0..20 {
        assert_eq!(status(&layer).await, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(
        store.acquires(),
        5,
        "open after five failures: the rest answered by the failure policy"
    );

    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(status(&layer).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(store.acquires(), 6, "one probe after the pause");
    assert_eq!(status(&layer).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(store.acquires(), 6, "the failed probe opened it again");

    store.failing.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(status(&layer).await, StatusCode::OK, "the probe is granted");
    assert_eq!(status(&layer).await, StatusCode::OK);
    assert_eq!(store.acquires(), 8, "closed again: every request asks");
}

#[tokio::test(start_paused = true)]
async fn the_circuit_breaker_is_set_by_the_builder_and_fails_open_without_asking() {
    let store = Failing::new(unavailable);
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy())
        .key(Global)
        .circuit_breaker(2, Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..10 {
        assert_eq!(status(&layer).await, StatusCode::OK, "fail-open");
    }
    assert_eq!(store.acquires(), 2);

    // 0 failures disables it.
    let store = Failing::new(unavailable);
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy())
        .key(Global)
        .circuit_breaker(0, Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..10 {
        assert_eq!(status(&layer).await, StatusCode::OK);
    }
    assert_eq!(store.acquires(), 10);
}

#[tokio::test(start_paused = true)]
async fn errors_about_one_subject_do_not_open_the_circuit_breaker() {
    let store = Failing::new(unreadable_reply);
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(policy())
        .key(Global)
        .circuit_breaker(2, Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..10 {
        assert_eq!(status(&layer).await, StatusCode::OK, "fail-open");
    }
    assert_eq!(store.acquires(), 10, "every request asked the store");

    // Then store-wide errors: these count.
    *store.error.lock().unwrap() = unavailable;
    for _ in 0..10 {
        status(&layer).await;
    }
    assert_eq!(store.acquires(), 12);
}

#[test]
fn a_layer_without_a_policy_is_refused_with_its_own_error() {
    let error = ConcurrencyLimitLayer::builder(MemoryStore::new())
        .build()
        .unwrap_err();
    assert!(
        matches!(error, ConfigError::NoConcurrencyPolicy),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(".policy(ConcurrencyPolicy::max_in_flight("),
        "{message}"
    );
    assert!(!message.contains("tier"), "{message}");
}

/// An extractor whose two methods disagree: `extract_into`, the one both
/// layers call, finds the key; `extract` finds none.
struct IntoOnly;

impl KeyExtractor for IntoOnly {
    fn extract<'r>(&self, _: impl Into<RequestHead<'r>>) -> Option<String> {
        None
    }

    fn extract_into(&self, _: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        key.push_str("tenant-a");
        true
    }
}

#[tokio::test]
async fn the_key_is_read_with_extract_into_as_the_rate_layer_reads_it() {
    let store = MemoryStore::new();
    let one = ConcurrencyPolicy::max_in_flight(1)
        .name("one")
        .build()
        .unwrap();
    let layer = ConcurrencyLimitLayer::builder(store.clone())
        .policy(one.clone())
        .key(IntoOnly)
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    // Without a key the default answer would be 400.
    let held = service.oneshot(Request::new(())).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    // The permit is held under the key `extract_into` wrote.
    let other = store
        .acquire("tenant-a", &one, LeaseId::generate())
        .await
        .unwrap();
    assert!(!other.is_granted());
    drop(held);
}
