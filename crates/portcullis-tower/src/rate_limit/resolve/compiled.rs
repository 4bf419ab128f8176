//! A [`LimitSet`] compiled for the layer ([`Compiled`]: each tier and
//! override a [`Tier`], headers precomputed) by the writer that swaps it
//! in, before it is in force, so requests never build one; the tier a
//! cached plan gives under it ([`apply`]); and the warning and count when
//! a plan names a tier the limits do not define ([`MissingTiers`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use foldhash::fast::FixedState;
use parking_lot::Mutex;
use portcullis_core::{LimitSet, Policy, PolicySource};

use super::plan::{Cached, Picked, ResolverFailure};
use crate::rate_limit::tier::Tier;

/// Distinct tier names the missing-tier metric labels (then `other`), and
/// missing tiers remembered as warned about.
const MISSING_TIER_LABELS: usize = 32;

/// A [`LimitSet`] made ready for the layer: each tier and override with its
/// headers precomputed, once per version.
pub(super) struct Compiled {
    pub(super) version: u64,
    pub(super) defaults: Arc<Tier>,
    /// The defaults as applied when a resolver failed.
    failed: Arc<Tier>,
    pub(super) tiers: HashMap<Arc<str>, Arc<Tier>, FixedState>,
    pub(super) overrides: HashMap<Arc<str>, Arc<Tier>, FixedState>,
    /// Missing tiers: shared by every version of one layer.
    missing: Arc<MissingTiers>,
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiled")
            .field("version", &self.version)
            .field("tiers", &self.tiers.len())
            .field("overrides", &self.overrides.len())
            .finish_non_exhaustive()
    }
}

impl Compiled {
    pub(super) fn of(set: &LimitSet, missing: Arc<MissingTiers>) -> Self {
        let version = set.version();
        let live = |name: &str, policies: &[Policy], source| {
            // A `LimitSet` is validated: its sets are valid checks.
            Arc::new(Tier::from_valid_live(
                name,
                policies.to_vec(),
                source,
                version,
            ))
        };
        let tiers: HashMap<_, _, FixedState> = set
            .tiers()
            .map(|(name, policies)| (Arc::from(name), live(name, policies, PolicySource::Tier)))
            .collect();
        // One tier object per tier that overrides name.
        let mut as_override: HashMap<&str, Arc<Tier>> = HashMap::new();
        let overrides = set
            .overrides()
            .map(|(subject, value)| {
                let tier = match value {
                    portcullis_core::Override::Tier(name) => {
                        Arc::clone(as_override.entry(name).or_insert_with(|| {
                            live(
                                name,
                                set.tier(name).map_or(&[][..], |p| &p[..]),
                                PolicySource::Override,
                            )
                        }))
                    }
                    portcullis_core::Override::Policies(policies) => {
                        live(subject, policies, PolicySource::Override)
                    }
                    // `Override` may grow: such an override gets the
                    // defaults.
                    _ => live(
                        portcullis_core::DEFAULT_TIER,
                        set.defaults(),
                        PolicySource::Default,
                    ),
                };
                (Arc::from(subject), tier)
            })
            .collect();
        Self {
            version,
            defaults: live(
                portcullis_core::DEFAULT_TIER,
                set.defaults(),
                PolicySource::Default,
            ),
            failed: live(
                portcullis_core::DEFAULT_TIER,
                set.defaults(),
                PolicySource::ResolverFailed,
            ),
            tiers,
            overrides,
            missing,
        }
    }

    pub(super) fn tier_or_defaults(&self, name: &str) -> &Arc<Tier> {
        self.tiers.get(name).unwrap_or(&self.defaults)
    }

    /// Counts one request whose plan names `tier`, which this set lacks.
    pub(super) fn count_missing(&self, tier: &str) {
        #[cfg(feature = "metrics")]
        {
            let label = self.missing.label(tier);
            metrics::counter!("portcullis_resolver_missing_tier_total", "tier" => label)
                .increment(1);
        }
        let _ = tier;
    }
}

/// The tiers plans named that the limits lacked: which were warned about
/// (until defined again), and the metric's bounded labels.
#[derive(Debug, Default)]
pub(super) struct MissingTiers {
    state: Mutex<MissingState>,
}

#[derive(Debug, Default)]
struct MissingState {
    warned: Vec<Arc<str>>,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    labels: Vec<Arc<str>>,
}

impl MissingTiers {
    /// Whether `tier` is newly missing (not warned about yet): remembers it.
    pub(super) fn first_time(&self, tier: &str) -> bool {
        let mut state = self.state.lock();
        if state.warned.iter().any(|t| &**t == tier) || state.warned.len() >= MISSING_TIER_LABELS {
            return false;
        }
        state.warned.push(tier.into());
        true
    }

    /// Forgets the tiers `set` defines again.
    pub(super) fn defined(&self, set: &LimitSet) {
        self.state
            .lock()
            .warned
            .retain(|tier| set.tier(tier).is_none());
    }

    #[cfg(feature = "metrics")]
    fn label(&self, tier: &str) -> String {
        let mut state = self.state.lock();
        if state.labels.iter().any(|t| &**t == tier) {
            return tier.to_owned();
        }
        if state.labels.len() < MISSING_TIER_LABELS {
            state.labels.push(tier.into());
            return tier.to_owned();
        }
        "other".to_owned()
    }
}

/// The tier a plan lookup's answer gives, against the limits in force, and
/// the tier it named if the limits lack it (warned once per tier, counted).
pub(super) fn apply(
    compiled: &Compiled,
    on_failure: ResolverFailure,
    cached: &Cached,
) -> (Picked, Option<Arc<str>>) {
    let tier = match cached {
        Cached::Defaults => &compiled.defaults,
        Cached::Tier(name) => match compiled.tiers.get(&**name) {
            Some(tier) => tier,
            None => {
                if compiled.missing.first_time(name) {
                    tracing::warn!(
                        tier = %name,
                        version = compiled.version,
                        "a plan names tier {name:?}, which the limits in force do not define: its subjects get the default policies (warned once per tier; counted per request in portcullis_resolver_missing_tier_total); define the tier, or change the plans"
                    );
                }
                compiled.count_missing(name);
                return (
                    Picked::Live(Arc::clone(&compiled.defaults)),
                    Some(Arc::clone(name)),
                );
            }
        },
        Cached::Own(tier) => tier,
        Cached::Failed => match on_failure {
            ResolverFailure::FailurePolicy => return (Picked::Failed, None),
            _ => &compiled.failed,
        },
    };
    (Picked::Live(Arc::clone(tier)), None)
}
