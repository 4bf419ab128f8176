//! Limits as data through the layer: a live `Limits` handle, a reloaded
//! limits file, per-subject overrides and an async plan resolver (cache,
//! single flight, failures and timeouts on Tokio's paused clock).

use crate::limits_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use limits_common::{customer, header, policy, request, service};
use portcullis::tower::{
    FailurePolicy, Header, Plan, PlanResolver, RateLimitLayer, ResolverFailure,
};
use portcullis::{LimitSet, Limits, LimitsFile, MemoryStore, PolicySource};
use tower::ServiceExt;

fn layer_over(limits: &Limits) -> RateLimitLayer<MemoryStore, Header> {
    RateLimitLayer::builder(MemoryStore::new())
        .key(customer())
        .limits(limits.clone())
        .info_in_extensions(true)
        .build()
        .expect("valid layer")
}

fn temp_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("portcullis-{name}-{}.toml", std::process::id()))
}

/// Two whole sets, told apart by their policy names; within a set the two
/// policies always go together.
fn limits_file(set: char) -> String {
    format!(
        "default = [\"{set}-minute\", \"{set}-day\"]\n\
         [policies]\n\
         {set}-minute = {{ limit = 1000000, period = \"1m\" }}\n\
         {set}-day = {{ limit = 100000000, period = \"1d\" }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_is_seen_whole_and_fails_no_request() {
    let path = temp_file("reload-load");
    std::fs::write(&path, limits_file('a')).unwrap();
    let file = LimitsFile::open(&path).unwrap();
    let layer = layer_over(&file.limits());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let mut clients = Vec::new();
    for client in 0..4 {
        let service = service(&layer);
        let done = Arc::clone(&done);
        clients.push(tokio::spawn(async move {
            let mut seen = [0_u32; 2];
            let mut count = 0_u32;
            while !done.load(Ordering::Relaxed) || count < 50 {
                let response = service
                    .clone()
                    .oneshot(request(&format!("c{client}")))
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK, "no failed request");
                let policies = header(&response, "x-policies");
                let version: u64 = header(&response, "x-version").parse().unwrap();
                // Version 1 is set a; each reload alternates.
                let set = if version % 2 == 1 { 'a' } else { 'b' };
                assert_eq!(
                    policies,
                    format!("{set}-minute,{set}-day"),
                    "version {version}: one whole set"
                );
                // The precomputed header is the same set's.
                let advertised = header(&response, "ratelimit-policy");
                assert!(
                    advertised
                        .starts_with(&format!("\"{set}-minute\";q=1000000;w=60, \"{set}-day\";"))
                        && !advertised.contains(if set == 'a' { "\"b-" } else { "\"a-" }),
                    "{advertised} under version {version}"
                );
                seen[usize::from(set == 'b')] += 1;
                count += 1;
                if count.is_multiple_of(16) {
                    tokio::task::yield_now().await;
                }
            }
            seen
        }));
    }
    let mut applied = 0;
    for round in 0..40 {
        let next = if round % 2 == 0 { 'b' } else { 'a' };
        std::fs::write(&path, limits_file(next)).unwrap();
        match file.reload().unwrap() {
            portcullis::Reload::Applied { .. } => applied += 1,
            other => panic!("the file changed: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    done.store(true, Ordering::Relaxed);
    let mut seen = [0; 2];
    for client in clients {
        let counts = client.await.unwrap();
        seen[0] += counts[0];
        seen[1] += counts[1];
    }
    assert_eq!(applied, 40);
    assert_eq!(file.limits().version(), 41);
    assert!(
        seen[0] > 0 && seen[1] > 0,
        "both sets were in force: {seen:?}"
    );
    std::fs::remove_file(&path).ok();
}

#[tokio::test]
async fn an_invalid_file_is_refused_and_the_limits_stay() {
    let path = temp_file("invalid");
    std::fs::write(&path, limits_file('a')).unwrap();
    let file = LimitsFile::open(&path).unwrap();
    let hash = file.hash();
    let layer = layer_over(&file.limits());
    let service = service(&layer);

    for bad in [
        "default = [\"a-minute\"]\n[policies]\na-minute = { limit = 0, period = \"1m\" }\n",
        "default = [\"nope\"]\n[policies]\na-minute = { limit = 5, period = \"1m\" }\n",
        "default = [\"a-minute\"\n",
        "default = [\"a-minute\"]\n[policies]\na-minute = { limit = 5, period = \"1m\", algo = \"gcra\" }\n",
    ] {
        std::fs::write(&path, bad).unwrap();
        let err = file.reload().unwrap_err();
        assert!(
            err.to_string().starts_with(&format!("{}:", path.display())),
            "names the file: {err}"
        );
        assert_eq!(file.limits().version(), 1, "{err}");
        assert_eq!(file.hash(), hash);
        let response = service.clone().oneshot(request("alice")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "x-policies"), "a-minute,a-day");
    }
    // Missing: refused too.
    std::fs::remove_file(&path).unwrap();
    assert!(file.reload().is_err());
    assert_eq!(file.limits().version(), 1);
}

#[tokio::test]
async fn one_customers_override_changes_nobody_elses_decisions() {
    let limits = Limits::new(LimitSet::of([policy("minute", 5)]).unwrap());
    let changed = service(&layer_over(&limits));
    let twin_limits = Limits::new(LimitSet::of([policy("minute", 5)]).unwrap());
    let twin = service(&layer_over(&twin_limits));

    let mut bob = Vec::new();
    let mut bob_twin = Vec::new();
    for step in 0..8 {
        if step == 2 {
            limits
                .update(|set| set.override_policies("acme", [policy("acme-minute", 1)]))
                .unwrap();
        }
        if step == 4 {
            limits
                .update(|set| {
                    set.tier("big", [policy("minute", 1000)])
                        .override_tier("acme", "big")
                })
                .unwrap();
        }
        let acme = changed.clone().oneshot(request("acme")).await.unwrap();
        if step >= 2 && acme.status() == StatusCode::OK {
            assert_eq!(header(&acme, "x-source"), "override");
        }
        if step == 3 {
            // Its own limit of 1 (a policy of its own name: a fresh count).
            assert_eq!(acme.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                header(&acme, "ratelimit-policy"),
                "\"acme-minute\";q=1;w=60"
            );
        }
        let response = changed.clone().oneshot(request("bob")).await.unwrap();
        if response.status() == StatusCode::OK {
            assert_eq!(header(&response, "x-source"), "default");
        }
        bob.push((response.status(), header(&response, "ratelimit")));
        let response = twin.clone().oneshot(request("bob")).await.unwrap();
        bob_twin.push((response.status(), header(&response, "ratelimit")));
    }
    assert_eq!(bob, bob_twin);
    assert_eq!(
        bob[5].0,
        StatusCode::TOO_MANY_REQUESTS,
        "bob's own limit held"
    );
}

/// A resolver counting its lookups, answering after `delay`.
fn counting_resolver(
    calls: &Arc<AtomicUsize>,
    delay: Duration,
    answer: fn(&str) -> Result<Option<Plan>, std::io::Error>,
) -> portcullis::tower::PlanResolverBuilder {
    let calls = Arc::clone(calls);
    PlanResolver::builder(move |key: String| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            answer(&key)
        }
    })
}

fn plans(key: &str) -> Result<Option<Plan>, std::io::Error> {
    Ok(match key {
        "acme" => Some(Plan::Policies(vec![policy("acme-minute", 500)])),
        "globex" => Some(Plan::Tier("pro".into())),
        "broken" => Some(Plan::Policies(vec![policy("x", 1), policy("x", 2)])),
        "down" => return Err(std::io::Error::other("database down")),
        _ => None,
    })
}

fn resolved_layer(
    limits: &Limits,
    resolver: PlanResolver,
    failure: FailurePolicy,
) -> RateLimitLayer<MemoryStore, Header> {
    RateLimitLayer::builder(MemoryStore::new())
        .key(customer())
        .limits(limits.clone())
        .resolve_plan(resolver)
        .on_store_failure(failure)
        .info_in_extensions(true)
        .build()
        .expect("valid layer")
}

fn tiered() -> Limits {
    Limits::new(
        LimitSet::builder()
            .policy(policy("free-minute", 10))
            .tier("pro", [policy("pro-minute", 100)])
            .build()
            .unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_misses_make_one_lookup() {
    let calls = Arc::new(AtomicUsize::new(0));
    let resolver = counting_resolver(&calls, Duration::from_millis(50), plans).build();
    let layer = resolved_layer(&tiered(), resolver.clone(), FailurePolicy::FailOpen);
    let service = service(&layer);
    let answers =
        futures::future::join_all((0..100).map(|_| service.clone().oneshot(request("acme")))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "single flight");
    for answer in answers {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(header(&answer, "x-source"), "resolver");
        assert_eq!(header(&answer, "x-policies"), "acme-minute");
        assert_eq!(
            header(&answer, "ratelimit-policy"),
            "\"acme-minute\";q=500;w=60"
        );
    }
    // Cached: no more lookups.
    service.clone().oneshot(request("acme")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // After the TTL, asked again; after an invalidation too.
    tokio::time::advance(portcullis::tower::rate_limit::DEFAULT_PLAN_TTL + Duration::from_secs(1))
        .await;
    service.clone().oneshot(request("acme")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    resolver.invalidate("acme");
    service.clone().oneshot(request("acme")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn unknown_customers_get_the_defaults_and_are_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let limits = tiered();
    let resolver = counting_resolver(&calls, Duration::ZERO, plans)
        .unknown_ttl(Duration::from_secs(5))
        .build();
    let service = service(&resolved_layer(&limits, resolver, FailurePolicy::FailOpen));
    for _ in 0..3 {
        let answer = service.clone().oneshot(request("stranger")).await.unwrap();
        assert_eq!(header(&answer, "x-source"), "default");
        assert_eq!(header(&answer, "x-policies"), "free-minute");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "negative cache");
    tokio::time::advance(Duration::from_secs(6)).await;
    service.clone().oneshot(request("stranger")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A plan naming a tier follows the tier as the limits change.
    let answer = service.clone().oneshot(request("globex")).await.unwrap();
    assert_eq!(
        (header(&answer, "x-source"), header(&answer, "x-policies")),
        ("tier".to_owned(), "pro-minute".to_owned())
    );
    limits
        .update(|set| set.tier("pro", [policy("pro-minute-2", 200)]))
        .unwrap();
    let answer = service.clone().oneshot(request("globex")).await.unwrap();
    assert_eq!(header(&answer, "x-policies"), "pro-minute-2");
    assert_eq!(header(&answer, "x-version"), "2");
    // An override in the limits wins over the plan.
    limits
        .update(|set| set.override_policies("globex", [policy("globex-deal", 7)]))
        .unwrap();
    let answer = service.clone().oneshot(request("globex")).await.unwrap();
    assert_eq!(
        (header(&answer, "x-source"), header(&answer, "x-policies")),
        ("override".to_owned(), "globex-deal".to_owned())
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_or_invalid_lookup_gets_the_defaults_by_default() {
    let calls = Arc::new(AtomicUsize::new(0));
    let resolver = counting_resolver(&calls, Duration::ZERO, plans)
        .error_ttl(Duration::from_secs(1))
        .build();
    let service = service(&resolved_layer(
        &tiered(),
        resolver,
        FailurePolicy::FailClosed,
    ));
    for customer in ["down", "broken"] {
        let answer = service.clone().oneshot(request(customer)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{customer}");
        assert_eq!(header(&answer, "x-source"), "resolver_failed");
        assert_eq!(header(&answer, "x-policies"), "free-minute");
    }
    // Remembered for the error TTL, then asked again.
    service.clone().oneshot(request("down")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    tokio::time::advance(Duration::from_millis(1_500)).await;
    service.clone().oneshot(request("down")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_slow_lookup_times_out_into_the_chosen_answer() {
    let calls = Arc::new(AtomicUsize::new(0));
    // Defaults on failure: the request waits the timeout, then the defaults.
    let resolver = counting_resolver(&calls, Duration::from_secs(30), plans)
        .timeout(Duration::from_millis(200))
        .build();
    let service_defaults = service(&resolved_layer(
        &tiered(),
        resolver,
        FailurePolicy::FailClosed,
    ));
    let started = tokio::time::Instant::now();
    let answer = service_defaults.oneshot(request("acme")).await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(200),
        "paused clock: exactly the timeout"
    );
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(header(&answer, "x-source"), "resolver_failed");

    // The failure policy on failure: fail closed answers 503, fail open
    // lets the request through undecided.
    for (failure, status) in [
        (FailurePolicy::FailClosed, StatusCode::SERVICE_UNAVAILABLE),
        (FailurePolicy::FailOpen, StatusCode::OK),
    ] {
        let resolver = counting_resolver(&calls, Duration::from_secs(30), plans)
            .timeout(Duration::from_millis(200))
            .on_failure(ResolverFailure::FailurePolicy)
            .build();
        let service = service(&resolved_layer(&tiered(), resolver, failure));
        let answer = service.oneshot(request("acme")).await.unwrap();
        assert_eq!(answer.status(), status);
        // Not checked: no rate-limit info.
        assert!(!answer.headers().contains_key("x-source"));
        // Neither is a rate-limit decision: no rate-limit fields.
        assert!(!answer.headers().contains_key("ratelimit"));
    }
}

#[tokio::test]
async fn a_plan_source_shows_in_the_info_and_a_layer_refuses_policies_beside_limits() {
    let limits = tiered();
    let err = RateLimitLayer::builder(MemoryStore::new())
        .policy(policy("x", 1))
        .limits(limits.clone())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("Limits handle"), "{err}");
    let layer = layer_over(&limits);
    let answer = service(&layer).oneshot(request("bob")).await.unwrap();
    assert_eq!(header(&answer, "x-source"), PolicySource::Default.as_str());
    assert_eq!(header(&answer, "x-version"), "1");
}
