//! [`Live`], the per-request side of a layer whose policies come from
//! data: the [`Compiled`] set in force (compiled by the writer of the
//! [`Limits`] before it is in force), the tier a request gets (its
//! override, its plan, the chosen tier, the defaults), and every set a
//! key may be checked under (for `reset`).

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use foldhash::fast::FixedState;
use http::request::Parts;
use portcullis_core::{LimitSet, Limits, LimitsSubscription};
use tokio::time::Instant;

use super::cache::{Entry, Slot};
use super::compiled::{apply, Compiled, MissingTiers};
use super::plan::{Cached, Picked};
use super::resolver::PlanResolver;
use crate::rate_limit::tier::Tier;

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
                    && *expires > now
                    && !compiled.tiers.contains_key(&**name)
                {
                    *counts.entry(Arc::clone(name)).or_default() += 1;
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
