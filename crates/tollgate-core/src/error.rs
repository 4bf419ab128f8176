//! Errors a store returns.

use std::error::Error;
use std::fmt;
use std::time::Duration;

type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Why a store could not decide. Every message says what to do.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The cost is above what the named policy can ever admit.
    CostTooHigh {
        /// The policy's name.
        policy: String,
        /// The cost asked for.
        cost: u64,
        /// The policy's capacity.
        capacity: u64,
    },
    /// No policy was given.
    NoPolicies,
    /// Two policies in one check have the same name (they would share state).
    DuplicatePolicy {
        /// The repeated name.
        name: String,
    },
    /// The store holds as many keys as it was allowed to and none could be
    /// freed.
    Full {
        /// The configured cap.
        max_keys: usize,
    },
    /// The backend did not answer within the configured time. The check may
    /// or may not have been applied; it is not retried.
    Timeout {
        /// The configured bound.
        after: Duration,
    },
    /// The backend failed before the check could be applied (for example no
    /// connection could be made); nothing was charged.
    Unavailable {
        /// The underlying error.
        source: BoxError,
    },
    /// The backend failed after the check may have been applied (for example
    /// the connection dropped mid-call). It is not retried, so nothing is
    /// charged twice.
    OutcomeUnknown {
        /// The underlying error.
        source: BoxError,
    },
    /// The backend answered with something this version does not understand.
    Protocol {
        /// What was wrong.
        detail: String,
    },
}

impl StoreError {
    /// Wraps a backend error that happened before anything was sent.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            source: source.into(),
        }
    }

    /// Wraps a backend error after which the outcome is unknown.
    pub fn outcome_unknown(source: impl Into<BoxError>) -> Self {
        Self::OutcomeUnknown {
            source: source.into(),
        }
    }

    /// Whether the error comes from the backend (unreachable, slow, broken)
    /// rather than from the request. Failure policies (fail-open,
    /// fail-closed, fallback) apply to these; request errors do not.
    #[must_use]
    pub fn is_backend(&self) -> bool {
        matches!(
            self,
            Self::Full { .. }
                | Self::Timeout { .. }
                | Self::Unavailable { .. }
                | Self::OutcomeUnknown { .. }
                | Self::Protocol { .. }
        )
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CostTooHigh { policy, cost, capacity } => write!(f, "cost {cost} is above the capacity {capacity} of policy {policy:?}: no amount of waiting admits it; split the request or raise the policy's burst"),
            Self::NoPolicies => f.write_str("no policy was given: pass at least one policy to check"),
            Self::DuplicatePolicy { name } => write!(f, "two policies are named {name:?}: give each policy of a check its own name with .name(..)"),
            Self::Full { max_keys } => write!(f, "the memory store holds its maximum of {max_keys} keys and none is idle: raise max_keys or let keys expire"),
            Self::Timeout { after } => write!(f, "the store did not answer within {after:?}; the check was not retried (it may have been applied): check the backend's health or raise the timeout"),
            Self::Unavailable { source } => write!(f, "the store is unavailable ({source}); nothing was charged: check that the backend is running and reachable"),
            Self::OutcomeUnknown { source } => write!(f, "the store failed mid-call ({source}); the check may have been applied and was not retried"),
            Self::Protocol { detail } => write!(f, "the store sent an unexpected reply: {detail}; check that the backend and tollgate versions match"),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Unavailable { source } | Self::OutcomeUnknown { source } => Some(&**source),
            _ => None,
        }
    }
}
