//! [`PlanResolver`], the handle on a plan cache that layers share, and
//! [`PlanResolverBuilder`], with the defaults it starts from. The cache
//! itself and the lookups it runs are `cache.rs`.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;
use parking_lot::Mutex;
use portcullis_core::subject::hash_subject;

use super::cache::{ResolverInner, Shard, SHARDS};
use super::plan::{BoxError, LookupFn, LookupKey, Plan, ResolverFailure};
#[cfg(doc)]
use crate::key::{ApiKey, BearerToken};

/// Default time a resolved plan is cached: 60 s. Not API (documented on
/// the setter); public, hidden, for the workspace's tests.
#[doc(hidden)]
pub const DEFAULT_PLAN_TTL: Duration = Duration::from_secs(60);
/// Default time an unknown subject (the resolver answered `None`) is
/// cached: 10 s.
pub(crate) const DEFAULT_UNKNOWN_TTL: Duration = Duration::from_secs(10);
/// Default time a failed or timed-out lookup is remembered before the
/// resolver is asked again: 1 s. Not API (documented on the setter);
/// public, hidden, for the workspace's tests.
#[doc(hidden)]
pub const DEFAULT_ERROR_TTL: Duration = Duration::from_secs(1);
/// Default bound on one lookup: 200 ms.
pub(crate) const DEFAULT_RESOLVE_TIMEOUT: Duration = Duration::from_millis(200);
/// Default number of subjects whose plans are cached: 100 000.
pub(crate) const DEFAULT_PLAN_CAPACITY: usize = 100_000;
/// Default bound on lookups in flight at once: 64.
pub(crate) const DEFAULT_MAX_LOOKUPS: usize = 64;

/// Looks up the plan of each subject (in a database, a Redis hash, a
/// billing API) for a [`RateLimitLayer`](crate::RateLimitLayer), behind a
/// bounded cache.
///
/// - **What the lookup is given.** The layer's key, or with
///   [`lookup_key`](PlanResolverBuilder::lookup_key) what the operator's
///   data is keyed by: with [`ApiKey`] or [`BearerToken`] as the layer's
///   key (a SHA-256 hash, `#<hex>`), `.lookup_key(ApiKey::new())` gives the
///   lookup the API key itself. Store keys, logs and the cache keep the
///   layer's key; the credential reaches only the lookup.
/// - **Cache.** A found plan is kept for the [TTL](PlanResolverBuilder::ttl)
///   (default 60 seconds); an unknown subject (`Ok(None)`: the defaults)
///   for its [own TTL](PlanResolverBuilder::unknown_ttl) (default 10
///   seconds). A cached `Plan::Tier` follows changes of the tier at once;
///   [`invalidate`](Self::invalidate) drops a subject's cached plan (call
///   it when you change one, on every instance).
/// - **Bounded.** At most [`capacity`](PlanResolverBuilder::capacity)
///   subjects are held, lookups in flight included. When a shard of the
///   cache (one of 16) is full, expired entries go first, then an eighth
///   of the shard at once: unknown and failed subjects first, then the
///   least recently used (an LRU per shard, approximate across shards).
///   At most [`max_lookups`](PlanResolverBuilder::max_lookups) (default
///   64) lookups run at once: a request of an uncached subject beyond that
///   (or with its shard full of lookups in flight) is checked under the
///   **default policies** without a lookup (a cached but expired plan is
///   used as it was), so a flood of fresh keys costs the backend at most
///   that many queries at a time. Counted with feature `metrics` in
///   `portcullis_resolver_skipped_total`.
/// - **Single flight.** Concurrent requests of one uncached subject make
///   one lookup and all wait for it.
/// - **Failures.** A lookup that fails, panics or takes longer than the
///   [`timeout`](PlanResolverBuilder::timeout) (default 200 ms) is
///   answered as [`ResolverFailure`] says (default: the default policies),
///   remembered for the [`error_ttl`](PlanResolverBuilder::error_ttl)
///   (default 1 second) so a failing backend is not asked on every
///   request, logged at `warn` (at most once per
///   second), and with feature `metrics` counted in
///   `portcullis_resolver_failures_total` (label `reason`: `error`,
///   `timeout`, `invalid`, `panic`, `cancelled`). A lookup cancelled
///   before it answered (its runtime shut down) frees its subject, which
///   is looked up again at its next request. `portcullis_resolver_lookups_total`
///   counts lookups (label `outcome`: `found`, `unknown`, `failed`).
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
///     .key(Header::new(axum::http::HeaderName::from_static("x-customer")))
///     .limits(limits)
///     .resolve_plan(plans.clone())
///     .build()?;
/// // After changing globex's quota in the database:
/// plans.invalidate("globex");
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone)]
pub struct PlanResolver {
    pub(super) inner: Arc<ResolverInner>,
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
            .field("max_lookups", &self.inner.max_lookups)
            .field("lookup_key", &self.inner.lookup_key.is_some())
            .finish_non_exhaustive()
    }
}

/// Configures a [`PlanResolver`]; finish with
/// [`PlanResolverBuilder::build`].
#[must_use = "a builder does nothing until .build() is called"]
pub struct PlanResolverBuilder {
    lookup: Box<LookupFn>,
    lookup_key: Option<Box<dyn LookupKey>>,
    ttl: Duration,
    unknown_ttl: Duration,
    error_ttl: Duration,
    timeout: Duration,
    on_failure: ResolverFailure,
    capacity: usize,
    max_lookups: usize,
}

impl fmt::Debug for PlanResolverBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanResolverBuilder")
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("capacity", &self.capacity)
            .field("max_lookups", &self.max_lookups)
            .finish_non_exhaustive()
    }
}

impl PlanResolver {
    /// Starts configuring a resolver that looks up a subject's plan with
    /// `lookup` (given the key as the layer's extractor produces it, or
    /// what [`lookup_key`](PlanResolverBuilder::lookup_key) gives):
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
            lookup_key: None,
            ttl: DEFAULT_PLAN_TTL,
            unknown_ttl: DEFAULT_UNKNOWN_TTL,
            error_ttl: DEFAULT_ERROR_TTL,
            timeout: DEFAULT_RESOLVE_TIMEOUT,
            on_failure: ResolverFailure::default(),
            capacity: DEFAULT_PLAN_CAPACITY,
            max_lookups: DEFAULT_MAX_LOOKUPS,
        }
    }

    /// Drops `key`'s cached plan, or its lookup in flight (whose answer
    /// then reaches the requests waiting for it but is not cached): its
    /// next request looks it up again. `key` is the layer's key or, for a
    /// layer keyed by a hashed credential ([`ApiKey`], [`BearerToken`]),
    /// the credential itself.
    ///
    /// ```
    /// use portcullis::tower::{Plan, PlanResolver};
    ///
    /// let plans = PlanResolver::builder(|_api_key: String| async { Ok::<_, std::io::Error>(Some(Plan::Default)) }).build();
    /// plans.invalidate("k-live-7f3a"); // the customer's API key, as your database has it
    /// assert_eq!(plans.cached(), 0);
    /// ```
    pub fn invalidate(&self, key: &str) {
        if !self.inner.remove(key) {
            self.inner.remove(&hash_subject(key.as_bytes()));
        }
    }

    /// Drops every cached plan and lookup in flight.
    pub fn invalidate_all(&self) {
        for shard in self.inner.shards.iter() {
            shard.lock().table.clear();
        }
    }

    /// How many subjects have a plan cached or being looked up (at most
    /// the [`capacity`](PlanResolverBuilder::capacity)).
    #[must_use]
    pub fn cached(&self) -> usize {
        self.inner.shards.iter().map(|s| s.lock().table.len()).sum()
    }

    /// How many lookups are running now (at most
    /// [`max_lookups`](PlanResolverBuilder::max_lookups)).
    #[must_use]
    pub fn lookups_in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }
}

impl PlanResolverBuilder {
    /// Gives the lookup what `lookup_key` extracts from each request
    /// instead of the layer's key: [`ApiKey`] or [`BearerToken`] for the
    /// credential itself, when the layer keys on its hash (which a
    /// database cannot be searched by), or a closure
    /// `Fn(&RequestHead, &str) -> Option<String>` (see [`LookupKey`]). The cache,
    /// store keys and logs keep the layer's key.
    ///
    /// ```
    /// use portcullis::{LimitSet, Limits, MemoryStore, Policy};
    /// use portcullis::tower::{ApiKey, Plan, PlanResolver, RateLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limits = Limits::new(LimitSet::builder()
    ///     .policy(Policy::per_minute(60).name("minute").build()?)
    ///     .tier("pro", [Policy::per_minute(6_000).name("minute").build()?])
    ///     .build()?);
    /// let plans = PlanResolver::builder(|api_key: String| async move {
    ///     // SELECT plan FROM customers WHERE api_key = $1
    ///     Ok::<_, std::io::Error>((api_key == "k-live-7f3a").then(|| Plan::Tier("pro".into())))
    /// })
    /// .lookup_key(ApiKey::new())
    /// .build();
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .key(ApiKey::new()) // the store sees "#<sha256>", never the key
    ///     .limits(limits)
    ///     .resolve_plan(plans)
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn lookup_key(mut self, lookup_key: impl LookupKey) -> Self {
        self.lookup_key = Some(Box::new(lookup_key));
        self
    }

    /// How long a found plan is cached. Default: 60 seconds.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long an unknown subject is cached. Default: 10 seconds.
    pub fn unknown_ttl(mut self, ttl: Duration) -> Self {
        self.unknown_ttl = ttl;
        self
    }

    /// How long a failed lookup is remembered; zero asks again at the next
    /// request. Default: 1 second.
    pub fn error_ttl(mut self, ttl: Duration) -> Self {
        self.error_ttl = ttl;
        self
    }

    /// Bounds each lookup; a slower one is a failure. Default: 200 ms.
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

    /// How many subjects are held at most, lookups in flight included
    /// (at least one per shard, 16). Default: 100 000.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// How many lookups run at once at most (at least 1). A request of an
    /// uncached subject beyond it is checked under the default policies,
    /// without a lookup. Default: 64.
    pub fn max_lookups(mut self, max_lookups: usize) -> Self {
        self.max_lookups = max_lookups;
        self
    }

    /// The resolver.
    pub fn build(self) -> PlanResolver {
        #[cfg(feature = "metrics")]
        crate::observe::describe_metrics();
        PlanResolver {
            inner: Arc::new(ResolverInner {
                lookup: self.lookup,
                lookup_key: self.lookup_key,
                ttl: self.ttl,
                unknown_ttl: self.unknown_ttl,
                error_ttl: self.error_ttl,
                timeout: self.timeout,
                on_failure: self.on_failure,
                per_shard: (self.capacity / SHARDS).max(1),
                max_lookups: self.max_lookups.max(1),
                in_flight: AtomicUsize::new(0),
                next_lookup: AtomicU64::new(1),
                shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
                hasher: FixedState::default(),
                failures: crate::breaker::UndecidedLog::new(),
                skipped: crate::breaker::UndecidedLog::new(),
            }),
        }
    }
}
