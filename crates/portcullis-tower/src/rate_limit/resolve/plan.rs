//! What a plan lookup answers and is given: [`Plan`], [`LookupKey`] (with
//! its impls for the credential extractors), [`ResolverFailure`], the
//! lookup function's types; and the internal forms of an answer: `Cached`
//! (what the cache holds), `Picked` (the tier a request gets) and `Lookup`
//! (an answer to wait for).

use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use portcullis_core::Policy;

use crate::key::{ApiKey, BearerToken, RequestHead};
use crate::rate_limit::tier::Tier;

pub(super) type BoxError = Box<dyn Error + Send + Sync + 'static>;
pub(super) type LookupFuture = Pin<Box<dyn Future<Output = Result<Option<Plan>, BoxError>> + Send>>;
pub(super) type LookupFn = dyn Fn(String) -> LookupFuture + Send + Sync;

/// What a [`PlanResolver`](crate::PlanResolver) found for a subject: which policies apply.
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
    /// The policies of this tier of the layer's [`Limits`](portcullis_core::Limits)
    /// (the defaults if it has no such tier: warned once per tier, and
    /// with feature `metrics` counted per request in
    /// `portcullis_resolver_missing_tier_total`). Changes to the tier apply
    /// at once.
    Tier(String),
    /// Policies of the subject's own, such as a quota a customer bought.
    /// Checked together, so their names must differ.
    Policies(Vec<Policy>),
}

/// What the layer does when a [`PlanResolver`](crate::PlanResolver) lookup fails or times out.
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

/// What a [`PlanResolver`](crate::PlanResolver)'s lookup is given for a request, when the
/// layer's key is not what the plans are looked up by
/// ([`PlanResolverBuilder::lookup_key`](crate::PlanResolverBuilder::lookup_key)).
///
/// [`ApiKey`] and [`BearerToken`] give the credential itself (the layer's
/// key is its SHA-256, which a database cannot be searched by); a closure
/// `Fn(&RequestHead, &str) -> Option<String>` is given the request's head and the
/// layer's key. `None` means the request has nothing to look up: the
/// defaults apply.
///
/// The plan is cached by the layer's key, so the lookup key must be a
/// function of what the layer keys on (the same credential, say), not of
/// other parts of the request.
///
/// ```
/// use portcullis::tower::{LookupKey, RequestHead};
///
/// // The customer id a trusted gateway puts beside the hashed API key.
/// fn customer(request: &RequestHead, _key: &str) -> Option<String> {
///     request.headers().get("x-customer")?.to_str().ok().map(str::to_owned)
/// }
/// fn takes(_: impl LookupKey) {}
/// takes(customer);
/// ```
pub trait LookupKey: Send + Sync + 'static {
    /// The key the lookup is given for this request (`key` is the layer's
    /// key for it), or `None` for the defaults.
    fn lookup_key(&self, request: &RequestHead<'_>, key: &str) -> Option<String>;
}

impl<F> LookupKey for F
where
    F: Fn(&RequestHead<'_>, &str) -> Option<String> + Send + Sync + 'static,
{
    fn lookup_key(&self, request: &RequestHead<'_>, key: &str) -> Option<String> {
        self(request, key)
    }
}

/// The API key itself (trimmed; none unless it is UTF-8).
impl LookupKey for ApiKey {
    fn lookup_key(&self, request: &RequestHead<'_>, _key: &str) -> Option<String> {
        let raw = self.credential(request)?;
        std::str::from_utf8(raw).ok().map(str::to_owned)
    }
}

/// The bearer token itself (none unless it is UTF-8).
impl LookupKey for BearerToken {
    fn lookup_key(&self, request: &RequestHead<'_>, _key: &str) -> Option<String> {
        let raw = self.token(request)?;
        std::str::from_utf8(raw).ok().map(str::to_owned)
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

impl Cached {
    /// Unknown and failed subjects: evicted first.
    pub(super) fn is_negative(&self) -> bool {
        matches!(self, Self::Defaults | Self::Failed)
    }
}

/// A lookup to wait for: its answer, once in.
pub(crate) type Lookup = Pin<Box<dyn Future<Output = Cached> + Send>>;

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
