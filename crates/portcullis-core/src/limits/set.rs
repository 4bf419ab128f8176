//! One consistent set of limits ([`LimitSet`]: the default policies,
//! named tiers and per-subject overrides), how a subject's policies are
//! selected from it ([`LimitSet::select`]), and its builder
//! ([`LimitSetBuilder`]), which validates every policy set the way every
//! store will.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::error::LimitsError;
use super::select::{PolicySource, Selected, DEFAULT_TIER};
use crate::{validate_check, Policy, StoreError};

/// A per-subject override: a tier of the set, or policies of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Override {
    /// The subject gets this tier's policies.
    Tier(Arc<str>),
    /// The subject gets these policies (a quota of its own).
    Policies(Arc<[Policy]>),
}

/// One consistent set of limits: the default policies, named tiers, and
/// per-subject overrides. Validated when built; never changed afterwards (a
/// [`Limits`](crate::Limits) handle swaps whole sets, so nobody sees half of one).
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
    pub(super) version: u64,
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

    /// The version the [`Limits`](crate::Limits) handle gave this set when it was stored
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
