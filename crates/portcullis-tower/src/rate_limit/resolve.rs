//! Per-request policies from data: a live [`Limits`] handle, a tier chosen
//! per request, and an async [`PlanResolver`] behind a bounded cache with
//! single-flight. The limiter's steps that use them
//! ([`Limiter::pick_tier`](super::limiter::Limiter::pick_tier),
//! [`Limiter::on_resolved`](super::limiter::Limiter::on_resolved)) are in
//! `limiter.rs`.

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use foldhash::fast::FixedState;
use hashbrown::HashTable;
use parking_lot::Mutex;
use portcullis_core::{LimitSet, Limits, Policy, PolicySource};
use tokio::sync::watch;
use tokio::time::Instant;

use super::layer::Tier;

type BoxError = Box<dyn Error + Send + Sync + 'static>;
type LookupFn = dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<Option<Plan>, BoxError>> + Send>>
    + Send
    + Sync;

/// Default time a resolved plan is cached: 60 s.
pub const DEFAULT_PLAN_TTL: Duration = Duration::from_secs(60);
/// Default time an unknown subject (the resolver answered `None`) is
/// cached: 10 s.
pub const DEFAULT_UNKNOWN_TTL: Duration = Duration::from_secs(10);
/// Default time a failed or timed-out lookup is remembered before the
/// resolver is asked again: 1 s.
pub const DEFAULT_ERROR_TTL: Duration = Duration::from_secs(1);
/// Default bound on one lookup: 200 ms.
pub const DEFAULT_RESOLVE_TIMEOUT: Duration = Duration::from_millis(200);
/// Default number of subjects whose plans are cached: 100 000.
pub const DEFAULT_PLAN_CAPACITY: usize = 100_000;

const SHARDS: usize = 16;

/// What a [`PlanResolver`] found for a subject: which policies apply.
///
/// ```
/// use portcullis::Policy;
/// use portcullis::tower::Plan;
///
/// # fn main() -> Result<(), portcullis::PolicyError> {
/// let pro = Plan::Tier("pro".into());
/// let own = Plan::Policies(vec![Policy::per_minute(5_000).name("acme-minute").build()?]);
/// # let _ = (pro, own); Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Plan {
    /// The default policies.
    Default,
    /// The policies of this tier of the layer's [`Limits`] (the defaults
    /// if it has no such tier). Changes to the tier apply at once.
    Tier(String),
    /// Policies of the subject's own, such as a quota a customer bought.
    /// Checked together, so their names must differ.
    Policies(Vec<Policy>),
}

/// What the layer does when a [`PlanResolver`] lookup fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResolverFailure {
    /// Apply the default policies (the default): the request is still
    /// limited, perhaps more strictly than the subject's plan says.
    #[default]
    Defaults,
    /// Apply the layer's [`FailurePolicy`](crate::FailurePolicy), as when
    /// the store fails: let the request through (counted as undecided),
    /// answer `503`, or check the fallback store with the defaults.
    FailurePolicy,
}

/// Looks up the plan of each subject (in a database, a Redis hash, a
/// billing API) for a [`RateLimitLayer`](crate::RateLimitLayer), behind a
/// bounded cache.
///
/// - **Cache.** A found plan is kept for the TTL
///   ([`DEFAULT_PLAN_TTL`]); an unknown subject (`Ok(None)`: the defaults)
///   for its own TTL ([`DEFAULT_UNKNOWN_TTL`]); at most
///   [`capacity`](PlanResolverBuilder::capacity) subjects (expired ones go
///   first, then any). A cached `Plan::Tier` follows changes of the tier at
///   once; [`invalidate`](Self::invalidate) drops a subject's cached plan
///   (call it when you change one, on every instance).
/// - **Single flight.** Concurrent requests of one uncached subject make
///   one lookup and all wait for it.
/// - **Failures.** A lookup that fails or takes longer than the
///   [`timeout`](PlanResolverBuilder::timeout) ([`DEFAULT_RESOLVE_TIMEOUT`])
///   is answered as [`ResolverFailure`] says (default: the default
///   policies), remembered for [`DEFAULT_ERROR_TTL`] so a failing backend is
///   not asked on every request, logged at `warn` (at most once per
///   second), and with feature `metrics` counted in
///   `portcullis_resolver_failures_total` (label `reason`: `error`,
///   `timeout`, `invalid`). `portcullis_resolver_lookups_total` counts
///   lookups (label `outcome`: `found`, `unknown`, `failed`).
///
/// Lookups run as Tokio tasks, so a request that gives up waiting does not
/// cancel the lookup others wait for. Clones share one cache.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{LimitSet, Limits, MemoryStore, Policy};
/// use portcullis::tower::{Header, Plan, PlanResolver, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = Limits::new(LimitSet::builder()
///     .policy(Policy::per_minute(60).name("minute").build()?)
///     .tier("pro", [Policy::per_minute(6_000).name("minute").build()?])
///     .build()?);
/// // A database in real life.
/// let plans = PlanResolver::builder(|customer: String| async move {
///     Ok::<_, std::io::Error>(match customer.as_str() {
///         "acme" => Some(Plan::Tier("pro".into())),
///         "globex" => Some(Plan::Policies(vec![Policy::per_minute(600).name("minute").build().unwrap()])),
///         _ => None, // unknown: the defaults
///     })
/// })
/// .ttl(Duration::from_secs(30))
/// .build();
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .key(Header::new(http::HeaderName::from_static("x-customer")))
///     .limits(limits)
///     .resolve_plan(plans.clone())
///     .build()?;
/// // After changing globex's quota in the database:
/// plans.invalidate("globex");
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone)]
pub struct PlanResolver {
    inner: Arc<ResolverInner>,
}

struct ResolverInner {
    lookup: Box<LookupFn>,
    ttl: Duration,
    unknown_ttl: Duration,
    error_ttl: Duration,
    timeout: Duration,
    on_failure: ResolverFailure,
    per_shard: usize,
    shards: Box<[Mutex<HashTable<Slot>>]>,
    hasher: FixedState,
    /// Failures, logged at most once per second.
    failures: crate::breaker::UndecidedLog,
}

impl fmt::Debug for PlanResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanResolver")
            .field("ttl", &self.inner.ttl)
            .field("unknown_ttl", &self.inner.unknown_ttl)
            .field("error_ttl", &self.inner.error_ttl)
            .field("timeout", &self.inner.timeout)
            .field("on_failure", &self.inner.on_failure)
            .field("capacity", &(self.inner.per_shard * SHARDS))
            .finish_non_exhaustive()
    }
}

/// Configures a [`PlanResolver`]; finish with
/// [`PlanResolverBuilder::build`].
#[must_use = "a builder does nothing until .build() is called"]
pub struct PlanResolverBuilder {
    lookup: Box<LookupFn>,
    ttl: Duration,
    unknown_ttl: Duration,
    error_ttl: Duration,
    timeout: Duration,
    on_failure: ResolverFailure,
    capacity: usize,
}

impl fmt::Debug for PlanResolverBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanResolverBuilder")
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl PlanResolver {
    /// Starts configuring a resolver that looks up a subject's plan with
    /// `lookup` (given the key, as the layer's extractor produces it):
    /// `Ok(Some(plan))`, `Ok(None)` for a subject it does not know (the
    /// defaults), or an error.
    pub fn builder<F, Fut, E>(lookup: F) -> PlanResolverBuilder
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<Plan>, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        PlanResolverBuilder {
            lookup: Box::new(move |key| {
                let future = lookup(key);
                Box::pin(async move { future.await.map_err(Into::into) })
            }),
            ttl: DEFAULT_PLAN_TTL,
            unknown_ttl: DEFAULT_UNKNOWN_TTL,
            error_ttl: DEFAULT_ERROR_TTL,
            timeout: DEFAULT_RESOLVE_TIMEOUT,
            on_failure: ResolverFailure::default(),
            capacity: DEFAULT_PLAN_CAPACITY,
        }
    }

    /// Drops `key`'s cached plan: its next request looks it up again. A
    /// lookup in flight is not affected.
    pub fn invalidate(&self, key: &str) {
        let hash = self.inner.hasher.hash_one(key);
        let mut shard = self.inner.shard(hash).lock();
        if let Ok(slot) = shard.find_entry(hash, |slot| &*slot.key == key) {
            if matches!(slot.get().entry, Entry::Ready { .. }) {
                slot.remove();
            }
        }
    }

    /// Drops every cached plan.
    pub fn invalidate_all(&self) {
        for shard in self.inner.shards.iter() {
            shard
                .lock()
                .retain(|slot| matches!(slot.entry, Entry::Loading(_)));
        }
    }

    /// How many subjects have a plan cached or being looked up.
    #[must_use]
    pub fn cached(&self) -> usize {
        self.inner.shards.iter().map(|s| s.lock().len()).sum()
    }
}

impl PlanResolverBuilder {
    /// How long a found plan is cached (default [`DEFAULT_PLAN_TTL`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long an unknown subject is cached (default
    /// [`DEFAULT_UNKNOWN_TTL`]).
    pub fn unknown_ttl(mut self, ttl: Duration) -> Self {
        self.unknown_ttl = ttl;
        self
    }

    /// How long a failed lookup is remembered (default
    /// [`DEFAULT_ERROR_TTL`]); zero asks again at the next request.
    pub fn error_ttl(mut self, ttl: Duration) -> Self {
        self.error_ttl = ttl;
        self
    }

    /// Bounds each lookup (default [`DEFAULT_RESOLVE_TIMEOUT`]); a slower
    /// one is a failure.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What a failed or timed-out lookup means (default
    /// [`ResolverFailure::Defaults`]).
    pub fn on_failure(mut self, on_failure: ResolverFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// How many subjects are cached at most (default
    /// [`DEFAULT_PLAN_CAPACITY`]).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// The resolver.
    pub fn build(self) -> PlanResolver {
        #[cfg(feature = "metrics")]
        {
            metrics::describe_counter!(
                "portcullis_resolver_lookups_total",
                "Plan lookups by the rate limit's resolver, by outcome (found, unknown, failed)"
            );
            metrics::describe_counter!(
                "portcullis_resolver_failures_total",
                "Plan lookups that failed, by reason (error, timeout, invalid); the layer applied its ResolverFailure choice"
            );
        }
        PlanResolver {
            inner: Arc::new(ResolverInner {
                lookup: self.lookup,
                ttl: self.ttl,
                unknown_ttl: self.unknown_ttl,
                error_ttl: self.error_ttl,
                timeout: self.timeout,
                on_failure: self.on_failure,
                per_shard: self.capacity.div_ceil(SHARDS).max(1),
                shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
                hasher: FixedState::default(),
                failures: crate::breaker::UndecidedLog::new(),
            }),
        }
    }
}

/// A cached answer.
#[derive(Debug, Clone)]
pub(crate) enum Cached {
    Defaults,
    Tier(Arc<str>),
    Own(Arc<Tier>),
    Failed,
}

enum Entry {
    Ready {
        value: Cached,
        expires: Instant,
        /// The tier `value` gives under the compiled limits of this
        /// version: a hit needs no second lookup.
        resolved: Option<(u64, Arc<Tier>)>,
    },
    Loading(watch::Receiver<Option<Cached>>),
}

struct Slot {
    key: Box<str>,
    entry: Entry,
}

impl ResolverInner {
    fn shard(&self, hash: u64) -> &Mutex<HashTable<Slot>> {
        // The hash only spreads keys over shards; truncating it is fine.
        #[allow(clippy::cast_possible_truncation)]
        let index = (hash as usize) % SHARDS;
        &self.shards[index]
    }

    /// The tier for `key` from its cached plan under `compiled`, or a
    /// lookup to wait for (started here unless one is in flight).
    fn pick(self: &Arc<Self>, key: &str, compiled: &Compiled) -> Picked {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash).lock();
        if let Some(slot) = shard.find_mut(hash, |slot| &*slot.key == key) {
            match &mut slot.entry {
                Entry::Ready {
                    value,
                    expires,
                    resolved,
                } if Instant::now() < *expires => {
                    if let Some((version, tier)) = resolved {
                        if *version == compiled.version {
                            return Picked::Live(Arc::clone(tier));
                        }
                    }
                    let picked = apply(compiled, self.on_failure, value);
                    if let Picked::Live(tier) = &picked {
                        *resolved = Some((compiled.version, Arc::clone(tier)));
                    }
                    return picked;
                }
                Entry::Loading(receiver) => return Picked::Later(wait(receiver.clone())),
                Entry::Ready { .. } => {}
            }
        }
        let (sender, receiver) = watch::channel(None);
        if shard.len() >= self.per_shard {
            let now = Instant::now();
            shard.retain(|slot| match &slot.entry {
                Entry::Ready { expires, .. } => *expires > now || &*slot.key == key,
                Entry::Loading(_) => true,
            });
            if shard.len() >= self.per_shard {
                let victim = shard
                    .iter()
                    .find(|slot| matches!(slot.entry, Entry::Ready { .. }) && &*slot.key != key)
                    .map(|slot| slot.key.clone());
                if let Some(victim) = victim {
                    if let Ok(slot) =
                        shard.find_entry(self.hasher.hash_one(&*victim), |s| s.key == victim)
                    {
                        slot.remove();
                    }
                }
            }
        }
        let loading = Entry::Loading(receiver.clone());
        match shard.find_mut(hash, |slot| &*slot.key == key) {
            Some(slot) => slot.entry = loading,
            None => {
                shard.insert_unique(
                    hash,
                    Slot {
                        key: key.into(),
                        entry: loading,
                    },
                    |slot| self.hasher.hash_one(&*slot.key),
                );
            }
        }
        drop(shard);
        let inner = Arc::clone(self);
        let owned = key.to_owned();
        let task = async move {
            let key = owned;
            let value = inner.look_up(&key).await;
            inner.finish(&key, value.clone());
            let _ = sender.send(Some(value));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(task);
            }
            Err(_) => {
                tracing::error!("the rate limit's plan resolver needs a Tokio runtime; the subject's lookup failed");
                self.finish(key, Cached::Failed);
            }
        }
        Picked::Later(wait(receiver))
    }

    /// Caches a lookup's answer (replacing the in-flight marker).
    fn finish(&self, key: &str, value: Cached) {
        let ttl = match &value {
            Cached::Defaults => self.unknown_ttl,
            Cached::Failed => self.error_ttl,
            Cached::Tier(_) | Cached::Own(_) => self.ttl,
        };
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash).lock();
        let entry = Entry::Ready {
            value,
            expires: Instant::now() + ttl,
            resolved: None,
        };
        match shard.find_entry(hash, |slot| &*slot.key == key) {
            Ok(slot) if ttl.is_zero() => {
                slot.remove();
            }
            Ok(mut slot) => slot.get_mut().entry = entry,
            Err(_) if ttl.is_zero() => {}
            Err(_) => {
                shard.insert_unique(
                    hash,
                    Slot {
                        key: key.into(),
                        entry,
                    },
                    |slot| self.hasher.hash_one(&*slot.key),
                );
            }
        }
    }

    async fn look_up(&self, key: &str) -> Cached {
        let outcome = tokio::time::timeout(self.timeout, (self.lookup)(key.to_owned())).await;
        let (value, failure) = match outcome {
            Ok(Ok(None)) => (Cached::Defaults, None),
            Ok(Ok(Some(Plan::Default))) => (Cached::Defaults, None),
            Ok(Ok(Some(Plan::Tier(tier)))) => (Cached::Tier(tier.into()), None),
            Ok(Ok(Some(Plan::Policies(policies)))) => {
                match Tier::new_live(key, policies, PolicySource::Resolver, 0) {
                    Ok(tier) => (Cached::Own(Arc::new(tier)), None),
                    Err(error) => (Cached::Failed, Some(("invalid", error.to_string()))),
                }
            }
            Ok(Err(error)) => (Cached::Failed, Some(("error", error.to_string()))),
            Err(_) => (
                Cached::Failed,
                Some(("timeout", format!("no answer within {:?}", self.timeout))),
            ),
        };
        #[cfg(feature = "metrics")]
        {
            let outcome = match &value {
                Cached::Defaults => "unknown",
                Cached::Failed => "failed",
                _ => "found",
            };
            metrics::counter!("portcullis_resolver_lookups_total", "outcome" => outcome)
                .increment(1);
        }
        if let Some((reason, error)) = failure {
            #[cfg(feature = "metrics")]
            metrics::counter!("portcullis_resolver_failures_total", "reason" => reason)
                .increment(1);
            tracing::debug!(key, reason, %error, "plan lookup failed");
            if let Some(count) = self.failures.record() {
                tracing::warn!(
                    reason,
                    %error,
                    count,
                    on_failure = ?self.on_failure,
                    "rate limit plan lookups failing: {count} since the last such warning"
                );
            }
        }
        value
    }
}

/// The tier a plan lookup's answer gives, against the limits in force.
fn apply(compiled: &Compiled, on_failure: ResolverFailure, cached: &Cached) -> Picked {
    Picked::Live(Arc::clone(match cached {
        Cached::Defaults => &compiled.defaults,
        Cached::Tier(name) => compiled.tier_or_defaults(name),
        Cached::Own(tier) => tier,
        Cached::Failed => match on_failure {
            ResolverFailure::FailurePolicy => return Picked::Failed,
            _ => &compiled.failed,
        },
    }))
}

/// A lookup to wait for: its answer, once in.
pub(crate) type Lookup = Pin<Box<dyn Future<Output = Cached> + Send>>;

fn wait(mut receiver: watch::Receiver<Option<Cached>>) -> Lookup {
    Box::pin(async move {
        match receiver.wait_for(Option::is_some).await {
            Ok(value) => value.clone().unwrap_or(Cached::Failed),
            // The task ended without an answer (its runtime shut down).
            Err(_) => Cached::Failed,
        }
    })
}

/// A [`LimitSet`] made ready for the layer: each tier and override with its
/// headers precomputed, once per version.
#[derive(Debug)]
pub(crate) struct Compiled {
    version: u64,
    defaults: Arc<Tier>,
    /// The defaults as applied when a resolver failed.
    failed: Arc<Tier>,
    tiers: HashMap<Arc<str>, Arc<Tier>, FixedState>,
    overrides: HashMap<Arc<str>, Arc<Tier>, FixedState>,
}

impl Compiled {
    fn of(set: &LimitSet) -> Self {
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
        }
    }

    fn tier_or_defaults(&self, name: &str) -> &Arc<Tier> {
        self.tiers.get(name).unwrap_or(&self.defaults)
    }
}

/// The per-request side of a layer whose policies come from data.
pub(crate) struct Live {
    limits: Limits,
    compiled: ArcSwap<Compiled>,
    compiling: Mutex<()>,
    plans: Option<PlanResolver>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("version", &self.limits.version())
            .field("plans", &self.plans)
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
    Later(Lookup),
    /// The resolver failed and the failure policy applies.
    Failed,
}

impl Live {
    pub(crate) fn new(limits: Limits, plans: Option<PlanResolver>) -> Self {
        let compiled = Compiled::of(&limits.load());
        Self {
            limits,
            compiled: ArcSwap::from_pointee(compiled),
            compiling: Mutex::new(()),
            plans,
        }
    }

    /// The compiled set in force: one atomic load of the version and one
    /// of the compiled set, unless the version changed.
    #[inline]
    fn current(&self) -> Guard<Arc<Compiled>> {
        let compiled = self.compiled.load();
        if compiled.version >= self.limits.version() {
            return compiled;
        }
        drop(compiled);
        self.recompile();
        self.compiled.load()
    }

    #[cold]
    fn recompile(&self) {
        let _compiling = self.compiling.lock();
        if self.compiled.load().version >= self.limits.version() {
            return;
        }
        let set = self.limits.load();
        tracing::debug!(version = set.version(), "rate limit: new limits in force");
        self.compiled.store(Arc::new(Compiled::of(&set)));
    }

    /// Every set of policies `key` may be checked under now: the defaults,
    /// each tier, its override and its cached plan.
    pub(crate) fn sets_for(&self, key: &str) -> Vec<Arc<Tier>> {
        let compiled = self.current();
        let mut sets = vec![Arc::clone(&compiled.defaults)];
        sets.extend(compiled.tiers.values().cloned());
        sets.extend(compiled.overrides.get(key).cloned());
        if let Some(plans) = &self.plans {
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
                .find(hash, |slot| &*slot.key == key)
            {
                sets.push(Arc::clone(tier));
            }
        }
        sets
    }

    /// The tier for a request: the key's override, else its plan, else the
    /// tier `select` names, else the defaults.
    pub(crate) fn pick(&self, key: &str, select: Option<&str>) -> Picked {
        let compiled = self.current();
        if let Some(tier) = compiled.overrides.get(key) {
            return Picked::Live(Arc::clone(tier));
        }
        if let Some(plans) = &self.plans {
            return plans.inner.pick(key, &compiled);
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
        match &self.plans {
            Some(plans) => apply(&compiled, plans.inner.on_failure, cached),
            None => Picked::Live(Arc::clone(&compiled.defaults)),
        }
    }
}
