//! Metrics (feature `metrics`): counters per policy and the store latency.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `portcullis_allowed_total` | counter | `policy` |
//! | `portcullis_denied_total` | counter | `policy` (the denying policies) |
//! | `portcullis_dry_run_denied_total` | counter | `policy` |
//! | `portcullis_store_errors_total` | counter | `policy` |
//! | `portcullis_fail_open_total` | counter | `policy` (requests let through undecided) |
//! | `portcullis_store_latency_seconds` | histogram | `policy` |
//! | `portcullis_concurrency_granted_total` | counter | `policy` (a concurrency policy) |
//! | `portcullis_concurrency_denied_total` | counter | `policy` |
//! | `portcullis_concurrency_store_errors_total` | counter | `policy` (errors and timeouts) |
//! | `portcullis_concurrency_fail_open_total` | counter | `policy` (requests run without a permit) |

use portcullis_core::{StoreError, Verdict};

/// A store error as `tracing` records an error value: its `Display` (what
/// went wrong, what to do) and, with `tracing-subscriber`'s formatters, its
/// `source()` chain (the backend's error) as `error.sources`. `%error`
/// would print the first alone.
pub(crate) fn chain(error: &StoreError) -> &(dyn std::error::Error + 'static) {
    error
}

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
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        "portcullis_allowed_total",
        Unit::Count,
        "Requests a rate-limit policy admitted, per policy."
    );
    describe_counter!(
        "portcullis_denied_total",
        Unit::Count,
        "Requests denied, counted for each policy that denied them."
    );
    describe_counter!(
        "portcullis_dry_run_denied_total",
        Unit::Count,
        "Requests a dry-run layer would have denied (they were forwarded), per denying policy."
    );
    describe_counter!(
        "portcullis_store_errors_total",
        Unit::Count,
        "Rate-limit checks the store failed to answer (errors and timeouts), per policy."
    );
    describe_counter!(
        "portcullis_fail_open_total",
        Unit::Count,
        "Requests let through undecided because the store failed (fail-open), per policy."
    );
    describe_histogram!(
        "portcullis_store_latency_seconds",
        Unit::Seconds,
        "Time from sending a rate-limit check to the store's answer, per policy."
    );
    describe_counter!(
        "portcullis_concurrency_granted_total",
        Unit::Count,
        "Requests a concurrency policy gave a permit to, per policy."
    );
    describe_counter!(
        "portcullis_concurrency_denied_total",
        Unit::Count,
        "Requests a concurrency policy refused (every permit held, or no room for a new subject), per policy."
    );
    describe_counter!(
        "portcullis_concurrency_store_errors_total",
        Unit::Count,
        "Permit acquires the store failed to answer (errors and timeouts), per concurrency policy."
    );
    describe_counter!(
        "portcullis_concurrency_fail_open_total",
        Unit::Count,
        "Requests run without a permit because the store failed (fail-open), per concurrency policy."
    );
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
/// and reads no clock: see [`recording`].
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
        Self {
            allowed: key("portcullis_allowed_total"),
            denied: key("portcullis_denied_total"),
            dry_run_denied: key("portcullis_dry_run_denied_total"),
            store_errors: key("portcullis_store_errors_total"),
            fail_open: key("portcullis_fail_open_total"),
            latency: key("portcullis_store_latency_seconds"),
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
    Granted,
    Denied,
    StoreError,
    FailOpen,
}

/// Counts `event` for the concurrency policy `policy` (its name).
pub(crate) fn concurrency(policy: &std::sync::Arc<str>, event: Concurrency) {
    #[cfg(feature = "metrics")]
    if recording() {
        let name = match event {
            Concurrency::Granted => "portcullis_concurrency_granted_total",
            Concurrency::Denied => "portcullis_concurrency_denied_total",
            Concurrency::StoreError => "portcullis_concurrency_store_errors_total",
            Concurrency::FailOpen => "portcullis_concurrency_fail_open_total",
        };
        metrics::counter!(name, "policy" => metrics::SharedString::from(std::sync::Arc::clone(policy)))
            .increment(1);
    }
    let _ = (policy, event);
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
