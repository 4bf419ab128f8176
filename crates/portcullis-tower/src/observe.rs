//! Metrics (feature `metrics`): what the layers count, under names modelled
//! on OpenTelemetry's rate-limiting metrics for ASP.NET Core (the only
//! semantic conventions for rate limiting so far), in Prometheus' form.
//! Labels are bounded: a policy's name and a result, never the subject.
//!
//! | metric | kind | labels | OpenTelemetry counterpart |
//! |---|---|---|---|
//! | `portcullis_requests_total` | counter | `policy`, `result` | `aspnetcore.rate_limiting.requests` |
//! | `portcullis_store_errors_total` | counter | `policy` | |
//! | `portcullis_store_duration_seconds` | histogram | `policy` | |
//! | `portcullis_concurrency_requests_total` | counter | `policy`, `result` | `aspnetcore.rate_limiting.requests` |
//! | `portcullis_concurrency_store_errors_total` | counter | `policy` | |
//! | `portcullis_active_request_leases` | gauge | `policy` | `aspnetcore.rate_limiting.active_request_leases` |
//! | `portcullis_request_lease_duration_seconds` | histogram | `policy` | `aspnetcore.rate_limiting.request_lease.duration` |
//! | `portcullis_resolver_lookups_total` | counter | `outcome` | |
//! | `portcullis_resolver_failures_total` | counter | `reason` | |
//! | `portcullis_resolver_skipped_total` | counter | | |
//! | `portcullis_resolver_missing_tier_total` | counter | `tier` | |
//! | `portcullis_limits_reloads_total` | counter | `outcome` | |
//! | `portcullis_limits_version` | gauge | | |
//! | `portcullis_limits_config_hash` | gauge | | |
//!
//! `result` of a rate-limit request: `allowed` (OpenTelemetry's
//! `acquired`), `denied` (its `endpoint_limiter`; counted for each policy
//! that denied), `dry_run_denied` (a dry-run layer forwarded it), or
//! `failed_open` (the store failed and the request went through
//! undecided). Of a concurrency request: `acquired`, `denied`, or
//! `failed_open` (run without a permit).

use portcullis_core::{StoreError, Verdict};

/// A store error as `tracing` records an error value: its `Display` (what
/// went wrong, what to do) and, with `tracing-subscriber`'s formatters, its
/// `source()` chain (the backend's error) as `error.sources`. `%error`
/// would print the first alone.
pub(crate) fn chain(error: &StoreError) -> &(dyn std::error::Error + 'static) {
    error
}

/// What kind of metric a [`METRICS`] row is.
#[cfg(feature = "metrics")]
#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric portcullis records: name, kind, unit, help. The table in
/// this module's docs, README's "Metrics and dashboard", and the dashboard
/// in `dashboards/` follow it (a test reads the names back through a
/// recorder).
#[cfg(feature = "metrics")]
const METRICS: &[(&str, Kind, metrics::Unit, &str)] = {
    use metrics::Unit::{Count, Seconds};
    use Kind::{Counter, Gauge, Histogram};
    &[
        ("portcullis_requests_total", Counter, Count, "Requests a rate-limit layer decided, per policy and result (allowed, denied, dry_run_denied, failed_open)."),
        ("portcullis_store_errors_total", Counter, Count, "Rate-limit checks the store failed to answer (errors and timeouts), per policy."),
        ("portcullis_store_duration_seconds", Histogram, Seconds, "Time from sending a rate-limit check to the store's answer, per policy."),
        ("portcullis_concurrency_requests_total", Counter, Count, "Requests a concurrency layer decided, per policy and result (acquired, denied, failed_open)."),
        ("portcullis_concurrency_store_errors_total", Counter, Count, "Permit acquires the store failed to answer (errors and timeouts), per concurrency policy."),
        ("portcullis_active_request_leases", Gauge, Count, "Concurrency permits held by requests of this process now, per policy."),
        ("portcullis_request_lease_duration_seconds", Histogram, Seconds, "How long requests held their concurrency permit, per policy."),
        ("portcullis_resolver_lookups_total", Counter, Count, "Plan lookups by the rate limit's resolver, by outcome (found, unknown, failed)."),
        ("portcullis_resolver_failures_total", Counter, Count, "Plan lookups that failed, by reason (error, timeout, invalid, panic, cancelled); the layer applied its ResolverFailure choice."),
        ("portcullis_resolver_skipped_total", Counter, Count, "Requests of uncached subjects checked under the defaults without a lookup: the resolver's lookups in flight or its capacity were at their bound."),
        ("portcullis_resolver_missing_tier_total", Counter, Count, "Requests whose plan names a tier the limits do not define, by tier (at most 32 names, then other); they got the defaults."),
        ("portcullis_limits_reloads_total", Counter, Count, "Reloads of the limits file, by outcome."),
        ("portcullis_limits_version", Gauge, Count, "The version of the limits in force (1 at the first load, one more per applied change)."),
        ("portcullis_limits_config_hash", Gauge, Count, "A hash prefix of the limits file in force, to tell instances on different files apart."),
    ]
};

/// Registers the help text and unit of every portcullis metric with the
/// installed `metrics` recorder (so a Prometheus exporter prints `# HELP`
/// lines). Building a layer calls it ([`RateLimitLayer::new`](crate::RateLimitLayer::new),
/// [`RateLimitLayerBuilder::build`](crate::RateLimitLayerBuilder::build),
/// [`ConcurrencyLimitLayerBuilder::build`](crate::ConcurrencyLimitLayerBuilder::build)),
/// so it only needs calling directly when the recorder is installed after
/// the layer is built.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    metrics::with_recorder(|recorder| {
        for &(name, kind, unit, help) in METRICS {
            let name = metrics::KeyName::from_const_str(name);
            let help = metrics::SharedString::const_str(help);
            match kind {
                Kind::Counter => recorder.describe_counter(name, Some(unit), help),
                Kind::Gauge => recorder.describe_gauge(name, Some(unit), help),
                Kind::Histogram => recorder.describe_histogram(name, Some(unit), help),
            }
        }
    });
}

/// The metric keys of a set of policies, built once when its tier is
/// compiled (each name with its `policy` label, hashed once), so a request
/// builds and allocates no key: it hands the prebuilt key to the recorder
/// in force (empty without feature `metrics`).
///
/// The recorder is asked per request, not when the tier is compiled, so a
/// recorder installed later, or set for a scope with
/// `metrics::with_local_recorder`, sees every request it spans. With no
/// recorder in force (`metrics`' no-op recorder) a request records nothing
/// and reads no clock: see `recording`.
#[derive(Debug, Default)]
pub(crate) struct PolicyLabels {
    #[cfg(feature = "metrics")]
    keys: Box<[PolicyKeys]>,
}

/// One policy's metric keys.
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct PolicyKeys {
    allowed: metrics::Key,
    denied: metrics::Key,
    dry_run_denied: metrics::Key,
    store_errors: metrics::Key,
    fail_open: metrics::Key,
    latency: metrics::Key,
}

#[cfg(feature = "metrics")]
impl PolicyKeys {
    fn of(policy: &str) -> Self {
        let label: metrics::SharedString = std::sync::Arc::<str>::from(policy).into();
        let key = |name: &'static str| {
            metrics::Key::from_parts(name, vec![metrics::Label::new("policy", label.clone())])
        };
        let request = |result: &'static str| {
            metrics::Key::from_parts(
                "portcullis_requests_total",
                vec![
                    metrics::Label::new("policy", label.clone()),
                    metrics::Label::from_static_parts("result", result),
                ],
            )
        };
        Self {
            allowed: request("allowed"),
            denied: request("denied"),
            dry_run_denied: request("dry_run_denied"),
            store_errors: key("portcullis_store_errors_total"),
            fail_open: request("failed_open"),
            latency: key("portcullis_store_duration_seconds"),
        }
    }
}

impl PolicyLabels {
    pub(crate) fn of(policies: &[portcullis_core::Policy]) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = policies;
        Self {
            #[cfg(feature = "metrics")]
            keys: policies.iter().map(|p| PolicyKeys::of(p.name())).collect(),
        }
    }
}

/// What the `metrics` macros would say the layer's metrics come from.
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// Runs `f` with the recorder in force (the scope's local recorder, else
/// the global one), unless that is the no-op recorder `metrics` uses when
/// none is installed: then nothing runs and `None` is returned. The no-op
/// recorder is told apart by its size: a recorder that holds no state
/// (zero-sized, as `metrics::NoopRecorder`) is taken to record nothing.
#[cfg(feature = "metrics")]
#[inline]
fn with_recorder<T>(f: impl FnOnce(&dyn metrics::Recorder) -> T) -> Option<T> {
    metrics::with_recorder(|recorder| (std::mem::size_of_val(recorder) != 0).then(|| f(recorder)))
}

/// Whether a recorder is in force, so the store latency is worth two
/// clock reads.
#[cfg(feature = "metrics")]
#[inline]
pub(crate) fn recording() -> bool {
    with_recorder(|_| ()).is_some()
}

/// Increments the counter `which` picks for each policy `pick` keeps.
#[cfg(feature = "metrics")]
#[inline]
fn count(
    labels: &PolicyLabels,
    which: fn(&PolicyKeys) -> &metrics::Key,
    mut pick: impl FnMut(usize) -> bool,
) {
    with_recorder(|recorder| {
        for (i, keys) in labels.keys.iter().enumerate() {
            if pick(i) {
                recorder
                    .register_counter(which(keys), &METADATA)
                    .increment(1);
            }
        }
    });
}

pub(crate) fn allowed(labels: &PolicyLabels) {
    #[cfg(feature = "metrics")]
    count(labels, |k| &k.allowed, |_| true);
    let _ = labels;
}

/// Counts the policies of `verdict` that denied it.
#[cfg(feature = "metrics")]
fn count_denying(
    labels: &PolicyLabels,
    verdict: &Verdict,
    which: fn(&PolicyKeys) -> &metrics::Key,
) {
    let decisions = verdict.decisions();
    count(labels, which, |i| {
        decisions
            .get(i)
            .is_some_and(|decision| !decision.is_allowed())
    });
}

pub(crate) fn denied(labels: &PolicyLabels, verdict: &Verdict) {
    #[cfg(feature = "metrics")]
    count_denying(labels, verdict, |k| &k.denied);
    let _ = (labels, verdict);
}

pub(crate) fn dry_run_denied(labels: &PolicyLabels, verdict: &Verdict) {
    #[cfg(feature = "metrics")]
    count_denying(labels, verdict, |k| &k.dry_run_denied);
    let _ = (labels, verdict);
}

pub(crate) fn store_error(labels: &PolicyLabels) {
    #[cfg(feature = "metrics")]
    count(labels, |k| &k.store_errors, |_| true);
    let _ = labels;
}

pub(crate) fn fail_open(labels: &PolicyLabels) {
    #[cfg(feature = "metrics")]
    count(labels, |k| &k.fail_open, |_| true);
    let _ = labels;
}

/// Records the store's latency for each policy (when a recorder is in
/// force; callers read the clock only when [`recording`]).
#[cfg(feature = "metrics")]
pub(crate) fn store_latency(labels: &PolicyLabels, latency: std::time::Duration) {
    with_recorder(|recorder| {
        for keys in labels.keys.iter() {
            recorder
                .register_histogram(&keys.latency, &METADATA)
                .record(latency.as_secs_f64());
        }
    });
}

/// What a concurrency layer counts (feature `metrics`), for its policy.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Concurrency {
    Acquired,
    Denied,
    StoreError,
    FailOpen,
}

/// A concurrency policy's metric keys, built once with its layer.
#[derive(Debug)]
pub(crate) struct ConcurrencyLabels {
    #[cfg(feature = "metrics")]
    keys: ConcurrencyKeys,
}

#[cfg(feature = "metrics")]
#[derive(Debug)]
struct ConcurrencyKeys {
    acquired: metrics::Key,
    denied: metrics::Key,
    store_errors: metrics::Key,
    failed_open: metrics::Key,
    active: metrics::Key,
    duration: metrics::Key,
}

impl ConcurrencyLabels {
    pub(crate) fn of(policy: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = policy;
        Self {
            #[cfg(feature = "metrics")]
            keys: {
                let label: metrics::SharedString = std::sync::Arc::<str>::from(policy).into();
                let key = |name: &'static str| {
                    metrics::Key::from_parts(
                        name,
                        vec![metrics::Label::new("policy", label.clone())],
                    )
                };
                let request = |result: &'static str| {
                    metrics::Key::from_parts(
                        "portcullis_concurrency_requests_total",
                        vec![
                            metrics::Label::new("policy", label.clone()),
                            metrics::Label::from_static_parts("result", result),
                        ],
                    )
                };
                ConcurrencyKeys {
                    acquired: request("acquired"),
                    denied: request("denied"),
                    store_errors: key("portcullis_concurrency_store_errors_total"),
                    failed_open: request("failed_open"),
                    active: key("portcullis_active_request_leases"),
                    duration: key("portcullis_request_lease_duration_seconds"),
                }
            },
        }
    }

    /// Counts `event` with the recorder in force.
    pub(crate) fn count(&self, event: Concurrency) {
        #[cfg(feature = "metrics")]
        {
            let keys = &self.keys;
            let key = match event {
                Concurrency::Acquired => &keys.acquired,
                Concurrency::Denied => &keys.denied,
                Concurrency::StoreError => &keys.store_errors,
                Concurrency::FailOpen => &keys.failed_open,
            };
            with_recorder(|recorder| recorder.register_counter(key, &METADATA).increment(1));
        }
        let _ = event;
    }

    /// A permit granted now: counted, and, when a recorder is in force,
    /// the lease gauge raised and a [`LeaseMetrics`] returned that lowers
    /// it and records the hold time when the permit is dropped (on the
    /// same recorder's handles, wherever the drop happens).
    pub(crate) fn acquired(&self) -> Option<LeaseMetrics> {
        self.count(Concurrency::Acquired);
        #[cfg(feature = "metrics")]
        return with_recorder(|recorder| {
            let active = recorder.register_gauge(&self.keys.active, &METADATA);
            active.increment(1.0);
            LeaseMetrics {
                active,
                duration: recorder.register_histogram(&self.keys.duration, &METADATA),
                since: std::time::Instant::now(),
            }
        });
        #[cfg(not(feature = "metrics"))]
        None
    }
}

/// The metrics of a held permit (feature `metrics`, a recorder in force).
pub(crate) struct LeaseMetrics {
    #[cfg(feature = "metrics")]
    active: metrics::Gauge,
    #[cfg(feature = "metrics")]
    duration: metrics::Histogram,
    #[cfg(feature = "metrics")]
    since: std::time::Instant,
}

impl Drop for LeaseMetrics {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        {
            self.active.decrement(1.0);
            self.duration.record(self.since.elapsed().as_secs_f64());
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use metrics::{
        Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    use super::{allowed, recording, PolicyLabels};

    /// Counts every increment, whatever the key.
    #[derive(Default)]
    struct Count(Arc<AtomicU64>);

    impl CounterFn for Count {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::SeqCst);
        }
        fn absolute(&self, _: u64) {}
    }

    impl Recorder for Count {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Count(Arc::clone(&self.0))))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn a_request_records_through_the_recorder_in_force_and_nothing_without_one() {
        let policies = [
            portcullis_core::Policy::per_second(1)
                .name("a")
                .build()
                .unwrap(),
            portcullis_core::Policy::per_minute(9)
                .name("b")
                .build()
                .unwrap(),
        ];
        let labels = PolicyLabels::of(&policies);
        // No recorder installed in this test binary: `metrics`' no-op one.
        assert!(!recording());
        metrics::with_local_recorder(&metrics::NoopRecorder, || assert!(!recording()));

        let count = Count::default();
        metrics::with_local_recorder(&count, || {
            assert!(recording());
            allowed(&labels);
        });
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "one per policy");
        allowed(&labels);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            2,
            "outside the scope: nothing"
        );
    }
}
