//! The builder's setters for what a request is checked against and by
//! which key: default policies, static tiers and how one is chosen, live
//! [`Limits`], a [`PlanResolver`], the key extractor, and what happens to
//! a request without a key.

use portcullis_core::{Limits, Policy, Store};

use super::RateLimitLayerBuilder;
use crate::config::MissingKey;
use crate::key::{KeyExtractor, RequestHead};
use crate::rate_limit::resolve::PlanResolver;

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

    /// Sets how requests are keyed (default [`PeerIp`](crate::PeerIp)).
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
    ///     .tier_by(|request| match request.extensions().get::<Plan>()? {
    ///         Plan::Pro => Some("pro"),
    ///         Plan::Free => None,
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn tier_by<F>(mut self, select: F) -> Self
    where
        F: for<'a> Fn(&'a RequestHead<'a>) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.settings.select_tier = Some(Box::new(move |request, _key| select(request)));
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
    /// // Also add: cargo add tower --features util
    /// use std::convert::Infallible;
    /// use axum::http::{Request, Response, StatusCode};
    /// use portcullis::{LimitSet, Limits, MemoryStore, Policy};
    /// use portcullis::tower::{Header, RateLimitLayer};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limits = Limits::new(LimitSet::of([Policy::per_minute(2).name("minute").build()?])?);
    /// let layer = RateLimitLayer::builder(MemoryStore::new())
    ///     .key(Header::new(axum::http::HeaderName::from_static("x-customer")))
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

    /// Chooses the tier for each request from its head and its key, as
    /// [`tier_by`](Self::tier_by) does from its head alone. A synchronous,
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
    ///     .resolve_tier(|request, _key| request.extensions().get::<Staff>().map(|_| "internal"))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn resolve_tier<F>(mut self, select: F) -> Self
    where
        F: for<'a> Fn(&'a RequestHead<'a>, &'a str) -> Option<&'a str> + Send + Sync + 'static,
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

    /// Sets what happens to requests without a key (default: reject with
    /// `400 Bad Request`).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.settings.missing_key = Some(missing_key);
        self
    }
}
