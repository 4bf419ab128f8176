//! Errors a store returns, and how far each reaches ([`ErrorScope`]).

use std::error::Error;
use std::fmt;
use std::time::Duration;

type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Why a store could not decide. Every message says what to do.
///
/// The backend's error of [`Unavailable`](Self::Unavailable),
/// [`OutcomeUnknown`](Self::OutcomeUnknown) and [`Rejected`](Self::Rejected)
/// is the [`source()`](Error::source), not part of the `Display` text:
/// print the chain (anyhow's `{:#}`, or a loop over `source()`) to see it.
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
    /// The store holds as many subjects as it was allowed to, none could be
    /// freed, and it was told to refuse new subjects rather than evict
    /// ([`WhenFull::Deny`](crate::WhenFull::Deny)). Only a subject the store
    /// does not hold gets this; nothing was charged. Scope
    /// [`ErrorScope::NoRoom`]: the request is denied, never let through.
    Full {
        /// The configured cap.
        max_keys: usize,
        /// When the first held subject expires, so that a new one fits.
        retry_after: Duration,
    },
    /// Redis is at `maxmemory` with `noeviction` and the subject holds no
    /// state there: storing it would need memory Redis refuses. Subjects
    /// already held are still checked exactly; nothing was charged. Scope
    /// [`ErrorScope::NoRoom`]: the request is denied, never let through.
    OutOfMemory {
        /// A suggested wait before retrying (Redis frees memory as keys
        /// expire, at a time the client cannot know).
        retry_after: Duration,
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
    /// The store, or a policy's algorithm, does not support the operation
    /// asked for (for example [`Store::charge`](crate::Store::charge) on a
    /// store without post-charging, or on a fixed-window policy). Nothing
    /// was changed; the same call fails the same way every time.
    Unsupported {
        /// What was asked for, e.g. `"charge"`.
        operation: &'static str,
        /// Why it is refused and what to do instead.
        detail: String,
    },
    /// The backend refused this request with an error of its own (for
    /// Redis: a script error, a key of another type, a command it does not
    /// know); the backend's error is the [`source()`](Error::source).
    /// Nothing was charged by the refused command.
    Rejected {
        /// The backend's error.
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

    /// Wraps a backend's refusal of this request.
    pub fn rejected(source: impl Into<BoxError>) -> Self {
        Self::Rejected {
            source: source.into(),
        }
    }

    /// Wraps a backend error after which the outcome is unknown.
    pub fn outcome_unknown(source: impl Into<BoxError>) -> Self {
        Self::OutcomeUnknown {
            source: source.into(),
        }
    }

    /// Whether the error comes from the backend (unreachable, slow, broken,
    /// full) rather than from the request. See [`StoreError::scope`] for
    /// what a caller should do with each.
    #[must_use]
    pub fn is_backend(&self) -> bool {
        !matches!(self.scope(), ErrorScope::Request)
    }

    /// How far the error reaches: one request, one subject, a new subject
    /// the store has no room for, or the whole store. Only
    /// [`ErrorScope::Store`] errors may count toward a circuit breaker;
    /// the table at [`ErrorScope`] lists every variant.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{ErrorScope, StoreError};
    ///
    /// let timeout = StoreError::Timeout { after: Duration::from_millis(250) };
    /// assert_eq!(timeout.scope(), ErrorScope::Store);
    /// assert!(timeout.is_store_wide());
    /// let full = StoreError::Full { max_keys: 10, retry_after: Duration::from_secs(1) };
    /// assert_eq!(full.scope(), ErrorScope::NoRoom);
    /// assert!(!full.is_store_wide());
    /// ```
    #[must_use]
    pub fn scope(&self) -> ErrorScope {
        // Every variant is listed (no wildcard): a new variant must be
        // classified here, on purpose.
        match self {
            Self::CostTooHigh { .. }
            | Self::NoPolicies
            | Self::DuplicatePolicy { .. }
            | Self::Unsupported { .. } => ErrorScope::Request,
            Self::Protocol { .. } | Self::Rejected { .. } => ErrorScope::Subject,
            Self::Full { .. } | Self::OutOfMemory { .. } => ErrorScope::NoRoom,
            Self::Timeout { .. } | Self::Unavailable { .. } | Self::OutcomeUnknown { .. } => {
                ErrorScope::Store
            }
        }
    }

    /// Whether the error says the store as a whole is unreachable or
    /// unhealthy ([`ErrorScope::Store`]): the only errors a circuit breaker
    /// may count.
    #[must_use]
    pub fn is_store_wide(&self) -> bool {
        self.scope() == ErrorScope::Store
    }

    /// For [`ErrorScope::NoRoom`] errors, how long until a new subject may
    /// fit: the `Retry-After` of the denial.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Full { retry_after, .. } | Self::OutOfMemory { retry_after } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }
}

/// How far a [`StoreError`] reaches, and so what the tower layer does with
/// it. No error about one request or one subject may change another
/// subject's decision: only [`ErrorScope::Store`] feeds the circuit breaker.
///
/// | scope | errors | the layer answers | circuit breaker |
/// |---|---|---|---|
/// | `Request` | [`StoreError::CostTooHigh`], [`StoreError::NoPolicies`], [`StoreError::DuplicatePolicy`], [`StoreError::Unsupported`] (and a subject or key too long, where a store refuses one) | `429` without `Retry-After`: the request can never be admitted | not counted |
/// | `Subject` | [`StoreError::Rejected`] (the backend refused this request: a Redis key of the wrong type, a script error; its error is the `source()`), [`StoreError::Protocol`] (a reply that does not parse) | this request alone by its failure policy (fail-open lets **this** request through, counted and logged) | not counted |
/// | `NoRoom` | [`StoreError::Full`] (a `MemoryStore` at its bound told to deny), [`StoreError::OutOfMemory`] (Redis at `maxmemory` + `noeviction`, for a subject it does not hold) | denied: `429` with `Retry-After` (or `503`, if the layer is told so); **never** let through, whatever the failure policy | not counted |
/// | `Store` | [`StoreError::Timeout`], [`StoreError::Unavailable`] (connection refused, `CLUSTERDOWN`, `LOADING`, `BUSY`, `MASTERDOWN`, `READONLY`, authentication), [`StoreError::OutcomeUnknown`] (connection lost mid-call) | the failure policy | counted |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorScope {
    /// The request itself is invalid; retrying it fails the same way.
    Request,
    /// One subject's state or reply could not be used; other subjects are
    /// unaffected.
    Subject,
    /// A subject the store does not hold cannot be stored (the store is at
    /// its bound); held subjects are unaffected.
    NoRoom,
    /// The store as a whole is unreachable or unhealthy.
    Store,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CostTooHigh { policy, cost, capacity } => write!(f, "cost {cost} is above the capacity {capacity} of policy {policy:?}: no amount of waiting admits it; split the request or raise the policy's burst"),
            Self::NoPolicies => f.write_str("no policy was given: pass at least one policy to check"),
            Self::DuplicatePolicy { name } => write!(f, "two policies are named {name:?}: give each policy of a check its own name with .name(..)"),
            Self::Full { max_keys, retry_after } => write!(f, "the memory store holds its maximum of {max_keys} subjects and none has expired, so a new subject is refused (retry after {retry_after:?}): raise max_keys, or let the store evict with WhenFull::EvictNearestFull"),
            Self::OutOfMemory { retry_after } => write!(f, "Redis is out of memory (maxmemory with noeviction), so a subject it does not hold is refused (retry after {retry_after:?}); held subjects are still checked: raise maxmemory or free memory on the server"),
            Self::Timeout { after } => write!(f, "the store did not answer within {after:?}; the check was not retried (it may have been applied): check the backend's health or raise the timeout"),
            Self::Unavailable { .. } => f.write_str("the store is unavailable; nothing was charged: check that the backend is running and reachable"),
            Self::OutcomeUnknown { .. } => f.write_str("the store failed mid-call; the check may have been applied and was not retried: check the backend's health"),
            Self::Unsupported { operation, detail } => write!(f, "{operation} is not supported: {detail}"),
            Self::Rejected { .. } => f.write_str("the store refused the check: check that the backend and portcullis versions match and that nothing else writes portcullis's keys"),
            Self::Protocol { detail } => write!(f, "the store sent an unexpected reply: {detail}; check that the backend and portcullis versions match"),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Unavailable { source }
            | Self::OutcomeUnknown { source }
            | Self::Rejected { source } => Some(&**source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::ThrottleError;
    use crate::{ConcurrencyPolicyError, Policy, PolicyError};

    /// The `Display` texts of `error` and of each `source()` below it.
    fn chain(error: &(dyn Error + 'static)) -> Vec<String> {
        let mut texts = vec![error.to_string()];
        let mut cause = error.source();
        while let Some(error) = cause {
            texts.push(error.to_string());
            cause = error.source();
        }
        texts
    }

    /// Each cause's text appears exactly once in the whole chain, as a
    /// `source()` walker (anyhow's `{:#}`) prints it.
    fn assert_printed_once(error: &(dyn Error + 'static)) {
        let texts = chain(error);
        assert!(texts.len() > 1, "no source: {texts:?}");
        let printed = texts.join(": ");
        for cause in &texts[1..] {
            assert_eq!(
                printed.matches(cause.as_str()).count(),
                1,
                "{cause:?} in {printed:?}"
            );
        }
    }

    #[test]
    fn every_cause_prints_once_through_a_source_walker() {
        let refused = || {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused (os error 111)",
            )
        };
        assert_printed_once(&StoreError::unavailable(refused()));
        assert_printed_once(&StoreError::outcome_unknown(refused()));
        assert_printed_once(&StoreError::rejected(
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ));
        // Two levels: a store error wrapping an error with its own cause.
        let nested = std::io::Error::other(StoreError::unavailable(refused()));
        assert_printed_once(&StoreError::outcome_unknown(nested));

        let throttle = ThrottleError::Policy(PolicyError::ZeroBurst);
        assert_printed_once(&throttle);
        let name = Policy::per_second(1).name("no spaces").build().unwrap_err();
        assert_printed_once(&ConcurrencyPolicyError::Name(name));
    }
}
