//! The `metrics` feature: decisions and store errors are counted per policy.
//! (Here rather than in portcullis-tower's own tests, so that building that
//! crate's bench does not turn the feature on: `cargo bench -p
//! portcullis-tower` measures the layer as a user without `metrics` runs it.)

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use portcullis::testing::{Fault, FaultStore};
use portcullis_core::{ConcurrencyPolicy, MemoryStore, Policy};
use portcullis_tower::{ConcurrencyLimitLayer, Mode, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

/// Records counter totals by `name{policy}`.
#[derive(Default)]
struct Totals {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    /// `name -> (unit, help)` from the `describe_*` calls.
    described: Mutex<HashMap<String, (Option<Unit>, String)>>,
}

struct Handle(Arc<AtomicU64>);

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

impl HistogramFn for Handle {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A gauge, kept as a whole number (the lease gauge moves by 1).
struct Level(Arc<AtomicU64>);

impl GaugeFn for Level {
    fn increment(&self, value: f64) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.0.fetch_add(value as u64, Ordering::SeqCst);
    }
    fn decrement(&self, value: f64) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.0.fetch_sub(value as u64, Ordering::SeqCst);
    }
    fn set(&self, value: f64) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.0.store(value as u64, Ordering::SeqCst);
    }
}

/// Every metric the crate documents, with its unit (the table in
/// `portcullis-tower`'s `observe.rs` and the README).
const METRICS: &[(&str, Unit)] = &[
    ("portcullis_requests_total", Unit::Count),
    ("portcullis_store_errors_total", Unit::Count),
    ("portcullis_store_duration_seconds", Unit::Seconds),
    ("portcullis_concurrency_requests_total", Unit::Count),
    ("portcullis_concurrency_store_errors_total", Unit::Count),
    ("portcullis_active_request_leases", Unit::Count),
    ("portcullis_request_lease_duration_seconds", Unit::Seconds),
    ("portcullis_resolver_lookups_total", Unit::Count),
    ("portcullis_resolver_failures_total", Unit::Count),
    ("portcullis_resolver_skipped_total", Unit::Count),
    ("portcullis_resolver_missing_tier_total", Unit::Count),
    ("portcullis_limits_reloads_total", Unit::Count),
    ("portcullis_limits_version", Unit::Count),
    ("portcullis_limits_config_hash", Unit::Count),
];

impl Totals {
    fn handle(&self, key: &Key) -> Arc<AtomicU64> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::clone(self.counters.lock().unwrap().entry(name).or_default())
    }

    fn get(&self, name: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

impl Recorder for Totals {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.described
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), (unit, help.to_string()));
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe_counter(name, unit, help);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe_counter(name, unit, help);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Handle(self.handle(key))))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Level(self.handle(key))))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Handle(self.handle(key))))
    }
}

fn request() -> Request<()> {
    let peer: SocketAddr = "192.0.2.1:1".parse().unwrap();
    Request::get("/").extension(peer).body(()).unwrap()
}

fn hello(_: Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
    std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"hi")))))
}

#[tokio::test]
async fn decisions_are_counted_per_policy() {
    let totals = Totals::default();
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(Policy::per_minute(2).name("minute").build().unwrap())
        .policy(Policy::per_day(100).name("day").build().unwrap())
        .build()
        .unwrap();
    let mut service = layer.layer(tower::service_fn(hello));
    // The memory store answers inside `call`, where the local recorder is set.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        service.ready().await.unwrap();
        let future = metrics::with_local_recorder(&totals, || service.call(request()));
        statuses.push(future.await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=minute,result=allowed}"),
        2
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=day,result=allowed}"),
        2
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=minute,result=denied}"),
        1
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=day,result=denied}"),
        0,
        "only the denying policy"
    );
    assert_eq!(
        totals.get("portcullis_store_duration_seconds{policy=minute}"),
        3
    );
}

#[tokio::test]
async fn dry_run_denials_are_counted_apart() {
    let totals = Totals::default();
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(Policy::per_minute(1).name("minute").build().unwrap())
        .mode(Mode::DryRun)
        .build()
        .unwrap();
    let mut service = layer.layer(tower::service_fn(hello));
    for _ in 0..3 {
        service.ready().await.unwrap();
        let future = metrics::with_local_recorder(&totals, || service.call(request()));
        assert_eq!(future.await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(
        totals.get("portcullis_requests_total{policy=minute,result=allowed}"),
        1
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=minute,result=dry_run_denied}"),
        2
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=minute,result=denied}"),
        0
    );
}

/// A store whose backend is always down (the test kit's `FaultStore`). It
/// answers at once (`check_now`), so the layer decides inside `call`,
/// under the local recorder.
fn down() -> FaultStore<MemoryStore> {
    let store = FaultStore::new(MemoryStore::new());
    store.set(Fault::Unavailable);
    store
}

#[tokio::test]
async fn store_errors_are_counted() {
    let totals = Totals::default();
    let layer = RateLimitLayer::builder(down())
        .policy(Policy::per_minute(1).name("minute").build().unwrap())
        .circuit_breaker(0, std::time::Duration::ZERO)
        .build()
        .unwrap();
    let mut service = layer.layer(tower::service_fn(hello));
    for _ in 0..2 {
        service.ready().await.unwrap();
        let future = metrics::with_local_recorder(&totals, || service.call(request()));
        assert_eq!(future.await.unwrap().status(), StatusCode::OK, "fail-open");
    }
    assert_eq!(
        totals.get("portcullis_store_errors_total{policy=minute}"),
        2
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=minute,result=failed_open}"),
        2
    );
    assert_eq!(
        totals.get("portcullis_requests_total{policy=minute,result=allowed}"),
        0
    );
}

#[test]
fn every_metric_has_help_text_and_a_unit() {
    let totals = Totals::default();
    metrics::with_local_recorder(&totals, || {
        RateLimitLayer::builder(MemoryStore::new())
            .policy(Policy::per_minute(2).name("minute").build().unwrap())
            .build()
            .unwrap()
    });
    let described = totals.described.lock().unwrap();
    // The table in the crate docs.
    for (name, unit) in METRICS {
        let (got, help) = described
            .get(*name)
            .unwrap_or_else(|| panic!("{name} is not described"));
        assert_eq!(*got, Some(*unit), "{name}");
        assert!(help.len() > 20, "{name}: {help}");
    }
    assert_eq!(described.len(), METRICS.len(), "{described:?}");
}

#[test]
fn rate_limit_layer_new_describes_the_metrics_as_build_does() {
    let totals = Totals::default();
    metrics::with_local_recorder(&totals, || {
        RateLimitLayer::new(
            MemoryStore::new(),
            Policy::per_minute(2).name("minute").build().unwrap(),
        )
    });
    let described = totals.described.lock().unwrap();
    assert!(
        described.contains_key("portcullis_requests_total"),
        "{described:?}"
    );
    assert_eq!(described.len(), METRICS.len(), "{described:?}");
}

#[tokio::test]
async fn concurrency_permits_and_refusals_are_counted_per_policy() {
    let totals = Totals::default();
    let layer = metrics::with_local_recorder(&totals, || {
        ConcurrencyLimitLayer::builder(MemoryStore::new())
            .policy(
                ConcurrencyPolicy::max_in_flight(1)
                    .name("exports")
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    });
    assert!(
        totals
            .described
            .lock()
            .unwrap()
            .contains_key("portcullis_concurrency_requests_total"),
        "building the concurrency layer describes the metrics too"
    );
    let mut service = layer.layer(tower::service_fn(hello));
    // The memory store answers inside `call`, where the local recorder is set.
    service.ready().await.unwrap();
    let held = metrics::with_local_recorder(&totals, || service.call(request()))
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    for _ in 0..2 {
        service.ready().await.unwrap();
        let refused = metrics::with_local_recorder(&totals, || service.call(request()))
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        totals.get("portcullis_concurrency_requests_total{policy=exports,result=acquired}"),
        1
    );
    assert_eq!(
        totals.get("portcullis_concurrency_requests_total{policy=exports,result=denied}"),
        2
    );
    assert_eq!(
        totals.get("portcullis_concurrency_store_errors_total{policy=exports}"),
        0
    );
    assert_eq!(
        totals.get("portcullis_active_request_leases{policy=exports}"),
        1
    );
    assert_eq!(
        totals.get("portcullis_request_lease_duration_seconds{policy=exports}"),
        0,
        "recorded when the permit is given back"
    );
    drop(held);
    // Dropped outside the recorder's scope: the permit kept its handles.
    assert_eq!(
        totals.get("portcullis_active_request_leases{policy=exports}"),
        0
    );
    assert_eq!(
        totals.get("portcullis_request_lease_duration_seconds{policy=exports}"),
        1
    );
}
