//! `RateLimitLayer` and its builder, which compiles the [`Tier`]s
//! (`tier.rs`) a request is checked against. The state its services share
//! is the [`Checker`] in `checker.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use portcullis_core::{validate_charge, LimitSet, Limits, Policy, Store, StoreError};
use tower_layer::Layer;

use super::charge::ChargeFn;
use super::checker::{Checker, CostFn, TierFn};
use super::deny_cache::DenyCache;
use super::resolve::{Live, PlanResolver};
use super::tier::Tier;
use crate::breaker::{Breaker, UndecidedLog};
use crate::config::{ConfigError, FailurePolicy, HeaderMode, MissingKey, Mode};
use crate::key::{KeyExtractor, PeerIp};
use crate::response::LimitedBody;
use crate::{KeepBodyLayer, RateLimit, RateLimitInfo};

/// Default bound on one store check: 500 ms, above a `RedisStore`'s own
/// per-call default (250 ms), so that the store's own timeout answers
/// first. Measured on a 2-core box with four busy threads and 1024 checks
/// in flight through this layer over Redis, the slowest check took 164 ms:
/// a healthy store on a loaded machine does not fail open.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_millis(500);
/// Default number of consecutive store failures that open the circuit breaker.
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 5;
/// Default pause of an open circuit breaker.
pub const DEFAULT_BREAKER_PAUSE: Duration = Duration::from_secs(1);
/// Default capacity of the local deny cache (subjects).
pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 65_536;

/// Applies rate limiting to requests: a tower `Layer` producing
/// [`RateLimit`] services.
///
/// Build one with [`RateLimitLayer::new`] (one policy, keyed by peer IP) or
/// [`RateLimitLayer::builder`]. Clones share one configuration and one store,
/// so a layer applied to several routes, or cloned into several servers,
/// enforces one limit.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::{routing::get, Router};
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{ClientIp, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_second(10).burst(20).name("burst").build()?)
///     .policy(Policy::per_day(10_000).name("daily").build()?)
///     .key(ClientIp::trusting(["10.0.0.0/8".parse()?]))
///     .build()?;
///
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
/// # Ok(()) }
/// ```
pub struct RateLimitLayer<St, K = PeerIp> {
    checker: Arc<Checker<St, K>>,
}

impl<St, K> Clone for RateLimitLayer<St, K> {
    fn clone(&self) -> Self {
        Self {
            checker: Arc::clone(&self.checker),
        }
    }
}

impl<St, K> fmt::Debug for RateLimitLayer<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.checker.fmt(f)
    }
}

impl<S, St, K> Layer<S> for RateLimitLayer<St, K> {
    type Service = RateLimit<S, St, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.checker))
    }
}

impl<St: Store> RateLimitLayer<St, PeerIp> {
    /// Limits every peer IP address to `policy`, with all other settings at
    /// their defaults. The peer address must be in the request extensions:
    /// serve Axum with `into_make_service_with_connect_info::<SocketAddr>()`
    /// (without it every request is answered `400`; see [`PeerIp`]).
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Policy::per_second(5).build().unwrap());
    /// # let _ = layer;
    /// ```
    pub fn new(store: St, policy: Policy) -> Self {
        // One policy is always a valid tier.
        Self::builder(store).into_layer(vec![Tier::from_valid(
            portcullis_core::DEFAULT_TIER,
            vec![policy],
        )])
    }

    /// Starts configuring a layer over `store`, keyed by peer IP until
    /// [`RateLimitLayerBuilder::key`] says otherwise.
    pub fn builder(store: St) -> RateLimitLayerBuilder<St, PeerIp> {
        Self::builder_shared(Arc::new(store))
    }

    /// Like [`RateLimitLayer::builder`] with a store shared with other code
    /// (for example another layer, or an admin endpoint that resets keys).
    pub fn builder_shared(store: Arc<St>) -> RateLimitLayerBuilder<St, PeerIp> {
        RateLimitLayerBuilder {
            store,
            key: PeerIp::new(),
            settings: Settings {
                policies: Vec::new(),
                tiers: Vec::new(),
                select_tier: None,
                cost: None,
                mode: Mode::default(),
                failure: FailurePolicy::default(),
                timeout: DEFAULT_CHECK_TIMEOUT,
                breaker: (DEFAULT_BREAKER_THRESHOLD, DEFAULT_BREAKER_PAUSE),
                deny_cache: Some(DEFAULT_DENY_CACHE_CAPACITY),
                missing_key: None,
                header_mode: HeaderMode::default(),
                legacy_headers: false,
                info_in_extensions: false,
                body: LimitedBody::default(),
                no_room_status: StatusCode::TOO_MANY_REQUESTS,
                charge: None,
                limits: None,
                plans: None,
                options: super::options::OptionSources::default(),
            },
        }
    }
}

impl<St: Store, K> RateLimitLayer<St, K> {
    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<St> {
        &self.checker.store
    }

    /// This layer with responses in the inner service's own body type
    /// (`From<Bytes>`, as Axum's `Body` is) instead of
    /// [`ResponseBody`](crate::rate_limit::ResponseBody), so
    /// Axum does not box a wrapper body per response: see
    /// [`KeepBodyLayer`]. Clones of the layer still share its store,
    /// configuration and deny cache.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Policy::per_second(5).build().unwrap());
    /// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer.keep_body());
    /// # let _ = app;
    /// ```
    pub fn keep_body(self) -> KeepBodyLayer<Self> {
        KeepBodyLayer::new(self)
    }

    /// The default policies (with [`RateLimitLayerBuilder::limits`]: those
    /// in force when the layer was built; the handle has the current ones).
    #[must_use]
    pub fn policies(&self) -> &[Policy] {
        &self.checker.tiers[0].policies
    }

    /// Forgets the state of `key` (a key as the extractor produces it, for
    /// example `"203.0.113.7"`) under every tier's policies, in the store
    /// and in this layer's deny cache. Other instances' deny caches keep
    /// their entries until those expire.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        if let Some(cache) = &self.checker.deny_cache {
            cache.remove(key);
        }
        let tiers = match &self.checker.live {
            Some(live) => live.sets_for(key),
            None => self.checker.tiers.to_vec(),
        };
        for tier in tiers {
            self.checker.store.reset(key, &tier.policies).await?;
        }
        if let Some(cache) = &self.checker.deny_cache {
            cache.remove(key);
        }
        Ok(())
    }
}

/// Configures a [`RateLimitLayer`]; finish with
/// [`RateLimitLayerBuilder::build`].
///
/// ```
/// use std::time::Duration;
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{ApiKey, PeerIp, KeyExtractor, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_second(5).name("burst").build()?)
///     .policy(Policy::per_hour(1_000).name("hourly").build()?)
///     .key(ApiKey::new().or(PeerIp::new()))
///     .cost(|parts| if parts.method == http::Method::POST { 2 } else { 1 })
///     .shape(Duration::from_millis(200))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[must_use = "a builder does nothing until .build() is called"]
pub struct RateLimitLayerBuilder<St, K> {
    store: Arc<St>,
    key: K,
    settings: Settings,
}

/// The settings of a [`RateLimitLayerBuilder`] that do not depend on its
/// store or key type, so that [`RateLimitLayerBuilder::key`] moves them as
/// one value.
struct Settings {
    policies: Vec<Policy>,
    tiers: Vec<(String, Vec<Policy>)>,
    select_tier: Option<TierFn>,
    cost: Option<CostFn>,
    mode: Mode,
    failure: FailurePolicy,
    timeout: Duration,
    breaker: (u32, Duration),
    deny_cache: Option<usize>,
    /// `None`: a 400 naming what the key extractor reads.
    missing_key: Option<MissingKey>,
    header_mode: HeaderMode,
    legacy_headers: bool,
    info_in_extensions: bool,
    body: LimitedBody,
    no_room_status: StatusCode,
    charge: Option<ChargeFn>,
    limits: Option<Limits>,
    plans: Option<PlanResolver>,
    /// Idempotency keys and priority classes (`options.rs`).
    options: super::options::OptionSources,
}

impl<St, K> fmt::Debug for RateLimitLayerBuilder<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("policies", &self.settings.policies)
            .field("tiers", &self.settings.tiers)
            .field("mode", &self.settings.mode)
            .field("failure", &self.settings.failure)
            .field("timeout", &self.settings.timeout)
            .finish_non_exhaustive()
    }
}

impl<St, K> RateLimitLayerBuilder<St, K> {
    /// The idempotency and priority settings (`options.rs`).
    pub(super) fn options_mut(&mut self) -> &mut super::options::OptionSources {
        &mut self.settings.options
    }
}

impl<St: Store, K: KeyExtractor> RateLimitLayerBuilder<St, K> {
    /// Adds a default policy. Several policies (say 10 per second and 1000
    /// per day) are checked together in one atomic step: a request is
    /// admitted only if all admit, and a denial charges none.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.settings.policies.push(policy);
        self
    }

    /// Adds several default policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.settings.policies.extend(policies);
        self
    }

    /// Sets how requests are keyed (default [`PeerIp`]).
    pub fn key<K2: KeyExtractor>(self, key: K2) -> RateLimitLayerBuilder<St, K2> {
        RateLimitLayerBuilder {
            store: self.store,
            key,
            settings: self.settings,
        }
    }

    /// Defines a tier: a named set of policies that
    /// [`RateLimitLayerBuilder::tier_by`] can choose per request instead of
    /// the default policies. Tiers keep separate state (give their policies
    /// distinct names if they share a store with other layers).
    pub fn tier(
        mut self,
        name: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.settings
            .tiers
            .push((name.into(), policies.into_iter().collect()));
        self
    }

    /// Chooses the tier for each request, for example from a plan an
    /// authentication layer put in the extensions. `None`, or a name no
    /// tier has, means the default policies.
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::{RateLimitLayer, User};
    ///
    /// #[derive(Clone)]
    /// enum Plan { Free, Pro }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .key(User::<String>::new())
    ///     .policy(Policy::per_minute(10).name("free-minute").build()?)
    ///     .tier("pro", [Policy::per_minute(1000).name("pro-minute").build()?])
    ///     .tier_by(|parts| match parts.extensions.get::<Plan>()? {
    ///         Plan::Pro => Some("pro"),
    ///         Plan::Free => None,
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn tier_by<F>(mut self, select: F) -> Self
    where
        F: for<'a> Fn(&'a Parts) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.settings.select_tier = Some(Box::new(move |parts, _key| select(parts)));
        self
    }

    /// Takes the policies from a live [`Limits`] handle instead of
    /// [`policy`](Self::policy) and [`tier`](Self::tier): its defaults, its
    /// tiers (chosen per request by [`tier_by`](Self::tier_by),
    /// [`resolve_tier`](Self::resolve_tier) or
    /// [`resolve_plan`](Self::resolve_plan)) and its per-subject overrides
    /// (by the request's key, before anything else). A change of the
    /// handle ([`Limits::update`], [`Limits::replace`], a reloaded
    /// `LimitsFile`) applies from each layer's next request; requests
    /// being checked finish under the set they started with. The
    /// `RateLimit-Policy` values and metric labels are computed once per
    /// change, not per request; [`RateLimitInfo`](crate::RateLimitInfo)
    /// says which tier or override chose the policies
    /// ([`RateLimitInfo::source`](crate::RateLimitInfo::source)).
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response, StatusCode};
    /// use portcullis::{LimitSet, Limits, MemoryStore, Policy};
    /// use portcullis::tower::{Header, RateLimitLayer};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limits = Limits::new(LimitSet::of([Policy::per_minute(2).name("minute").build()?])?);
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .key(Header::new(http::HeaderName::from_static("x-customer")))
    ///     .limits(limits.clone())
    ///     .build()?;
    /// let service = layer.layer(service_fn(|_req: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(String::new()))
    /// }));
    /// let request = || Request::get("/").header("x-customer", "acme").body(()).unwrap();
    /// service.clone().oneshot(request()).await?;
    /// service.clone().oneshot(request()).await?;
    /// assert_eq!(service.clone().oneshot(request()).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    ///
    /// // acme bought a quota of its own: its next request is checked under it
    /// // (a new policy name starts afresh; the same name would read the old state
    /// // at the new rate: README, "Limits from configuration or a database").
    /// limits.update(|set| set.override_policies("acme", [Policy::per_minute(100).name("acme-minute").build().unwrap()]))?;
    /// let response = service.oneshot(request()).await?;
    /// assert_eq!(response.status(), StatusCode::OK);
    /// assert_eq!(response.headers()["ratelimit-policy"], "\"acme-minute\";q=100;w=60");
    /// # Ok(()) }
    /// ```
    pub fn limits(mut self, limits: Limits) -> Self {
        self.settings.limits = Some(limits);
        self
    }

    /// Chooses the tier for each request from its parts and its key, as
    /// [`tier_by`](Self::tier_by) does from its parts alone. A synchronous,
    /// cheap choice (an extension, the route, a prefix of the key); for
    /// data that must be fetched, see [`resolve_plan`](Self::resolve_plan).
    ///
    /// **A tier is a privilege: choose it from what the application
    /// trusts**, such as an extension your authentication layer inserts,
    /// never from a header the client sets (anyone can send
    /// `x-internal: 1`). A request the selector names no tier for gets the
    /// default policies.
    ///
    /// ```
    /// use portcullis::{LimitSet, Limits, MemoryStore, Policy};
    /// use portcullis::tower::{ApiKey, RateLimitLayer};
    ///
    /// /// Inserted by your authentication layer for staff credentials.
    /// #[derive(Clone)]
    /// struct Staff;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limits = Limits::new(LimitSet::builder()
    ///     .policy(Policy::per_minute(60).name("minute").build()?)
    ///     .tier("internal", [Policy::per_minute(6_000).name("minute").build()?])
    ///     .build()?);
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .key(ApiKey::new())
    ///     .limits(limits)
    ///     .resolve_tier(|parts, _key| parts.extensions.get::<Staff>().map(|_| "internal"))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn resolve_tier<F>(mut self, select: F) -> Self
    where
        F: for<'a> Fn(&'a Parts, &'a str) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.settings.select_tier = Some(Box::new(select));
        self
    }

    /// Looks up each subject's plan with `resolver` (a database, a Redis
    /// hash, a billing API), behind its bounded cache with single-flight:
    /// see [`PlanResolver`]. A subject's override in the
    /// [`limits`](Self::limits) wins over its plan; a plan naming a tier
    /// gets that tier of the limits (of the static
    /// [`tier`](Self::tier)s without a handle).
    pub fn resolve_plan(mut self, resolver: PlanResolver) -> Self {
        self.settings.plans = Some(resolver);
        self
    }

    /// Sets the cost (permits) of each request (default 1), for example by
    /// the size of a batch. A cost of 0 passes without a check. A cost above
    /// a policy's capacity can never be admitted and is answered with `429`
    /// without `Retry-After`.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.settings.cost = Some(Box::new(cost));
        self
    }

    /// Charges each request **after its response**, by the cost `cost`
    /// computes from the response head (a header such as `x-tokens-used`,
    /// or the status: `1` for a failed login, `0` for a successful one),
    /// instead of a cost known before the request runs.
    ///
    /// Before the inner service is called, the layer only *peeks*: a
    /// subject with no permit left gets the usual `429` (or gRPC
    /// `RESOURCE_EXHAUSTED`) without reaching the handler. Once the
    /// response head is ready, the layer charges the cost atomically with
    /// [`Store::charge`] — even past the limit, into a debt paid back by
    /// waiting and capped at one full capacity beyond empty, so one
    /// response locks a subject out for at most the policy's full reset
    /// plus one emission interval (ALGORITHMS.md, "Charging after the
    /// response") — and waits for the charge before returning the response,
    /// so the subject's next request sees it. A handler can change the
    /// amount through the [`Charge`](crate::Charge) handle in the request's
    /// extensions. Rate-limit headers on an admitted response describe the
    /// state after the charge (or the peek, if the charge failed).
    ///
    /// The peek and the charge are two steps: concurrent requests of one
    /// subject may all pass the peek while the first is still running, and
    /// each is then charged in full. That is what the debt is for: however
    /// many there are, the subject's lock-out stays within the bound above.
    /// To also cap how many run at once, stack a concurrency limit.
    ///
    /// The function sees the response *head*: a gRPC status, sent in the
    /// trailers, is not in it (a gRPC handler reports its cost through the
    /// [`Charge`](crate::Charge) handle instead), and the charge is made
    /// before the body is streamed.
    ///
    /// When the charge fails, the response is returned all the same and the
    /// failure logged (at `warn`); a store-wide failure counts toward the
    /// circuit breaker, and with [`FailurePolicy::Fallback`] a charge the
    /// store failed (rather than refused) goes to the fallback store.
    /// Requests let through undecided ([`FailurePolicy::FailOpen`]) and
    /// dry-run denials are not charged.
    ///
    /// Only GCRA (the default) and token-bucket policies can be charged
    /// after the fact, and the store must implement [`Store::charge`]
    /// (`MemoryStore` and `RedisStore` do): [`build`](Self::build) refuses
    /// other algorithms, and this cannot be combined with
    /// [`cost`](Self::cost).
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::net::SocketAddr;
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 10 000 tokens per minute, charged by what each response reports.
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_minute(10_000).name("tokens").build()?)
    ///     .charge_from_response(|parts| {
    ///         parts.headers.get("x-tokens-used")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(0)
    ///     })
    ///     .build()?;
    /// let service = layer.layer(service_fn(|_req: Request<()>| async {
    ///     let mut response = Response::new(Full::new(Bytes::from("…")));
    ///     response.headers_mut().insert("x-tokens-used", 6_000.into());
    ///     Ok::<_, Infallible>(response)
    /// }));
    /// let peer: SocketAddr = "192.0.2.1:4711".parse()?;
    /// let request = || Request::post("/v1/complete").extension(peer).body(()).unwrap();
    ///
    /// let first = service.clone().oneshot(request()).await?;
    /// assert_eq!(first.status(), StatusCode::OK);
    /// // The headers describe the state after the charge.
    /// assert_eq!(first.headers()["ratelimit"], "\"tokens\";r=4000;t=36");
    /// // 4 000 left: admitted, and charged 6 000 more (2 000 of debt).
    /// let second = service.clone().oneshot(request()).await?;
    /// assert_eq!(second.headers()["ratelimit"], "\"tokens\";r=0;t=13");
    /// let denied = service.oneshot(request()).await?;
    /// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(denied.headers()["retry-after"], "13"); // 2 001 tokens at 6 ms
    /// # Ok(()) }
    /// ```
    pub fn charge_from_response<F>(mut self, cost: F) -> Self
    where
        F: Fn(&http::response::Parts) -> u64 + Send + Sync + 'static,
    {
        self.settings.charge = Some(Box::new(cost));
        self
    }

    /// Sets the mode (default [`Mode::Enforce`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// Shorthand for [`Mode::DryRun`].
    pub fn dry_run(self) -> Self {
        self.mode(Mode::DryRun)
    }

    /// Shorthand for [`Mode::Shape`] with `max_wait`.
    pub fn shape(self, max_wait: Duration) -> Self {
        self.mode(Mode::Shape { max_wait })
    }

    /// Sets what happens when the store fails (default
    /// [`FailurePolicy::FailOpen`]). Only errors about the store as a whole
    /// count toward the circuit breaker; an error about one subject is
    /// answered for that request alone, and a new subject the store has no
    /// room for is denied whatever this says (see
    /// [`RateLimitLayerBuilder::no_room_status`] and the table at
    /// [`ErrorScope`](portcullis_core::ErrorScope)).
    pub fn on_store_failure(mut self, failure: FailurePolicy) -> Self {
        self.settings.failure = failure;
        self
    }

    /// Bounds each store check (default [`DEFAULT_CHECK_TIMEOUT`], 500 ms);
    /// a check that takes longer is a store failure. The same bound applies
    /// to the fallback store's check ([`FailurePolicy::Fallback`]), whose
    /// timeout lets the request through undecided. The default leaves a
    /// `RedisStore` (whose own per-call timeout defaults to 250 ms) room to
    /// answer on a loaded machine (see [`DEFAULT_CHECK_TIMEOUT`] for the
    /// measurement), so it fails open only when the store really is stuck;
    /// the circuit breaker then stops waiting on it after
    /// [`DEFAULT_BREAKER_THRESHOLD`] failures.
    pub fn check_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// After `failures` consecutive store failures, skip the store for
    /// `pause` (applying the failure policy at once), then let one request
    /// probe it. Default 5 failures and 1 second; 0 failures disables the
    /// breaker.
    pub fn circuit_breaker(mut self, failures: u32, pause: Duration) -> Self {
        self.settings.breaker = (failures, pause);
        self
    }

    /// Remembers up to `capacity` denied subjects and denies their further
    /// requests locally until their retry time, without asking the store
    /// (on by default with 65 536 subjects; `0` turns it off). This is
    /// exact: nothing but a reset can admit a denied subject sooner. A reset
    /// done through another instance is seen here only when the entry
    /// expires.
    ///
    /// Only answers that took a round trip are held: a store that answers
    /// at once ([`Store::check_now`](portcullis_core::Store::check_now), as
    /// [`MemoryStore`](portcullis_core::MemoryStore) does) is as quick as the
    /// cache, so it is asked every time.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.settings.deny_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// Sets what happens to requests without a key (default: reject with
    /// `400 Bad Request`).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.settings.missing_key = Some(missing_key);
        self
    }

    /// Sets which responses carry the `RateLimit` and `RateLimit-Policy`
    /// fields (default: all).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.settings.header_mode = mode;
        self
    }

    /// Also sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds until the quota is full again, or until
    /// retry when limited) for the binding policy.
    pub fn legacy_headers(mut self, enabled: bool) -> Self {
        self.settings.legacy_headers = enabled;
        self
    }

    /// Puts a [`RateLimitInfo`] (key, tier, policies, verdict) in the
    /// extensions of every admitted request, for handlers that show the
    /// remaining quota (off by default: it costs an allocation per request;
    /// in [`Mode::DryRun`] the info is always there).
    pub fn info_in_extensions(mut self, enabled: bool) -> Self {
        self.settings.info_in_extensions = enabled;
        self
    }

    /// The status of a request from a new subject that the store has no
    /// room for ([`ErrorScope::NoRoom`](portcullis_core::ErrorScope): a
    /// `MemoryStore` at its bound told to deny, a Redis at `maxmemory`):
    /// `429 Too Many Requests` by default, or for example
    /// `503 Service Unavailable`. Either carries the store's
    /// `Retry-After`; such a request is never let through.
    pub fn no_room_status(mut self, status: StatusCode) -> Self {
        self.settings.no_room_status = status;
        self
    }

    /// Answers limited HTTP requests with an RFC 9457
    /// `application/problem+json` document instead of plain text.
    pub fn problem_json(mut self) -> Self {
        self.settings.body = LimitedBody::ProblemJson;
        self
    }

    /// Builds the response to limited HTTP requests (not gRPC ones, which
    /// always get status 8). The layer then adds its rate-limit fields: it
    /// appends its members to `RateLimit` / `RateLimit-Policy` lists the
    /// response already has, keeps the larger `Retry-After`, and adds the
    /// legacy `X-RateLimit-*` headers unless they are there.
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .policy(Policy::per_second(5).build()?)
    ///     .on_limited(|info| {
    ///         Response::builder()
    ///             .status(StatusCode::SERVICE_UNAVAILABLE)
    ///             .body(format!("busy, come back in {}s", info.retry_after_secs().unwrap_or(1)))
    ///             .unwrap_or_default()
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn on_limited<F, B>(mut self, build: F) -> Self
    where
        F: Fn(&RateLimitInfo) -> Response<B> + Send + Sync + 'static,
        B: Into<Bytes>,
    {
        self.settings.body = LimitedBody::Custom(Arc::new(move |info| build(info).map(Into::into)));
        self
    }

    /// Validates the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`]: [`NoPolicies`](ConfigError::NoPolicies) when
    /// there is no default policy, [`EmptyTier`](ConfigError::EmptyTier) or
    /// [`DuplicateTier`](ConfigError::DuplicateTier) for a tier that is
    /// empty or defined twice, [`InvalidPolicies`](ConfigError::InvalidPolicies)
    /// when two policies of one tier share a name,
    /// [`ZeroTimeout`](ConfigError::ZeroTimeout) for a zero check timeout,
    /// [`PoliciesWithLimits`](ConfigError::PoliciesWithLimits) for policies
    /// or tiers given beside a live [`limits`](Self::limits) handle,
    /// [`IdempotencyWindow`](ConfigError::IdempotencyWindow) for an
    /// [`idempotency_key`](Self::idempotency_key) window of zero or above
    /// 30 days, and [`ChargeAfterResponse`](ConfigError::ChargeAfterResponse)
    /// when [`charge_from_response`](Self::charge_from_response) is
    /// combined with [`cost`](Self::cost) or a tier has a policy whose
    /// algorithm cannot be charged after the response (only GCRA and token
    /// bucket can).
    pub fn build(mut self) -> Result<RateLimitLayer<St, K>, ConfigError> {
        if self.settings.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        super::options::validate(&self.settings.options)?;
        if let Some(limits) = &self.settings.limits {
            if !self.settings.policies.is_empty() || !self.settings.tiers.is_empty() {
                return Err(ConfigError::PoliciesWithLimits);
            }
            // The defaults in force, for `policies()` and the checks below.
            self.settings.policies = limits.load().defaults().to_vec();
        }
        let mut tiers = vec![Tier::new(
            portcullis_core::DEFAULT_TIER,
            std::mem::take(&mut self.settings.policies),
        )?];
        for (name, policies) in std::mem::take(&mut self.settings.tiers) {
            if tiers.iter().any(|t| *t.name == *name) {
                return Err(ConfigError::DuplicateTier { tier: name });
            }
            tiers.push(Tier::new(&name, policies)?);
        }
        // A resolver without a handle: the static tiers as fixed limits.
        if self.settings.limits.is_none() && self.settings.plans.is_some() {
            let mut set = LimitSet::builder().policies(tiers[0].policies.iter().cloned());
            for tier in &tiers[1..] {
                set = set.tier(&*tier.name, tier.policies.iter().cloned());
            }
            let set = set
                .build()
                .map_err(|source| ConfigError::Limits { source })?;
            self.settings.limits = Some(Limits::new(set));
        }
        if let Some(limits) = &self.settings.limits {
            let set = limits.load();
            let sets = set
                .tiers()
                .map(|(name, policies)| (name.to_owned(), policies.clone()));
            for (name, policies) in sets.chain(set.overrides().filter_map(|(subject, o)| match o {
                portcullis_core::Override::Policies(p) => Some((subject.to_owned(), p.clone())),
                _ => None,
            })) {
                if self.settings.charge.is_some() {
                    validate_charge(&policies).map_err(|source| {
                        ConfigError::ChargeAfterResponse {
                            tier: Some(name),
                            source: Some(source),
                        }
                    })?;
                }
            }
        }
        if self.settings.charge.is_some() {
            if self.settings.cost.is_some() {
                return Err(ConfigError::ChargeAfterResponse {
                    tier: None,
                    source: None,
                });
            }
            for tier in &tiers {
                validate_charge(&tier.policies).map_err(|source| {
                    ConfigError::ChargeAfterResponse {
                        tier: Some(tier.name.to_string()),
                        source: Some(source),
                    }
                })?;
            }
        }
        Ok(self.into_layer(tiers))
    }

    /// The layer, from a validated configuration and its tiers (the default
    /// tier first); `settings.policies` and `settings.tiers` are not read.
    /// Every way of making a layer ends here, so each describes the metrics.
    fn into_layer(self, tiers: Vec<Tier>) -> RateLimitLayer<St, K> {
        #[cfg(feature = "metrics")]
        crate::observe::describe_metrics();
        let live = self
            .settings
            .limits
            .map(|limits| Live::new(limits, self.settings.plans));
        let tiers: Box<[Arc<Tier>]> = tiers
            .into_iter()
            .enumerate()
            .map(|(slot, mut tier)| {
                tier.slot = slot;
                Arc::new(tier)
            })
            .collect();
        // A held denial is one class's, or one idempotency key's: with
        // either, every check goes to the store.
        let deny_cache = self
            .settings
            .deny_cache
            .filter(|_| self.settings.options.is_empty())
            .map(|capacity| DenyCache::new(tiers.len(), capacity));
        let options = (!self.settings.options.is_empty()).then_some(self.settings.options);
        let missing_key = self.settings.missing_key.unwrap_or_else(|| {
            MissingKey::reject(
                http::StatusCode::BAD_REQUEST,
                crate::response::missing_key_message(&self.key),
            )
        });
        RateLimitLayer {
            checker: Arc::new(Checker {
                store: self.store,
                key: self.key,
                tiers,
                live,
                select_tier: self.settings.select_tier,
                cost: self.settings.cost,
                mode: self.settings.mode,
                failure: self.settings.failure,
                timeout: self.settings.timeout,
                breaker: Breaker::new(self.settings.breaker.0, self.settings.breaker.1),
                deny_cache,
                missing_key,
                header_mode: self.settings.header_mode,
                legacy_headers: self.settings.legacy_headers,
                info_in_extensions: self.settings.info_in_extensions,
                body: self.settings.body,
                undecided: UndecidedLog::new(),
                errors: UndecidedLog::new(),
                refused: UndecidedLog::new(),
                rejected: UndecidedLog::new(),
                no_room_status: self.settings.no_room_status,
                charge: self.settings.charge,
                options,
            }),
        }
    }
}
