//! [`Live`], the per-request side of a layer whose policies come from
//! data: the [`Compiled`] set in force (compiled by the writer of the
//! [`Limits`] before it is in force), the tier a request gets (its
//! override, its plan, the chosen tier, the defaults), and every set a
//! key may be checked under (for `reset`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use foldhash::fast::FixedState;
use portcullis_core::{LimitSet, Limits, LimitsSubscription};
use tokio::time::Instant;

use super::cache::{Entry, Slot};
use super::compiled::{apply, Compiled, MissingTiers};
use super::plan::{Cached, Picked};
use super::resolver::PlanResolver;
use crate::key::RequestHead;
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
    /// Counts the sets compiled: a thread's view of `compiled`
    /// ([`VIEWS`]) is current while this has not moved.
    epoch: AtomicU64,
    /// Names this state in the per-thread views (never reused, unlike an
    /// address).
    id: u64,
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
        // After the store: a thread that sees the new epoch loads a set at
        // least as new as the one it names.
        self.epoch.fetch_add(1, Ordering::Release);
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

/// The compiled set in force, held by one request ([`Live::in_force`]).
pub(crate) struct InForce(Arc<Compiled>);

impl InForce {
    /// The tier of `key`: its override, else the defaults (an empty
    /// table of overrides, the usual case, is not hashed into).
    #[inline]
    pub(crate) fn tier(&self, key: &str) -> &Arc<Tier> {
        let compiled = &*self.0;
        if compiled.overrides.is_empty() {
            return &compiled.defaults;
        }
        compiled.overrides.get(key).unwrap_or(&compiled.defaults)
    }
}

/// Layers with live limits a thread keeps a view for; beyond these, the
/// oldest view is replaced.
const VIEWS_PER_THREAD: usize = 4;

/// One thread's view of a layer's compiled set: the set, and the epoch it
/// was current at.
struct View {
    id: u64,
    epoch: u64,
    compiled: Arc<Compiled>,
}

thread_local! {
    /// Each thread's views of the compiled sets of the layers it serves,
    /// so a request reads its layer's set with one atomic load (the epoch)
    /// instead of an `ArcSwap` load and its release. A view holds its set
    /// until the thread next serves that layer after a change, or another
    /// layer takes its place.
    static VIEWS: RefCell<arrayvec::ArrayVec<View, VIEWS_PER_THREAD>> =
        const { RefCell::new(arrayvec::ArrayVec::new_const()) };
}

/// Identifies each [`LiveState`].
static IDS: AtomicU64 = AtomicU64::new(1);

impl Live {
    pub(crate) fn new(limits: Limits, plans: Option<PlanResolver>) -> Self {
        let missing = Arc::new(MissingTiers::default());
        let state = Arc::new(LiveState {
            compiled: ArcSwap::from_pointee(Compiled::of(&limits.load(), Arc::clone(&missing))),
            epoch: AtomicU64::new(0),
            id: IDS.fetch_add(1, Ordering::Relaxed),
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

    /// The compiled set in force, through this thread's view of it when
    /// that is current (one atomic load and a reference count), else
    /// loaded and kept as the thread's view ([`refresh_view`]).
    ///
    /// [`refresh_view`]: Self::refresh_view
    #[inline(always)]
    fn current_view(&self) -> Arc<Compiled> {
        let state = &*self.state;
        let epoch = state.epoch.load(Ordering::Acquire);
        let viewed = VIEWS.try_with(|views| {
            let views = views.try_borrow().ok()?;
            let view = views
                .iter()
                .find(|view| view.id == state.id && view.epoch == epoch)?;
            Some(Arc::clone(&view.compiled))
        });
        match viewed {
            Ok(Some(compiled)) => compiled,
            _ => self.refresh_view(epoch),
        }
    }

    /// [`current_view`](Self::current_view) when this thread has no
    /// current view of the layer's set: loads it and keeps it as the
    /// thread's view (replacing its old view of this layer, or the oldest
    /// view when the thread keeps [`VIEWS_PER_THREAD`]).
    #[inline(never)]
    fn refresh_view(&self, epoch: u64) -> Arc<Compiled> {
        let state = &*self.state;
        let compiled = state.compiled.load_full();
        let _ = VIEWS.try_with(|views| {
            let Ok(mut views) = views.try_borrow_mut() else {
                return;
            };
            if let Some(view) = views.iter_mut().find(|view| view.id == state.id) {
                view.compiled = Arc::clone(&compiled);
                view.epoch = epoch;
                return;
            }
            if views.is_full() {
                views.remove(0);
            }
            views.push(View {
                id: state.id,
                epoch,
                compiled: Arc::clone(&compiled),
            });
        });
        compiled
    }

    /// Whether a plan resolver chooses requests' tiers.
    pub(crate) fn has_plans(&self) -> bool {
        self.state.plans.is_some()
    }

    /// For a layer without a plan resolver or tier selector: the compiled
    /// set in force, held for one request's check
    /// ([`InForce::tier`] gives the key's tier, borrowed).
    #[inline]
    pub(crate) fn in_force(&self) -> InForce {
        InForce(self.current_view())
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

    /// The tier for `request` (its key `key`): the key's override,
    /// else its plan, else the tier `select` names, else the defaults.
    pub(crate) fn pick(
        &self,
        request: &RequestHead<'_>,
        key: &str,
        select: Option<&str>,
    ) -> Picked {
        let compiled = self.current_view();
        if let Some(tier) = compiled.overrides.get(key) {
            return Picked::Live(Arc::clone(tier));
        }
        if let Some(plans) = &self.state.plans {
            return plans.inner.pick(request, key, &compiled);
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
