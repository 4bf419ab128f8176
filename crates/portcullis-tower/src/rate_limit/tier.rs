//! [`Tier`]: what a request is checked against, compiled once when the
//! layer is built or its limits change: the policies, where they came
//! from, the header values precomputed from them, and the facts about them
//! a check reads rather than derives (whether any has priority classes).
//! The layer builds tiers; the checker, charging and live limits read them.

use std::sync::Arc;

use http::HeaderValue;
use portcullis_core::{validate_check, Algorithm, LeakyMode, Policy, PolicySource};

use crate::config::ConfigError;
use crate::headers::{policy_value, ratelimit_prefixes};
use crate::observe::PolicyLabels;

/// A named set of policies checked together.
#[derive(Debug)]
pub(crate) struct Tier {
    pub(crate) name: Arc<str>,
    pub(crate) policies: Arc<[Policy]>,
    /// What chose these policies, and the version of the limits they came
    /// from (0 for a static tier).
    pub(crate) source: PolicySource,
    pub(crate) version: u64,
    /// The deny cache's shards (the static tier's index; 0 for live
    /// tiers) and this tier's identity there (unique per tier object, so
    /// a change of limits leaves no denial behind).
    pub(crate) slot: usize,
    pub(crate) id: u64,
    /// The precomputed `RateLimit-Policy` value.
    pub(crate) policy_header: Option<HeaderValue>,
    /// The precomputed start of each policy's `RateLimit` item.
    pub(crate) ratelimit_prefixes: Box<[Box<str>]>,
    /// Whether a policy defines priority classes: a request is then
    /// checked with its class, or the default class, never as a plain
    /// check that would skip the reserves.
    pub(crate) classed: bool,
    /// Whether an admission may carry a delay (a leaky bucket queue): its
    /// figures are then always read, never skipped.
    pub(crate) may_delay: bool,
    /// The metrics' `policy` labels.
    pub(crate) labels: PolicyLabels,
}

impl Tier {
    pub(crate) fn new(name: &str, policies: Vec<Policy>) -> Result<Self, ConfigError> {
        if policies.is_empty() {
            return Err(if name == portcullis_core::DEFAULT_TIER {
                ConfigError::NoPolicies
            } else {
                ConfigError::EmptyTier {
                    tier: name.to_owned(),
                }
            });
        }
        validate_check(&policies, 1).map_err(|source| ConfigError::InvalidPolicies {
            tier: name.to_owned(),
            source,
        })?;
        Ok(Self::from_valid(name, policies))
    }

    /// A tier of policies already known to be valid together (non-empty,
    /// names distinct).
    pub(crate) fn from_valid(name: &str, policies: Vec<Policy>) -> Self {
        let source = if name == portcullis_core::DEFAULT_TIER {
            PolicySource::Default
        } else {
            PolicySource::Tier
        };
        Self::from_valid_live(name, policies, source, 0)
    }

    /// A tier of live limits, or of a resolver's plan, validated.
    pub(crate) fn new_live(
        name: &str,
        policies: Vec<Policy>,
        source: PolicySource,
        version: u64,
    ) -> Result<Self, ConfigError> {
        let mut tier = Self::new(name, policies)?;
        tier.source = source;
        tier.version = version;
        Ok(tier)
    }

    /// A tier of live limits, of policies known to be valid together.
    pub(crate) fn from_valid_live(
        name: &str,
        policies: Vec<Policy>,
        source: PolicySource,
        version: u64,
    ) -> Self {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            source,
            version,
            slot: 0,
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            name: name.into(),
            classed: policies.iter().any(Policy::has_classes),
            may_delay: policies
                .iter()
                .any(|policy| policy.algorithm() == Algorithm::LeakyBucket(LeakyMode::Queue)),
            policy_header: policy_value(&policies),
            ratelimit_prefixes: ratelimit_prefixes(&policies),
            labels: PolicyLabels::of(&policies),
            policies: policies.into(),
        }
    }
}
