//! Allocations per request through the layer, counted by `dhat`: a
//! `BoxStore` costs at most one allocation more per check than the store
//! it holds (none for the memory store, which answers through `check_now`).
//! Its own binary (no harness): `dhat` counts the whole process.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate_core::{BoxStore, MemoryStore, Policy, Store, StoreError, Verdict};
use tollgate_tower::RateLimitLayer;
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
    println!(
        "allocations per request: memory {memory}, boxed memory {boxed_memory}, \
         deferred {deferred}, boxed deferred {boxed_deferred}"
    );
    assert!(memory > 0.0, "the count sees the request's allocations");
    assert!(
        boxed_memory <= memory,
        "a boxed memory store answers through check_now without allocating: {boxed_memory} > {memory}"
    );
    assert!(
        boxed_deferred <= deferred + 1.0,
        "a boxed store costs at most one allocation more: {boxed_deferred} > {deferred} + 1"
    );
    println!("test boxed_allocations ... ok");
}
