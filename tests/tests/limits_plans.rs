//! Plans a SaaS operator runs on (issue 32): plan lookups stay bounded
//! (capacity, lookups in flight, eviction order), a lookup that panics or is
//! cancelled frees its subject, live limits compile off the request path, a
//! tier renamed under a resolver is warned about and counted, and an
//! `ApiKey` layer hands its resolver the key the operator has.

mod log_capture;

mod limits_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::{Request, StatusCode};
use limits_common::{customer, header, policy, request, service};
use log_capture::Captured;
use portcullis::tower::{ApiKey, Header, Plan, PlanResolver, RateLimitLayer};
use portcullis::{LimitSet, Limits, LimitsFile, MemoryStore};
use tower::{Service, ServiceExt};

fn tiered() -> Limits {
    Limits::new(
        LimitSet::builder()
            .policy(policy("free-minute", 1_000_000))
            .tier("pro", [policy("pro-minute", 1_000_000)])
            .build()
            .unwrap(),
    )
}

fn layer_with(limits: &Limits, plans: PlanResolver) -> RateLimitLayer<MemoryStore, Header> {
    RateLimitLayer::builder(MemoryStore::new())
        .key(customer())
        .limits(limits.clone())
        .resolve_plan(plans)
        .info_in_extensions(true)
        .build()
        .expect("valid layer")
}

// Row 5: a lookup that panics or is cancelled frees its subject.

#[tokio::test(start_paused = true)]
async fn a_panicking_lookup_frees_its_subject() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let plans = PlanResolver::builder(move |_key: String| {
        let call = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            assert!(call > 0, "the first lookup panics");
            Ok::<_, std::io::Error>(Some(Plan::Tier("pro".into())))
        }
    })
    .build();
    let layer = layer_with(&tiered(), plans.clone());
    let service = service(&layer);

    let first = service.clone().oneshot(request("acme")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "x-source"), "resolver_failed");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(plans.lookups_in_flight(), 0);
    // Answered as a failure, remembered for the error TTL, then asked
    // again: not pinned as "loading".
    tokio::time::advance(
        portcullis::tower::rate_limit::DEFAULT_ERROR_TTL + Duration::from_millis(1),
    )
    .await;
    let second = service.clone().oneshot(request("acme")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "looked up again");
    assert_eq!(header(&second, "x-tier"), "pro");
    plans.invalidate("acme");
    assert_eq!(plans.cached(), 0);
}

#[test]
fn a_hanging_lookup_cancelled_with_its_runtime_frees_its_subject() {
    let calls = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let (counted, notify) = (Arc::clone(&calls), Arc::clone(&started));
    let plans = PlanResolver::builder(move |_key: String| {
        let call = counted.fetch_add(1, Ordering::SeqCst);
        let notify = Arc::clone(&notify);
        async move {
            if call == 0 {
                notify.notify_one();
                // Hangs, well within the timeout.
                std::future::pending::<()>().await;
            }
            Ok::<_, std::io::Error>(Some(Plan::Tier("pro".into())))
        }
    })
    .timeout(Duration::from_secs(3600))
    .build();
    let limits = tiered();

    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let layer = first.block_on(async { layer_with(&limits, plans.clone()) });
    first.block_on(async {
        let service = service(&layer);
        let request = tokio::spawn(service.oneshot(request("acme")));
        started.notified().await;
        request.abort();
    });
    assert_eq!(plans.lookups_in_flight(), 1);
    assert_eq!(plans.cached(), 1, "acme is loading");
    // The runtime goes, and the hanging lookup with it.
    drop(first);
    assert_eq!(
        plans.lookups_in_flight(),
        0,
        "the cancelled lookup's place is freed"
    );
    assert_eq!(plans.cached(), 0, "acme is no longer loading");

    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let answer = service(&layer).oneshot(request("acme")).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2, "acme is looked up again");
        assert_eq!(header(&answer, "x-tier"), "pro");
    });
}

// Row 6: the resolver is bounded.

#[tokio::test(start_paused = true)]
async fn ten_thousand_fresh_keys_stay_within_capacity_and_the_lookup_bound() {
    const CAPACITY: usize = 16;
    const MAX_LOOKUPS: usize = 4;
    let running = Arc::new(AtomicUsize::new(0));
    let most_running = Arc::new(AtomicUsize::new(0));
    let most_cached = Arc::new(AtomicUsize::new(0));
    let lookups = Arc::new(AtomicUsize::new(0));
    let this: Arc<OnceLock<PlanResolver>> = Arc::new(OnceLock::new());
    let plans = {
        let (running, most_running, most_cached, lookups, this) = (
            Arc::clone(&running),
            Arc::clone(&most_running),
            Arc::clone(&most_cached),
            Arc::clone(&lookups),
            Arc::clone(&this),
        );
        PlanResolver::builder(move |_key: String| {
            let (running, most_running, most_cached, this) = (
                Arc::clone(&running),
                Arc::clone(&most_running),
                Arc::clone(&most_cached),
                Arc::clone(&this),
            );
            lookups.fetch_add(1, Ordering::SeqCst);
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most_running.fetch_max(now, Ordering::SeqCst);
                if let Some(plans) = this.get() {
                    most_cached.fetch_max(plans.cached(), Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(None)
            }
        })
        .capacity(CAPACITY)
        .max_lookups(MAX_LOOKUPS)
        .build()
    };
    this.set(plans.clone()).unwrap();
    let layer = layer_with(&tiered(), plans.clone());
    let service = service(&layer);

    let answers = futures::future::join_all(
        (0..10_000).map(|i| service.clone().oneshot(request(&format!("fresh-{i}")))),
    )
    .await;
    for answer in answers {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(header(&answer, "x-source"), "default");
    }
    assert!(
        most_running.load(Ordering::SeqCst) <= MAX_LOOKUPS,
        "{} lookups ran at once",
        most_running.load(Ordering::SeqCst)
    );
    assert!(
        most_cached.load(Ordering::SeqCst) <= CAPACITY,
        "{} entries",
        most_cached.load(Ordering::SeqCst)
    );
    assert!(plans.cached() <= CAPACITY, "{} entries", plans.cached());
    assert!(
        lookups.load(Ordering::SeqCst) < 10_000,
        "beyond the bound, the defaults answered without a lookup"
    );
    assert_eq!(plans.lookups_in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_unknown_keys_does_not_evict_paying_customers() {
    let lookups = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&lookups);
    let plans = PlanResolver::builder(move |key: String| {
        seen.lock().unwrap().push(key.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok::<_, std::io::Error>(key.starts_with("paying-").then(|| Plan::Tier("pro".into())))
        }
    })
    // 16 per shard, at most 8 of them loading: a shard never holds only
    // paying customers and lookups.
    .capacity(256)
    .max_lookups(8)
    .build();
    let layer = layer_with(&tiered(), plans.clone());
    let service = service(&layer);
    let paying: Vec<String> = (0..8).map(|i| format!("paying-{i}")).collect();
    for key in &paying {
        let answer = service.clone().oneshot(request(key)).await.unwrap();
        assert_eq!(header(&answer, "x-tier"), "pro");
    }
    // 2 000 unknown subjects, each looked up and cached.
    for round in 0..250 {
        futures::future::join_all((0..8).map(|i| {
            service
                .clone()
                .oneshot(request(&format!("unknown-{round}-{i}")))
        }))
        .await;
        assert!(plans.cached() <= 256);
    }
    assert_eq!(lookups.lock().unwrap().len(), 8 + 2_000);
    lookups.lock().unwrap().clear();
    for key in &paying {
        let answer = service.clone().oneshot(request(key)).await.unwrap();
        assert_eq!(header(&answer, "x-tier"), "pro");
    }
    assert_eq!(
        *lookups.lock().unwrap(),
        Vec::<String>::new(),
        "the paying customers were still cached"
    );
}

// Row 7: recompiling live limits happens off the request path.

#[tokio::test(flavor = "current_thread")]
async fn a_reload_with_ten_thousand_overrides_compiles_on_the_writer_not_on_requests() {
    let captured = Captured::default();
    let dispatch = captured.dispatch(tracing::Level::DEBUG);
    let _default = tracing::dispatcher::set_default(&dispatch);

    let many = |prefix: &str| {
        let mut set = LimitSet::builder().policy(policy(&format!("{prefix}-minute"), 1_000_000));
        for i in 0..10_000 {
            set = set.override_policies(
                format!("customer-{i}"),
                [policy(&format!("{prefix}-own"), 1_000_000)],
            );
        }
        set.build().unwrap()
    };
    let limits = Limits::new(many("old"));
    // Holds the writer after it built the new set and before the layer
    // compiles it (callbacks run in the order they were registered).
    let (entered, entered_rx) = std::sync::mpsc::channel::<()>();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let _hold = limits.on_change(move |set| {
        if set.version() > 1 {
            entered.send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
        }
    });
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .key(customer())
        .limits(limits.clone())
        .info_in_extensions(true)
        .build()
        .unwrap();
    let service = service(&layer);

    let writer = {
        let (limits, dispatch) = (limits.clone(), dispatch.clone());
        std::thread::Builder::new()
            .name("limits-writer".into())
            .spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || limits.replace(many("new")))
            })
            .unwrap()
    };
    entered_rx.recv().unwrap();
    // The writer is mid-reload: requests are answered, by the old set.
    for i in [0, 9_999] {
        let answer = service
            .clone()
            .oneshot(request(&format!("customer-{i}")))
            .await
            .unwrap();
        assert_eq!(header(&answer, "x-policies"), "old-own");
    }
    let answer = service.clone().oneshot(request("someone")).await.unwrap();
    assert_eq!(header(&answer, "x-policies"), "old-minute");
    release.send(()).unwrap();
    assert_eq!(writer.join().unwrap(), 2);

    // In force at once, compiled by the writer: no request compiles.
    let answer = service
        .clone()
        .oneshot(request("customer-7"))
        .await
        .unwrap();
    assert_eq!(header(&answer, "x-policies"), "new-own");
    let log = captured.text();
    let compiles: Vec<&str> = log.lines().filter(|l| l.contains("new limits")).collect();
    assert_eq!(compiles.len(), 1, "{log}");
    assert!(
        compiles[0].contains("limits-writer"),
        "compiled on the writer's thread: {}",
        compiles[0]
    );
}

/// Counter totals by `name{label=value,...}`.
#[derive(Default)]
struct Counters(Mutex<std::collections::HashMap<String, Arc<std::sync::atomic::AtomicU64>>>);

struct CounterHandle(Arc<std::sync::atomic::AtomicU64>);

impl metrics::CounterFn for CounterHandle {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

impl Counters {
    fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

impl metrics::Recorder for Counters {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let total = Arc::clone(self.0.lock().unwrap().entry(name).or_default());
        metrics::Counter::from_arc(Arc::new(CounterHandle(total)))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

// Row 3: a tier renamed under a resolver is warned about once, and counted.

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_tier_renamed_under_a_resolver_is_warned_once_and_counted() {
    let captured = Captured::default();
    let _default = tracing::dispatcher::set_default(&captured.dispatch(tracing::Level::WARN));
    let limits = Limits::new(
        LimitSet::builder()
            .policy(policy("free-minute", 1_000_000))
            .tier("gold", [policy("gold-minute", 1_000_000)])
            .build()
            .unwrap(),
    );
    let plans = PlanResolver::builder(|customer: String| async move {
        Ok::<_, std::io::Error>(
            ["acme", "globex", "initech"]
                .contains(&customer.as_str())
                .then(|| Plan::Tier("gold".into())),
        )
    })
    .build();
    let layer = layer_with(&limits, plans);
    let mut service = service(&layer);
    for customer in ["acme", "globex", "initech"] {
        let answer = service.clone().oneshot(request(customer)).await.unwrap();
        assert_eq!(header(&answer, "x-tier"), "gold");
    }

    // gold -> platinum in the limits; the plans still say gold.
    limits
        .update(|set| {
            set.remove_tier("gold")
                .tier("platinum", [policy("gold-minute", 1_000_000)])
        })
        .unwrap();
    let warnings = captured.text();
    let lines: Vec<&str> = warnings.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(lines.len(), 1, "one warning at the reload: {warnings}");
    assert!(lines[0].contains("\"gold\""), "{}", lines[0]);
    assert!(lines[0].contains("subjects=3"), "{}", lines[0]);

    let counters = Counters::default();
    for _ in 0..2 {
        for customer in ["acme", "globex", "initech"] {
            service.ready().await.unwrap();
            let answer =
                metrics::with_local_recorder(&counters, || service.call(request(customer)))
                    .await
                    .unwrap();
            assert_eq!(header(&answer, "x-source"), "default");
        }
    }
    assert_eq!(
        counters.get("portcullis_resolver_missing_tier_total{tier=gold}"),
        6,
        "every such request counted"
    );
    let warnings = captured.text();
    assert_eq!(
        warnings.lines().filter(|l| l.contains("WARN")).count(),
        1,
        "no warning per request: {warnings}"
    );
}

// Row 2: an `ApiKey` layer hands its resolver the key the operator has,
// and a file override is written as the key's SHA-256.

#[tokio::test(start_paused = true)]
async fn an_api_key_layer_looks_plans_up_by_the_key_and_overrides_by_its_hash() {
    // `printf '%s' 'k-live-7f3a' | sha256sum`, as an operator computes it.
    let file = r##"
default = ["free-minute"]
[policies]
free-minute = { limit = 1000000, period = "1m" }
pro-minute = { limit = 1000000, period = "1m" }
vip-minute = { limit = 1000000, period = "1m" }
[tiers]
pro = ["pro-minute"]
[overrides]
"#E2289561AD41E8D29444A1372D6F40455240E594CE090C8D41AE94835C7B4046" = { policies = ["vip-minute"] }
"##;
    let limits = Limits::new(LimitsFile::parse("limits.toml", file).unwrap());
    let looked_up = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&looked_up);
    let plans = PlanResolver::builder(move |api_key: String| {
        seen.lock().unwrap().push(api_key.clone());
        async move {
            // SELECT plan FROM customers WHERE api_key = $1
            Ok::<_, std::io::Error>((api_key == "k-pro-1").then(|| Plan::Tier("pro".into())))
        }
    })
    .lookup_key(ApiKey::new())
    .build();
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .key(ApiKey::new())
        .limits(limits)
        .resolve_plan(plans.clone())
        .info_in_extensions(true)
        .build()
        .unwrap();
    let service = service(&layer);
    let with_key = |key: &str| Request::get("/").header("x-api-key", key).body(()).unwrap();

    let pro = service.clone().oneshot(with_key("k-pro-1")).await.unwrap();
    assert_eq!(header(&pro, "x-tier"), "pro", "the resolver found the key");
    let vip = service
        .clone()
        .oneshot(with_key("k-live-7f3a"))
        .await
        .unwrap();
    assert_eq!(header(&vip, "x-source"), "override");
    assert_eq!(header(&vip, "x-policies"), "vip-minute");
    let other = service.clone().oneshot(with_key("k-free-9")).await.unwrap();
    assert_eq!(header(&other, "x-source"), "default");
    assert_eq!(
        *looked_up.lock().unwrap(),
        ["k-pro-1", "k-free-9"],
        "the lookups were given the keys themselves (the override needed none)"
    );

    // The operator invalidates by the key they have.
    plans.invalidate("k-pro-1");
    service.clone().oneshot(with_key("k-pro-1")).await.unwrap();
    assert_eq!(looked_up.lock().unwrap().len(), 3);
}
