//! The layer's side of live [`Limits`]: each [`LimitSet`] compiled for the
//! layer (headers precomputed) by the writer that swaps it in, before it is
//! in force, so requests never build one; the tier a request gets; and the
//! warning and count when a plan names a tier the limits do not define.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use foldhash::fast::FixedState;
use http::request::Parts;
use parking_lot::Mutex;
use portcullis_core::{LimitSet, Limits, LimitsSubscription, Policy, PolicySource};
use tokio::time::Instant;

use super::cache::{Cached, Entry, Slot};
use super::{PlanResolver, ResolverFailure};
use crate::rate_limit::Tier;

/// Distinct tier names the missing-tier metric labels (then `other`), and
/// missing tiers remembered as warned about.
const MISSING_TIER_LABELS: usize = 32;

/// A [`LimitSet`] made ready for the layer: each tier and override with its
/// headers precomputed, once per version.
pub(crate) struct Compiled {
    pub(super) version: u64,
    defaults: Arc<Tier>,
    /// The defaults as applied when a resolver failed.
    failed: Arc<Tier>,
    tiers: HashMap<Arc<str>, Arc<Tier>, FixedState>,
    overrides: HashMap<Arc<str>, Arc<Tier>, FixedState>,
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
    fn of(set: &LimitSet, missing: Arc<MissingTiers>) -> Self {
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

    fn tier_or_defaults(&self, name: &str) -> &Arc<Tier> {
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
struct MissingTiers {
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
    fn first_time(&self, tier: &str) -> bool {
        let mut state = self.state.lock();
        if state.warned.iter().any(|t| &**t == tier) || state.warned.len() >= MISSING_TIER_LABELS {
            return false;
        }
        state.warned.push(tier.into());
        true
    }

    /// Forgets the tiers `set` defines again.
    fn defined(&self, set: &LimitSet) {
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

/// The per-request side of a layer whose policies come from data.
pub(crate) struct Live {
    limits: Limits,
    state: Arc<LiveState>,
    /// Compiles each new set on the writer's thread; dropped with the
    /// layer.
    _compiler: LimitsSubscription,
}

/// What the compiler and the requests share.
struct LiveState {
    compiled: ArcSwap<Compiled>,
    plans: Option<PlanResolver>,
    missing: Arc<MissingTiers>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("version", &self.limits.version())
            .field("plans", &self.state.plans)
            .finish_non_exhaustive()
    }
}

/// The tier a request gets.
pub(crate) enum Picked {
    /// A tier of the layer's static configuration.
    Static(usize),
    /// A tier of the live limits.
    Live(Arc<Tier>),
    /// A lookup to wait for.
    Later(super::Lookup),
    /// The resolver failed and the failure policy applies.
    Failed,
}

impl LiveState {
    /// Compiles a new set, then publishes it: called by the writer
    /// ([`Limits::on_change`]) before the set is in force. The old compiled
    /// set serves requests meanwhile.
    fn compile(&self, set: &LimitSet) {
        self.missing.defined(set);
        let compiled = Compiled::of(set, Arc::clone(&self.missing));
        self.warn_missing_tiers(&compiled);
        tracing::debug!(version = set.version(), "rate limit: new limits compiled");
        self.compiled.store(Arc::new(compiled));
    }

    /// Warns once per tier that cached plans name and `compiled` lacks,
    /// with the number of subjects whose plan names it.
    fn warn_missing_tiers(&self, compiled: &Compiled) {
        let Some(plans) = &self.plans else { return };
        let now = Instant::now();
        let mut counts: HashMap<Arc<str>, usize, FixedState> = HashMap::default();
        for shard in plans.inner.shards.iter() {
            for slot in shard.lock().table.iter() {
                if let Entry::Ready {
                    value: Cached::Tier(name),
                    expires,
                    ..
                } = &slot.entry
                {
                    if *expires > now && !compiled.tiers.contains_key(&**name) {
                        *counts.entry(Arc::clone(name)).or_default() += 1;
                    }
                }
            }
        }
        for (tier, subjects) in counts {
            if self.missing.first_time(&tier) {
                tracing::warn!(
                    tier = %tier,
                    subjects,
                    version = compiled.version,
                    "the limits now in force (version {}) do not define tier {tier:?}, which the plans of {subjects} cached subjects name: they get the default policies (counted per request in portcullis_resolver_missing_tier_total); define the tier again, or change their plans",
                    compiled.version
                );
            }
        }
    }
}

impl Live {
    pub(crate) fn new(limits: Limits, plans: Option<PlanResolver>) -> Self {
        let missing = Arc::new(MissingTiers::default());
        let state = Arc::new(LiveState {
            compiled: ArcSwap::from_pointee(Compiled::of(&limits.load(), Arc::clone(&missing))),
            plans,
            missing,
        });
        let compiler = {
            let state = Arc::clone(&state);
            // Called at once with the set in force (which may have changed
            // since the load above), then with each new one.
            limits.on_change(move |set| {
                if set.version() != state.compiled.load().version {
                    state.compile(set);
                }
            })
        };
        Self {
            limits,
            state,
            _compiler: compiler,
        }
    }

    /// The compiled set in force: one atomic load. The writer compiled it
    /// before the set it was built from was in force.
    #[inline]
    fn current(&self) -> Guard<Arc<Compiled>> {
        self.state.compiled.load()
    }

    /// Every set of policies `key` may be checked under now: the defaults,
    /// each tier, its override and its cached plan.
    pub(crate) fn sets_for(&self, key: &str) -> Vec<Arc<Tier>> {
        use std::hash::BuildHasher;
        let compiled = self.current();
        let mut sets = vec![Arc::clone(&compiled.defaults)];
        sets.extend(compiled.tiers.values().cloned());
        sets.extend(compiled.overrides.get(key).cloned());
        if let Some(plans) = &self.state.plans {
            let hash = plans.inner.hasher.hash_one(key);
            if let Some(Slot {
                entry:
                    Entry::Ready {
                        value: Cached::Own(tier),
                        ..
                    },
                ..
            }) = plans
                .inner
                .shard(hash)
                .lock()
                .table
                .find(hash, |slot| &*slot.key == key)
            {
                sets.push(Arc::clone(tier));
            }
        }
        sets
    }

    /// The tier for a request (`parts`, its key `key`): the key's override,
    /// else its plan, else the tier `select` names, else the defaults.
    pub(crate) fn pick(&self, parts: &Parts, key: &str, select: Option<&str>) -> Picked {
        let compiled = self.current();
        if let Some(tier) = compiled.overrides.get(key) {
            return Picked::Live(Arc::clone(tier));
        }
        if let Some(plans) = &self.state.plans {
            return plans.inner.pick(parts, key, &compiled);
        }
        Picked::Live(Arc::clone(match select {
            Some(name) => compiled.tier_or_defaults(name),
            None => &compiled.defaults,
        }))
    }

    /// The tier for a request whose lookup has answered.
    pub(crate) fn picked_later(&self, key: &str, cached: &Cached) -> Picked {
        let compiled = self.current();
        // An override set while the lookup ran wins.
        if let Some(tier) = compiled.overrides.get(key) {
            return Picked::Live(Arc::clone(tier));
        }
        match &self.state.plans {
            Some(plans) => apply(&compiled, plans.inner.on_failure, cached).0,
            None => Picked::Live(Arc::clone(&compiled.defaults)),
        }
    }
}
