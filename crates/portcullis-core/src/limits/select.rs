//! What a selection from a [`LimitSet`](crate::LimitSet) returns: the
//! policies chosen for one subject ([`Selected`]) and what chose them
//! ([`PolicySource`]). A leaf.

use std::fmt;
use std::sync::Arc;

use crate::Policy;

/// The name under which the default policies are reported (in
/// [`Selected::name`] and in errors).
pub const DEFAULT_TIER: &str = "default";

/// What chose the policies applied to a request.
///
/// ```
/// use portcullis::{LimitSet, Policy, PolicySource};
///
/// let set = LimitSet::builder()
///     .policy(Policy::per_minute(10).name("free").build()?)
///     .tier("pro", [Policy::per_minute(1_000).name("pro").build()?])
///     .override_tier("acme", "pro")
///     .build()?;
/// assert_eq!(set.select("acme", None).source(), PolicySource::Override);
/// assert_eq!(set.select("bob", Some("pro")).source(), PolicySource::Tier);
/// assert_eq!(set.select("bob", None).source(), PolicySource::Default);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PolicySource {
    /// The default policies: nothing chose otherwise.
    Default,
    /// A named tier, chosen per request (a tier selector or a resolver).
    Tier,
    /// A per-subject override of the [`LimitSet`](crate::LimitSet).
    Override,
    /// Policies a resolver returned for this subject alone (for example a
    /// customer's quota read from a database).
    Resolver,
    /// The default policies because the resolver failed or timed out.
    ResolverFailed,
}

impl PolicySource {
    /// A short, stable name: `default`, `tier`, `override`, `resolver`,
    /// `resolver_failed`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Tier => "tier",
            Self::Override => "override",
            Self::Resolver => "resolver",
            Self::ResolverFailed => "resolver_failed",
        }
    }
}

impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The policies chosen for one subject, and what chose them
/// ([`LimitSet::select`](crate::LimitSet::select)).
#[derive(Debug, Clone, Copy)]
pub struct Selected<'a> {
    pub(super) name: &'a str,
    pub(super) policies: &'a Arc<[Policy]>,
    pub(super) source: PolicySource,
}

impl<'a> Selected<'a> {
    /// The tier's name (`default` for the defaults), or for an override of
    /// its own policies the subject.
    #[must_use]
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The policies, checked together.
    #[must_use]
    pub fn policies(&self) -> &'a Arc<[Policy]> {
        self.policies
    }

    /// What chose them.
    #[must_use]
    pub fn source(&self) -> PolicySource {
        self.source
    }
}
