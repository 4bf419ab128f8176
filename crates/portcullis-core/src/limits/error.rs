//! Why a set of limits was refused ([`LimitsError`]).

use std::error::Error;
use std::fmt;

use crate::StoreError;

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
