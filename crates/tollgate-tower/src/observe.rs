//! Metrics (feature `metrics`): counters per policy and the store latency.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_allowed_total` | counter | `policy` |
//! | `tollgate_denied_total` | counter | `policy` (the denying policies) |
//! | `tollgate_dry_run_denied_total` | counter | `policy` |
//! | `tollgate_store_errors_total` | counter | `policy` |
//! | `tollgate_fail_open_total` | counter | `policy` (requests let through undecided) |
//! | `tollgate_store_latency_seconds` | histogram | `policy` |

use tollgate_core::Verdict;

use crate::layer::Tier;

#[cfg(feature = "metrics")]
fn each_policy(tier: &Tier, mut f: impl FnMut(metrics::SharedString)) {
    for name in tier.metric_names.iter() {
        f(metrics::SharedString::from(std::sync::Arc::clone(name)));
    }
}

#[cfg(feature = "metrics")]
fn each_denying(tier: &Tier, verdict: &Verdict, name: &'static str) {
    for (policy, decision) in tier.metric_names.iter().zip(verdict.decisions()) {
        if !decision.is_allowed() {
            metrics::counter!(name, "policy" => metrics::SharedString::from(std::sync::Arc::clone(policy)))
                .increment(1);
        }
    }
}

pub(crate) fn allowed(tier: &Tier) {
    #[cfg(feature = "metrics")]
    each_policy(tier, |policy| {
        metrics::counter!("tollgate_allowed_total", "policy" => policy).increment(1);
    });
    let _ = tier;
}

pub(crate) fn denied(tier: &Tier, verdict: &Verdict) {
    #[cfg(feature = "metrics")]
    each_denying(tier, verdict, "tollgate_denied_total");
    let _ = (tier, verdict);
}

pub(crate) fn dry_run_denied(tier: &Tier, verdict: &Verdict) {
    #[cfg(feature = "metrics")]
    each_denying(tier, verdict, "tollgate_dry_run_denied_total");
    let _ = (tier, verdict);
}

pub(crate) fn store_error(tier: &Tier) {
    #[cfg(feature = "metrics")]
    each_policy(tier, |policy| {
        metrics::counter!("tollgate_store_errors_total", "policy" => policy).increment(1);
    });
    let _ = tier;
}

pub(crate) fn fail_open(tier: &Tier) {
    #[cfg(feature = "metrics")]
    each_policy(tier, |policy| {
        metrics::counter!("tollgate_fail_open_total", "policy" => policy).increment(1);
    });
    let _ = tier;
}

#[cfg(feature = "metrics")]
pub(crate) fn store_latency(tier: &Tier, latency: std::time::Duration) {
    each_policy(tier, |policy| {
        metrics::histogram!("tollgate_store_latency_seconds", "policy" => policy)
            .record(latency.as_secs_f64());
    });
}
