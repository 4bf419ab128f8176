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

/// The `policy` labels of a set of policies, made once when its tier is
/// built, so a request's metrics clone an `Arc` per policy and format
/// nothing (empty without feature `metrics`).
#[derive(Debug, Default)]
pub(crate) struct PolicyLabels {
    #[cfg(feature = "metrics")]
    names: Box<[std::sync::Arc<str>]>,
}

impl PolicyLabels {
    pub(crate) fn of(policies: &[portcullis_core::Policy]) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = policies;
        Self {
            #[cfg(feature = "metrics")]
            names: policies
                .iter()
                .map(|p| std::sync::Arc::from(p.name()))
                .collect(),
        }
    }
}

#[cfg(feature = "metrics")]
fn each_policy(labels: &PolicyLabels, mut f: impl FnMut(metrics::SharedString)) {
    for name in labels.names.iter() {
        f(metrics::SharedString::from(std::sync::Arc::clone(name)));
    }
}

#[cfg(feature = "metrics")]
fn each_denying(labels: &PolicyLabels, verdict: &Verdict, name: &'static str) {
    for (policy, decision) in labels.names.iter().zip(verdict.decisions()) {
        if !decision.is_allowed() {
            metrics::counter!(name, "policy" => metrics::SharedString::from(std::sync::Arc::clone(policy)))
                .increment(1);
        }
    }
}

pub(crate) fn allowed(labels: &PolicyLabels) {
    #[cfg(feature = "metrics")]
    each_policy(labels, |policy| {
        metrics::counter!("portcullis_allowed_total", "policy" => policy).increment(1);
    });
    let _ = labels;
}

pub(crate) fn denied(labels: &PolicyLabels, verdict: &Verdict) {
    #[cfg(feature = "metrics")]
    each_denying(labels, verdict, "portcullis_denied_total");
    let _ = (labels, verdict);
}

pub(crate) fn dry_run_denied(labels: &PolicyLabels, verdict: &Verdict) {
    #[cfg(feature = "metrics")]
    each_denying(labels, verdict, "portcullis_dry_run_denied_total");
    let _ = (labels, verdict);
}

pub(crate) fn store_error(labels: &PolicyLabels) {
    #[cfg(feature = "metrics")]
    each_policy(labels, |policy| {
        metrics::counter!("portcullis_store_errors_total", "policy" => policy).increment(1);
    });
    let _ = labels;
}

pub(crate) fn fail_open(labels: &PolicyLabels) {
    #[cfg(feature = "metrics")]
    each_policy(labels, |policy| {
        metrics::counter!("portcullis_fail_open_total", "policy" => policy).increment(1);
    });
    let _ = labels;
}

#[cfg(feature = "metrics")]
pub(crate) fn store_latency(labels: &PolicyLabels, latency: std::time::Duration) {
    each_policy(labels, |policy| {
        metrics::histogram!("portcullis_store_latency_seconds", "policy" => policy)
            .record(latency.as_secs_f64());
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
    {
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
