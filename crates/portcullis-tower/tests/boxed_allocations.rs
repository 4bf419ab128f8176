//! Allocations per request through the layer, counted by `dhat`: a
//! `BoxStore` costs at most one allocation more per check than the store
//! it holds (none for the memory store, which answers through `check_now`,
//! whether boxed with or without its leases); a memory store boxed with its
//! leases acquires through `acquire_now` without allocating, and through a
//! `ConcurrencyLimitLayer` costs no allocation more per request than
//! unboxed (it releases through `release_now`, with no future to box).
//! Its own binary (no harness): `dhat` counts the whole process.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use portcullis_core::{
    BoxLeaseStore, BoxStore, ConcurrencyPolicy, LeaseId, LeaseStore, MemoryStore, Policy, Store,
    StoreError, Verdict,
};
use portcullis_tower::{ConcurrencyLimitLayer, Global, RateLimitLayer};
use tower::{service_fn, Layer, ServiceExt};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// A store that answers only through its (boxed) future, as Redis does.
struct Deferred(MemoryStore);

impl Store for Deferred {
    type CheckFuture = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send>>;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        let answer = self.0.check_now(subject, policies, cost);
        Box::pin(async move { answer.expect("the memory store answers now") })
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.0.reset(subject, policies)
    }
}

const REQUESTS: u64 = 200;

/// Allocations per request (rounded to the nearest whole) through a layer
/// on `store`, after a warm-up.
fn allocations_per_request<St: Store>(runtime: &tokio::runtime::Runtime, store: St) -> f64 {
    let policy = Policy::per_second(1_000_000)
        .name("generous")
        .build()
        .unwrap();
    let service = RateLimitLayer::new(store, policy).layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    let peer: SocketAddr = "192.0.2.1:4711".parse().unwrap();
    let run = |n: u64| {
        for _ in 0..n {
            let request = Request::get("/").extension(peer).body(()).unwrap();
            let response = runtime.block_on(service.clone().oneshot(request)).unwrap();
            assert_eq!(response.status(), 200);
        }
    };
    run(10);
    let before = dhat::HeapStats::get().total_blocks;
    run(REQUESTS);
    let after = dhat::HeapStats::get().total_blocks;
    #[allow(clippy::cast_precision_loss)]
    let per_request = (after - before) as f64 / REQUESTS as f64;
    // Rounded: the `RateLimit` values share a per-thread arena chunk, so a
    // chunk's allocation falls on one request in some forty and the mean
    // is fractional; where the chunk boundaries fall differs between runs.
    per_request.round()
}

/// Allocations per request (rounded) through a `ConcurrencyLimitLayer` on
/// `store`, after a warm-up; each response is dropped, so its permit is
/// released before the next request.
fn allocations_per_leased_request<St: LeaseStore>(
    runtime: &tokio::runtime::Runtime,
    store: St,
) -> f64 {
    let policy = ConcurrencyPolicy::max_in_flight(1_000)
        .name("generous")
        .build()
        .unwrap();
    let layer = ConcurrencyLimitLayer::builder(store)
        .policy(policy)
        .key(Global)
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    let run = |n: u64| {
        for _ in 0..n {
            let request = Request::get("/").body(()).unwrap();
            let response = runtime.block_on(service.clone().oneshot(request)).unwrap();
            assert_eq!(response.status(), 200);
        }
    };
    run(10);
    let before = dhat::HeapStats::get().total_blocks;
    run(REQUESTS);
    let after = dhat::HeapStats::get().total_blocks;
    #[allow(clippy::cast_precision_loss)]
    let per_request = (after - before) as f64 / REQUESTS as f64;
    per_request.round()
}

/// Allocations per `acquire_now` on `store` (rounded), for one subject
/// that keeps one lease held throughout; each lease is released again
/// outside the count (a boxed store boxes its release future).
fn allocations_per_acquire_now<St: LeaseStore>(store: &St) -> f64 {
    let policy = ConcurrencyPolicy::max_in_flight(10)
        .name("direct")
        .build()
        .unwrap();
    let acquire = || {
        let id = LeaseId::generate();
        let decision = store
            .acquire_now("s", &policy, id)
            .expect("answered at once")
            .unwrap();
        assert!(decision.is_granted());
        id
    };
    let _held = acquire();
    let mut counted = 0;
    for round in 0..10 + REQUESTS {
        let before = dhat::HeapStats::get().total_blocks;
        let id = acquire();
        let after = dhat::HeapStats::get().total_blocks;
        // After a warm-up of ten.
        if round >= 10 {
            counted += after - before;
        }
        drop(store.release("s", &policy, id));
    }
    #[allow(clippy::cast_precision_loss)]
    let per_call = counted as f64 / REQUESTS as f64;
    per_call.round()
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let memory = allocations_per_request(&runtime, MemoryStore::new());
    let boxed_memory = allocations_per_request(&runtime, BoxStore::new(MemoryStore::new()));
    let deferred = allocations_per_request(&runtime, Deferred(MemoryStore::new()));
    let boxed_deferred =
        allocations_per_request(&runtime, BoxStore::new(Deferred(MemoryStore::new())));
    let leased_memory = allocations_per_request(&runtime, BoxLeaseStore::new(MemoryStore::new()));
    let acquire_memory = allocations_per_acquire_now(&MemoryStore::new());
    let acquire_boxed = allocations_per_acquire_now(&BoxLeaseStore::new(MemoryStore::new()));
    let concurrency_memory = allocations_per_leased_request(&runtime, MemoryStore::new());
    let concurrency_boxed =
        allocations_per_leased_request(&runtime, BoxLeaseStore::new(MemoryStore::new()));
    println!(
        "allocations per request: memory {memory}, boxed memory {boxed_memory}, \
         deferred {deferred}, boxed deferred {boxed_deferred}, \
         memory boxed with leases {leased_memory}; acquire_now: memory {acquire_memory}, \
         boxed with leases {acquire_boxed}; concurrency limit: memory {concurrency_memory}, \
         boxed with leases {concurrency_boxed}"
    );
    assert!(memory > 0.0, "the count sees the request's allocations");
    assert!(
        boxed_memory <= memory,
        "a boxed memory store answers through check_now without allocating: {boxed_memory} > {memory}"
    );
    assert!(
        leased_memory <= memory,
        "a memory store boxed with its leases checks without allocating: {leased_memory} > {memory}"
    );
    assert!(
        acquire_boxed <= acquire_memory,
        "a memory store boxed with its leases acquires through acquire_now without allocating: \
         {acquire_boxed} > {acquire_memory}"
    );
    assert!(
        concurrency_memory > 0.0,
        "the count sees the request's allocations"
    );
    assert!(
        concurrency_boxed <= concurrency_memory,
        "a memory store boxed with its leases acquires and releases at once (acquire_now, \
         release_now) without allocating: {concurrency_boxed} > {concurrency_memory}"
    );
    assert!(
        boxed_deferred <= deferred + 1.0,
        "a boxed store costs at most one allocation more: {boxed_deferred} > {deferred} + 1"
    );
    println!("test boxed_allocations ... ok");
}
