//! [`TokenBudget`]: what a reservation is checked against (token
//! policies, request policies, streams in flight, the overage cap and the
//! reservation's time to live), its builder and [`TokenBudgetError`].

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::policy::validate_name;
use crate::{Policy, PolicyError, MAX_IN_FLIGHT, MAX_LEASE_TTL, MIN_LEASE_TTL};

/// The budget a [`ReservationStore`](crate::ReservationStore) reserves
/// against: token policies charged the request's estimate, request
/// policies charged 1, and optionally at most N reservations open at once
/// (streams in flight), all decided in one atomic step.
///
/// Settling a reservation refunds the unused part of its estimate to the
/// token policies and charges usage beyond it, up to [`max_overage`]
/// tokens (by default the smallest token policy's capacity). A reservation
/// never settled expires after its [`reservation_ttl`] (default 5
/// minutes): its estimate stays charged and its place in flight is freed.
///
/// Token policies must use [`Algorithm::Gcra`](crate::Algorithm::Gcra)
/// (the default) or [`Algorithm::TokenBucket`](crate::Algorithm::TokenBucket):
/// a store refuses others with [`StoreError::Unsupported`](crate::StoreError::Unsupported).
///
/// [`max_overage`]: TokenBudgetBuilder::max_overage
/// [`reservation_ttl`]: TokenBudgetBuilder::reservation_ttl
///
/// ```
/// use std::time::Duration;
/// use portcullis::{Policy, TokenBudget};
///
/// let budget = TokenBudget::tokens(Policy::per_minute(100_000).name("tokens-per-minute").build()?)
///     .requests(Policy::per_minute(60).name("requests-per-minute").build()?)
///     .max_in_flight(4)
///     .max_overage(2_000)
///     .reservation_ttl(Duration::from_secs(120))
///     .build()?;
/// assert_eq!(budget.token_policies().len(), 1);
/// assert_eq!(budget.max_overage(), 2_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBudget {
    inner: Arc<Inner>,
}

#[derive(Debug, PartialEq, Eq)]
struct Inner {
    name: String,
    /// The token policies, then the request policies.
    policies: Vec<Policy>,
    tokens: usize,
    max_in_flight: Option<u64>,
    max_overage: u64,
    ttl_us: u64,
}

impl TokenBudget {
    /// A builder whose first token policy is `policy`.
    pub fn tokens(policy: Policy) -> TokenBudgetBuilder {
        TokenBudgetBuilder {
            name: None,
            tokens: vec![policy],
            requests: Vec::new(),
            max_in_flight: None,
            max_overage: None,
            ttl: Duration::from_secs(300),
        }
    }

    /// The budget's name (default `budget`): the last part of its
    /// reservations' Redis keys.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The token policies, charged a reservation's estimate.
    #[must_use]
    pub fn token_policies(&self) -> &[Policy] {
        &self.inner.policies[..self.inner.tokens]
    }

    /// The request policies, charged 1 per reservation.
    #[must_use]
    pub fn request_policies(&self) -> &[Policy] {
        &self.inner.policies[self.inner.tokens..]
    }

    /// The token policies followed by the request policies: the order of a
    /// reservation's [`Verdict`](crate::Verdict).
    #[must_use]
    pub fn policies(&self) -> &[Policy] {
        &self.inner.policies
    }

    /// The most reservations open at once per subject, if limited.
    #[must_use]
    pub fn max_in_flight(&self) -> Option<u64> {
        self.inner.max_in_flight
    }

    /// The most tokens beyond its estimate a settlement charges.
    #[must_use]
    pub fn max_overage(&self) -> u64 {
        self.inner.max_overage
    }

    /// How long an unsettled reservation lives.
    #[must_use]
    pub fn reservation_ttl(&self) -> Duration {
        Duration::from_micros(self.inner.ttl_us)
    }

    /// [`TokenBudget::reservation_ttl`] in microseconds.
    #[must_use]
    pub fn reservation_ttl_micros(&self) -> u64 {
        self.inner.ttl_us
    }
}

/// Builds a [`TokenBudget`]; see [`TokenBudget::tokens`].
#[derive(Debug, Clone)]
#[must_use]
pub struct TokenBudgetBuilder {
    name: Option<String>,
    tokens: Vec<Policy>,
    requests: Vec<Policy>,
    max_in_flight: Option<u64>,
    max_overage: Option<u64>,
    ttl: Duration,
}

impl TokenBudgetBuilder {
    /// Names the budget (1 to 64 ASCII letters, digits, `_`, `-`, `.`;
    /// default `budget`). Two budgets of one subject need two names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Adds a token policy (say tokens per minute beside tokens per day).
    pub fn tokens(mut self, policy: Policy) -> Self {
        self.tokens.push(policy);
        self
    }

    /// Adds a request policy, charged 1 per reservation (any algorithm).
    pub fn requests(mut self, policy: Policy) -> Self {
        self.requests.push(policy);
        self
    }

    /// At most `max` reservations open at once per subject (streams in
    /// flight), 1 to [`MAX_IN_FLIGHT`]. A reservation is open from its
    /// admission until it is settled or expires.
    pub fn max_in_flight(mut self, max: u64) -> Self {
        self.max_in_flight = Some(max);
        self
    }

    /// The most tokens beyond its estimate one settlement charges (usage
    /// past it is forgiven). Default: the smallest token policy's
    /// capacity. 0 charges no overage at all.
    pub fn max_overage(mut self, tokens: u64) -> Self {
        self.max_overage = Some(tokens);
        self
    }

    /// How long a reservation lives unless settled, between
    /// [`MIN_LEASE_TTL`] and [`MAX_LEASE_TTL`] in whole microseconds
    /// (default 5 minutes). Set it above the longest response you serve:
    /// a reservation settled after it expired charges nothing more (its
    /// estimate stays charged). Each reservation keeps a small record for
    /// this long after it is made and again after it is settled (so that
    /// a retried settle is known): a subject holds at most as many as its
    /// policies admit in that time.
    pub fn reservation_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Validates and builds the budget.
    ///
    /// # Errors
    ///
    /// A [`TokenBudgetError`] naming the field.
    pub fn build(self) -> Result<TokenBudget, TokenBudgetError> {
        let name = self.name.unwrap_or_else(|| "budget".to_owned());
        validate_name(&name).map_err(TokenBudgetError::Name)?;
        if let Some(max) = self.max_in_flight
            && (max == 0 || max > MAX_IN_FLIGHT)
        {
            return Err(TokenBudgetError::MaxInFlight { value: max });
        }
        let ttl = self.ttl;
        if ttl < MIN_LEASE_TTL || ttl > MAX_LEASE_TTL || !ttl.subsec_nanos().is_multiple_of(1_000) {
            return Err(TokenBudgetError::ReservationTtl { ttl });
        }
        let tokens = self.tokens.len();
        let mut policies = self.tokens;
        policies.extend(self.requests);
        for (i, policy) in policies.iter().enumerate() {
            if policies[..i].iter().any(|p| p.name() == policy.name()) {
                return Err(TokenBudgetError::DuplicatePolicy {
                    name: policy.name().to_owned(),
                });
            }
        }
        let smallest = policies[..tokens]
            .iter()
            .map(Policy::capacity)
            .min()
            .unwrap_or(0);
        Ok(TokenBudget {
            inner: Arc::new(Inner {
                name,
                max_overage: self.max_overage.unwrap_or(smallest),
                policies,
                tokens,
                max_in_flight: self.max_in_flight,
                // At most a day: fits.
                ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX),
            }),
        })
    }
}

/// Why a [`TokenBudget`] could not be built. Each message says what to
/// change.
///
/// ```
/// use portcullis::{Policy, TokenBudget};
///
/// let err = TokenBudget::tokens(Policy::per_minute(1_000).build()?)
///     .max_in_flight(0)
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("max_in_flight"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenBudgetError {
    /// The budget's name is not valid; the policy error is the source.
    Name(PolicyError),
    /// `max_in_flight` is 0 or above [`MAX_IN_FLIGHT`].
    MaxInFlight {
        /// The value given.
        value: u64,
    },
    /// The reservation TTL is out of range or not whole microseconds.
    ReservationTtl {
        /// The value given.
        ttl: Duration,
    },
    /// Two policies of the budget share a name (they would share state).
    DuplicatePolicy {
        /// The repeated name.
        name: String,
    },
}

impl fmt::Display for TokenBudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(_) => f.write_str(
                "the token budget's name is not valid; use 1 to 64 ASCII letters, digits, '_', '-' or '.'",
            ),
            Self::MaxInFlight { value } => write!(
                f,
                "max_in_flight is {value}; give 1 to {MAX_IN_FLIGHT}, or leave it unset for no limit on streams in flight"
            ),
            Self::ReservationTtl { ttl } => write!(
                f,
                "reservation_ttl is {ttl:?}; give whole microseconds between {MIN_LEASE_TTL:?} and {MAX_LEASE_TTL:?}"
            ),
            Self::DuplicatePolicy { name } => write!(
                f,
                "two policies of the token budget are named {name:?}; give each its own name"
            ),
        }
    }
}

impl Error for TokenBudgetError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Name(source) => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_validates_each_field() {
        let tokens = Policy::per_minute(1_000).name("t").build().unwrap();
        let requests = Policy::per_minute(10).name("r").build().unwrap();
        let budget = TokenBudget::tokens(tokens.clone())
            .requests(requests.clone())
            .build()
            .unwrap();
        assert_eq!(budget.max_overage(), 1_000);
        assert_eq!(budget.policies(), &[tokens.clone(), requests][..]);
        assert_eq!(budget.reservation_ttl(), Duration::from_secs(300));
        let dup = TokenBudget::tokens(tokens.clone())
            .requests(tokens.clone())
            .build();
        assert!(matches!(dup, Err(TokenBudgetError::DuplicatePolicy { .. })));
        let ttl = TokenBudget::tokens(tokens.clone())
            .reservation_ttl(Duration::from_nanos(1))
            .build()
            .unwrap_err();
        assert!(ttl.to_string().contains("reservation_ttl"), "{ttl}");
        let name = TokenBudget::tokens(tokens).name("a:b").build().unwrap_err();
        assert!(name.source().is_some());
        assert!(!name.to_string().contains("a:b"));
    }
}
