//! Limits as data: the default policies, named tiers and per-subject
//! overrides in one value ([`LimitSet`]), held by a live handle
//! ([`Limits`]) that swaps them atomically at run time.

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::{validate_check, Policy, StoreError};

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
    /// A per-subject override of the [`LimitSet`].
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

/// A per-subject override: a tier of the set, or policies of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Override {
    /// The subject gets this tier's policies.
    Tier(Arc<str>),
    /// The subject gets these policies (a quota of its own).
    Policies(Arc<[Policy]>),
}

/// The policies chosen for one subject, and what chose them
/// ([`LimitSet::select`]).
#[derive(Debug, Clone, Copy)]
pub struct Selected<'a> {
    name: &'a str,
    policies: &'a Arc<[Policy]>,
    source: PolicySource,
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

/// One consistent set of limits: the default policies, named tiers, and
/// per-subject overrides. Validated when built; never changed afterwards (a
/// [`Limits`] handle swaps whole sets, so nobody sees half of one).
///
/// ```
/// use portcullis::{LimitSet, Policy};
///
/// let set = LimitSet::builder()
///     .policy(Policy::per_minute(100).name("free-minute").build()?)
///     .tier("pro", [Policy::per_minute(5_000).name("pro-minute").build()?])
///     .override_tier("customer-7", "pro")
///     .override_policies("customer-9", [Policy::per_minute(20_000).name("c9-minute").build()?])
///     .build()?;
/// assert_eq!(set.select("customer-7", None).policies()[0].name(), "pro-minute");
/// assert_eq!(set.select("customer-9", None).policies()[0].limit(), 20_000);
/// assert_eq!(set.select("someone", None).policies()[0].name(), "free-minute");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct LimitSet {
    version: u64,
    defaults: Arc<[Policy]>,
    /// In the order they were defined.
    tiers: Vec<(Arc<str>, Arc<[Policy]>)>,
    tier_index: HashMap<Arc<str>, usize>,
    overrides: HashMap<Arc<str>, Override>,
}

impl fmt::Debug for LimitSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitSet")
            .field("version", &self.version)
            .field("defaults", &self.defaults)
            .field("tiers", &self.tiers)
            .field("overrides", &self.overrides.len())
            .finish()
    }
}

impl PartialEq for LimitSet {
    /// Equal limits (the version is not compared).
    fn eq(&self, other: &Self) -> bool {
        self.defaults == other.defaults
            && self.tiers == other.tiers
            && self.overrides == other.overrides
    }
}

impl LimitSet {
    /// Starts an empty set; give it at least one default policy.
    pub fn builder() -> LimitSetBuilder {
        LimitSetBuilder::default()
    }

    /// A set of the default policies alone.
    ///
    /// # Errors
    ///
    /// As [`LimitSetBuilder::build`].
    pub fn of(policies: impl IntoIterator<Item = Policy>) -> Result<Self, LimitsError> {
        Self::builder().policies(policies).build()
    }

    /// A builder holding this set's limits, to change some and build a new
    /// set.
    pub fn to_builder(&self) -> LimitSetBuilder {
        LimitSetBuilder {
            defaults: self.defaults.to_vec(),
            tiers: self
                .tiers
                .iter()
                .map(|(name, policies)| (name.to_string(), policies.to_vec()))
                .collect(),
            overrides: self
                .overrides
                .iter()
                .map(|(subject, o)| {
                    let o = match o {
                        Override::Tier(tier) => PendingOverride::Tier(tier.to_string()),
                        Override::Policies(p) => PendingOverride::Policies(p.to_vec()),
                    };
                    (subject.to_string(), o)
                })
                .collect(),
        }
    }

    /// The version the [`Limits`] handle gave this set when it was stored
    /// (1 for the first, then one more per swap; 0 for a set never stored).
    #[must_use]
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The default policies.
    #[must_use]
    pub fn defaults(&self) -> &Arc<[Policy]> {
        &self.defaults
    }

    /// The policies of the tier `name`, if there is one.
    #[must_use]
    pub fn tier(&self, name: &str) -> Option<&Arc<[Policy]>> {
        self.tier_index.get(name).map(|&i| &self.tiers[i].1)
    }

    /// The tiers, in the order they were defined.
    pub fn tiers(&self) -> impl ExactSizeIterator<Item = (&str, &Arc<[Policy]>)> {
        self.tiers.iter().map(|(name, p)| (&**name, p))
    }

    /// The override of `subject`, if it has one.
    #[must_use]
    pub fn override_for(&self, subject: &str) -> Option<&Override> {
        self.overrides.get(subject)
    }

    /// The overrides, in no particular order.
    pub fn overrides(&self) -> impl ExactSizeIterator<Item = (&str, &Override)> {
        self.overrides.iter().map(|(s, o)| (&**s, o))
    }

    /// The policies for `subject`: its override if it has one, else the
    /// tier named `tier` if the set has it, else the defaults.
    #[must_use]
    pub fn select<'a>(&'a self, subject: &'a str, tier: Option<&str>) -> Selected<'a> {
        match self.overrides.get(subject) {
            Some(Override::Policies(policies)) => Selected {
                name: subject,
                policies,
                source: PolicySource::Override,
            },
            Some(Override::Tier(name)) => match self.tier_index.get(&**name) {
                Some(&i) => Selected {
                    name: &self.tiers[i].0,
                    policies: &self.tiers[i].1,
                    source: PolicySource::Override,
                },
                // Validated when built: an override names a tier of its set.
                None => self.defaults_selected(),
            },
            None => match tier.and_then(|t| self.tier_index.get(t)) {
                Some(&i) => Selected {
                    name: &self.tiers[i].0,
                    policies: &self.tiers[i].1,
                    source: PolicySource::Tier,
                },
                None => self.defaults_selected(),
            },
        }
    }

    fn defaults_selected(&self) -> Selected<'_> {
        Selected {
            name: DEFAULT_TIER,
            policies: &self.defaults,
            source: PolicySource::Default,
        }
    }
}

#[derive(Debug, Clone)]
enum PendingOverride {
    Tier(String),
    Policies(Vec<Policy>),
}

/// Builds a [`LimitSet`]; finish with [`LimitSetBuilder::build`], which
/// validates it.
#[derive(Debug, Clone, Default)]
#[must_use = "a LimitSetBuilder does nothing until .build() is called"]
pub struct LimitSetBuilder {
    defaults: Vec<Policy>,
    tiers: Vec<(String, Vec<Policy>)>,
    overrides: Vec<(String, PendingOverride)>,
}

impl LimitSetBuilder {
    /// Adds a default policy (several are checked together, all or
    /// nothing).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.defaults.push(policy);
        self
    }

    /// Adds default policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.defaults.extend(policies);
        self
    }

    /// Replaces the default policies.
    pub fn defaults(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.defaults = policies.into_iter().collect();
        self
    }

    /// Defines (or redefines) a tier: a named set of policies chosen per
    /// request or by an override.
    pub fn tier(
        mut self,
        name: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        let name = name.into();
        let policies = policies.into_iter().collect();
        match self.tiers.iter_mut().find(|(n, _)| *n == name) {
            Some(tier) => tier.1 = policies,
            None => self.tiers.push((name, policies)),
        }
        self
    }

    /// Removes a tier (overrides naming it must go too, or
    /// [`build`](Self::build) refuses the set).
    pub fn remove_tier(mut self, name: &str) -> Self {
        self.tiers.retain(|(n, _)| n != name);
        self
    }

    /// Gives `subject` (a key as the layer's extractor produces it, such as
    /// a customer id) the policies of tier `tier`, replacing any override it
    /// had.
    pub fn override_tier(self, subject: impl Into<String>, tier: impl Into<String>) -> Self {
        self.set_override(subject.into(), PendingOverride::Tier(tier.into()))
    }

    /// Gives `subject` policies of its own, replacing any override it had.
    pub fn override_policies(
        self,
        subject: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.set_override(
            subject.into(),
            PendingOverride::Policies(policies.into_iter().collect()),
        )
    }

    /// Removes the override of `subject`, if any.
    pub fn remove_override(mut self, subject: &str) -> Self {
        self.overrides.retain(|(s, _)| s != subject);
        self
    }

    fn set_override(mut self, subject: String, value: PendingOverride) -> Self {
        match self.overrides.iter_mut().find(|(s, _)| *s == subject) {
            Some(o) => o.1 = value,
            None => self.overrides.push((subject, value)),
        }
        self
    }

    /// Validates the set: at least one default policy, every tier and
    /// override non-empty with distinct policy names (as a store's check
    /// requires: [`validate_check`]), tier names unique and valid, every
    /// override naming a tier the set has.
    ///
    /// ```
    /// use portcullis::{LimitSet, LimitsError, Policy};
    ///
    /// let minute = Policy::per_minute(10).name("minute").build()?;
    /// let err = LimitSet::builder()
    ///     .policy(minute.clone())
    ///     .override_policies("acme", [minute.clone(), minute])
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, LimitsError::InvalidPolicies { .. }));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "the override of subject \"acme\" has two policies named \"minute\": give each policy of a set its own name"
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`LimitsError`] naming the tier or override and the policy.
    pub fn build(self) -> Result<LimitSet, LimitsError> {
        let Self {
            defaults,
            tiers,
            overrides,
        } = self;
        let defaults = validate_set(Owner::Defaults, defaults)?;
        let mut tier_list = Vec::with_capacity(tiers.len());
        let mut tier_index = HashMap::with_capacity(tiers.len());
        for (name, policies) in tiers {
            if name == DEFAULT_TIER || crate::policy::validate_name(&name).is_err() {
                return Err(LimitsError::InvalidTierName { tier: name });
            }
            let policies = validate_set(Owner::Tier(&name), policies)?;
            let name: Arc<str> = name.into();
            if tier_index
                .insert(Arc::clone(&name), tier_list.len())
                .is_some()
            {
                return Err(LimitsError::DuplicateTier {
                    tier: name.to_string(),
                });
            }
            tier_list.push((name, policies));
        }
        let mut checked = HashMap::with_capacity(overrides.len());
        for (subject, value) in overrides {
            if subject.is_empty() {
                return Err(LimitsError::EmptySubject);
            }
            let value = match value {
                PendingOverride::Tier(tier) => {
                    let Some((name, _)) = tier_index.get_key_value(tier.as_str()) else {
                        return Err(LimitsError::UnknownTier { subject, tier });
                    };
                    Override::Tier(Arc::clone(name))
                }
                PendingOverride::Policies(policies) => {
                    Override::Policies(validate_set(Owner::Override(&subject), policies)?)
                }
            };
            checked.insert(Arc::from(subject), value);
        }
        Ok(LimitSet {
            version: 0,
            defaults,
            tiers: tier_list,
            tier_index,
            overrides: checked,
        })
    }
}

#[derive(Clone, Copy)]
enum Owner<'a> {
    Defaults,
    Tier(&'a str),
    Override(&'a str),
}

impl Owner<'_> {
    fn describe(&self) -> String {
        match self {
            Self::Defaults => "the default policies".to_owned(),
            Self::Tier(name) => format!("tier {name:?}"),
            Self::Override(subject) => format!("the override of subject {subject:?}"),
        }
    }
}

/// Checks one set of policies the way every store will: non-empty, names
/// distinct.
fn validate_set(owner: Owner<'_>, policies: Vec<Policy>) -> Result<Arc<[Policy]>, LimitsError> {
    if policies.is_empty() {
        return Err(LimitsError::NoPolicies {
            of: owner.describe(),
        });
    }
    validate_check(&policies, 1).map_err(|source| {
        let policy = match &source {
            StoreError::DuplicatePolicy { name } | StoreError::CostTooHigh { policy: name, .. } => {
                name.clone()
            }
            _ => String::new(),
        };
        LimitsError::InvalidPolicies {
            of: owner.describe(),
            policy,
            source,
        }
    })?;
    Ok(policies.into())
}

/// Why a set of limits was refused. The limits in force stay as they were.
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitsError {
    /// The defaults, a tier or an override has no policy.
    NoPolicies {
        /// Which: `the default policies`, `tier "pro"`, `the override of
        /// subject "acme"`.
        of: String,
    },
    /// Two policies of one set share a name (they would share state).
    InvalidPolicies {
        /// Which set, as in [`LimitsError::NoPolicies`].
        of: String,
        /// The policy's name.
        policy: String,
        /// What a store would have refused.
        source: StoreError,
    },
    /// Two tiers have the same name.
    DuplicateTier {
        /// The name.
        tier: String,
    },
    /// A tier's name is `default` (the defaults' name) or not 1 to 64 ASCII
    /// letters, digits, `_`, `-` or `.`.
    InvalidTierName {
        /// The name given.
        tier: String,
    },
    /// An override names a tier the set does not have.
    UnknownTier {
        /// The subject overridden.
        subject: String,
        /// The tier named.
        tier: String,
    },
    /// An override was given for the empty subject.
    EmptySubject,
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPolicies { of } => write!(f, "{of} has no policy: give it at least one"),
            Self::InvalidPolicies { of, policy, source } => match source {
                StoreError::DuplicatePolicy { .. } => write!(
                    f,
                    "{of} has two policies named {policy:?}: give each policy of a set its own name"
                ),
                _ => write!(f, "{of} cannot be checked together (policy {policy:?}): fix the policies named"),
            },
            Self::DuplicateTier { tier } => {
                write!(f, "tier {tier:?} is defined twice: give each tier its own name")
            }
            Self::InvalidTierName { tier } => write!(
                f,
                "tier name {tier:?} is invalid: use 1 to 64 ASCII letters, digits, '_', '-' or '.', other than \"default\" (the default policies' name)"
            ),
            Self::UnknownTier { subject, tier } => write!(
                f,
                "the override of subject {subject:?} names tier {tier:?}, which is not defined: define the tier, or name one that is"
            ),
            Self::EmptySubject => f.write_str("an override was given for the empty subject: name the subject (a key as the layer's key extractor produces it)"),
        }
    }
}

impl Error for LimitsError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::InvalidPolicies { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A live handle on the limits in force: the current [`LimitSet`], swapped
/// atomically at run time.
///
/// Clones share one set: build every layer (on every route, in every
/// server of the process) from clones of one handle, and a
/// [`replace`](Limits::replace) or [`update`](Limits::update) is seen by
/// each of them at its next request. Reading is one atomic load of a
/// version and, when that changed, of the new set (no lock, no
/// allocation); writers are serialised among themselves. A set is swapped
/// whole: a check sees the old set or the new one, never half of each.
///
/// Changing a policy keeps state: stores read a subject's state through
/// the *current* policy (clamped to what it can produce), so lowering a
/// limit takes effect at once and raising one never forgets what was
/// used. A policy's state is keyed by its name: keep the name to keep the
/// count across a change, rename it to start afresh.
///
/// ```
/// use portcullis::{LimitSet, Limits, Policy, PolicySource};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = Limits::new(LimitSet::builder()
///     .policy(Policy::per_minute(100).name("minute").build()?)
///     .tier("pro", [Policy::per_minute(1_000).name("minute").build()?])
///     .build()?);
/// assert_eq!(limits.version(), 1);
///
/// // During an incident: lower everyone's limit, at once, everywhere.
/// let version = limits.update(|set| {
///     set.defaults([Policy::per_minute(10).name("minute").build().unwrap()])
/// })?;
/// assert_eq!(version, 2);
/// assert_eq!(limits.load().defaults()[0].limit(), 10);
///
/// // Move one customer to another tier.
/// limits.update(|set| set.override_tier("acme", "pro"))?;
/// let current = limits.load();
/// assert_eq!(current.select("acme", None).source(), PolicySource::Override);
///
/// // An invalid set is refused; the limits in force stay.
/// assert!(limits.update(|set| set.override_tier("globex", "gold")).is_err());
/// assert_eq!(limits.version(), 3);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limits {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<LimitSet>,
    /// The version of `current`, written after it.
    version: AtomicU64,
    /// Serialises writers, so versions follow the order of the swaps; holds
    /// the [`Limits::on_change`] callbacks, called under it.
    writer: Mutex<Subscribers>,
}

type OnChange = Arc<dyn Fn(&LimitSet) + Send + Sync + 'static>;

#[derive(Default)]
struct Subscribers {
    next_id: u64,
    callbacks: Vec<(u64, OnChange)>,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limits")
            .field("current", &*self.inner.current.load())
            .finish()
    }
}

impl Limits {
    /// A handle holding `set` (as version 1).
    #[must_use]
    pub fn new(mut set: LimitSet) -> Self {
        set.version = 1;
        Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(set),
                version: AtomicU64::new(1),
                writer: Mutex::new(Subscribers::default()),
            }),
        }
    }

    /// The version of the set in force: 1 for the first, one more per
    /// swap. One atomic load: cheap enough to call per request.
    #[inline]
    #[must_use]
    pub fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    /// The set in force.
    #[must_use]
    pub fn load(&self) -> Arc<LimitSet> {
        self.inner.current.load_full()
    }

    /// Swaps in `set` (already validated: a [`LimitSet`] always is) and
    /// returns its version. Requests already being checked finish with the
    /// set they started with.
    pub fn replace(&self, set: LimitSet) -> u64 {
        let writer = self.lock_writer();
        self.store(&writer, set)
    }

    /// Builds a new set from the one in force (`change` edits a builder
    /// holding it), validates it and swaps it in.
    ///
    /// # Errors
    ///
    /// The [`LimitsError`] of the new set; the set in force stays.
    pub fn update(
        &self,
        change: impl FnOnce(LimitSetBuilder) -> LimitSetBuilder,
    ) -> Result<u64, LimitsError> {
        let writer = self.lock_writer();
        let set = change(self.inner.current.load().to_builder()).build()?;
        Ok(self.store(&writer, set))
    }

    /// Swaps in the set `make` builds from the one in force, as one write
    /// (no other write comes between the read and the swap).
    #[cfg(feature = "config")]
    pub(crate) fn replace_with<E>(
        &self,
        make: impl FnOnce(&LimitSet) -> Result<LimitSet, E>,
    ) -> Result<u64, E> {
        let writer = self.lock_writer();
        let set = make(&self.inner.current.load())?;
        Ok(self.store(&writer, set))
    }

    /// Calls `callback` with the set in force now, then with every new set
    /// **before** it is in force, until the returned [`LimitsSubscription`]
    /// is dropped: for state derived from the limits (compiled headers, an
    /// index) that must be ready when a request first sees the new version,
    /// so that no request waits for it to be built. The layer built with
    /// `.limits(...)` uses this.
    ///
    /// The callback runs on the writer's thread ([`replace`](Self::replace),
    /// [`update`](Self::update), a reload), with other writes waiting: keep
    /// it short, don't panic, and don't write to this handle from it (that
    /// would wait for itself).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use portcullis::{LimitSet, Limits, Policy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limits = Limits::new(LimitSet::of([Policy::per_minute(10).name("minute").build()?])?);
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// let subscription = limits.on_change(move |set| log.lock().unwrap().push(set.version()));
    /// limits.update(|set| set.defaults([Policy::per_minute(20).name("minute").build().unwrap()]))?;
    /// drop(subscription);
    /// limits.update(|set| set.defaults([Policy::per_minute(30).name("minute").build().unwrap()]))?;
    /// assert_eq!(*seen.lock().unwrap(), [1, 2]);
    /// # Ok(()) }
    /// ```
    #[must_use = "the callback is removed when the subscription is dropped"]
    pub fn on_change(
        &self,
        callback: impl Fn(&LimitSet) + Send + Sync + 'static,
    ) -> LimitsSubscription {
        let mut writer = self.lock_writer();
        callback(&self.inner.current.load());
        writer.next_id += 1;
        let id = writer.next_id;
        writer.callbacks.push((id, Arc::new(callback)));
        LimitsSubscription {
            limits: Arc::downgrade(&self.inner),
            id,
        }
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, Subscribers> {
        self.inner
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores `set` as the next version; the caller holds the writer lock
    /// (`subscribers`). The callbacks see the set before any reader can.
    fn store(&self, subscribers: &Subscribers, mut set: LimitSet) -> u64 {
        let version = self.inner.version.load(Ordering::Relaxed) + 1;
        set.version = version;
        for (_, callback) in &subscribers.callbacks {
            callback(&set);
        }
        self.inner.current.store(Arc::new(set));
        // Readers that see this version then load a set at least as new.
        self.inner.version.store(version, Ordering::Release);
        version
    }
}

/// A callback of [`Limits::on_change`]; removes it when dropped.
#[derive(Debug)]
pub struct LimitsSubscription {
    limits: std::sync::Weak<Inner>,
    id: u64,
}

impl Drop for LimitsSubscription {
    fn drop(&mut self) {
        if let Some(inner) = self.limits.upgrade() {
            inner
                .writer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .callbacks
                .retain(|(id, _)| *id != self.id);
        }
    }
}

impl From<LimitSet> for Limits {
    fn from(set: LimitSet) -> Self {
        Self::new(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, limit: u64) -> Policy {
        Policy::per_minute(limit).name(name).build().unwrap()
    }

    #[test]
    fn select_prefers_the_override_then_the_tier() {
        let set = LimitSet::builder()
            .policy(policy("free", 10))
            .tier("pro", [policy("pro", 100)])
            .tier("team", [policy("team", 1000)])
            .override_tier("acme", "team")
            .override_policies("globex", [policy("globex", 7)])
            .build()
            .unwrap();
        let acme = set.select("acme", Some("pro"));
        assert_eq!(
            (acme.name(), acme.source()),
            ("team", PolicySource::Override)
        );
        let globex = set.select("globex", None);
        assert_eq!(globex.name(), "globex");
        assert_eq!(globex.policies()[0].limit(), 7);
        assert_eq!(set.select("bob", Some("pro")).name(), "pro");
        assert_eq!(set.select("bob", Some("gold")).name(), DEFAULT_TIER);
    }

    #[test]
    fn invalid_sets_name_what_to_fix() {
        let err = LimitSet::builder().build().unwrap_err();
        assert_eq!(
            err.to_string(),
            "the default policies has no policy: give it at least one"
        );
        let err = LimitSet::builder()
            .policy(policy("a", 1))
            .tier("pro", [policy("x", 1), policy("x", 2)])
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("tier \"pro\""), "{err}");
        assert!(err.to_string().contains("\"x\""), "{err}");
        assert!(err.source().is_some());
        let err = LimitSet::builder()
            .policy(policy("a", 1))
            .override_tier("acme", "gold")
            .build()
            .unwrap_err();
        assert!(matches!(err, LimitsError::UnknownTier { .. }), "{err}");
        let err = LimitSet::builder()
            .policy(policy("a", 1))
            .tier("default", [policy("b", 1)])
            .build()
            .unwrap_err();
        assert!(matches!(err, LimitsError::InvalidTierName { .. }), "{err}");
    }

    #[test]
    fn an_invalid_update_keeps_the_set_in_force() {
        let limits = Limits::new(LimitSet::of([policy("a", 1)]).unwrap());
        let clone = limits.clone();
        assert!(limits.update(|b| b.override_tier("acme", "nope")).is_err());
        assert_eq!(clone.version(), 1);
        assert_eq!(limits.update(|b| b.defaults([policy("a", 5)])).unwrap(), 2);
        assert_eq!(clone.version(), 2);
        assert_eq!(clone.load().defaults()[0].limit(), 5);
        assert_eq!(clone.load().version(), 2);
    }

    #[test]
    fn a_builder_round_trips() {
        let set = LimitSet::builder()
            .policy(policy("free", 10))
            .tier("pro", [policy("pro", 100)])
            .override_tier("acme", "pro")
            .override_policies("globex", [policy("globex", 7)])
            .build()
            .unwrap();
        assert_eq!(set.to_builder().build().unwrap(), set);
        let fewer = set.to_builder().remove_override("acme").build().unwrap();
        assert!(fewer.override_for("acme").is_none());
        assert!(fewer.override_for("globex").is_some());
    }
}
