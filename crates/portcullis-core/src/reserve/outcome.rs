//! What a reservation answers: [`ReservationId`], [`Reserved`] (admitted
//! or refused, and by what: [`Refusal`]) and [`Settlement`] (what a
//! settlement charged and refunded: [`SettleOutcome`]).

use std::fmt;
use std::time::Duration;

use crate::{LeaseId, TokenBudget, Verdict};

/// A reservation's identity: 128 bits, generated where the reservation is
/// made (never taken from a request), unique across processes as
/// [`LeaseId`]s are.
///
/// ```
/// use portcullis::ReservationId;
///
/// let a = ReservationId::generate();
/// assert_ne!(a, ReservationId::generate());
/// assert_eq!(a.to_string().len(), 32);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReservationId(u128);

impl ReservationId {
    /// A new id, different from every other id this process generated.
    #[must_use]
    pub fn generate() -> Self {
        Self(LeaseId::generate().as_u128())
    }

    /// The id as a number.
    #[must_use]
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// An id from a number (for stores that keep ids).
    #[must_use]
    pub const fn from_u128(id: u128) -> Self {
        Self(id)
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReservationId({self})")
    }
}

/// What refused a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The budget's policy at this index of [`TokenBudget::policies`]
    /// (token policies first, then request policies) had no room: the one
    /// whose `retry_after` is longest.
    Policy {
        /// The index in [`TokenBudget::policies`].
        index: usize,
    },
    /// The subject already had this many reservations open
    /// ([`TokenBudget::max_in_flight`], or the store's own bound).
    InFlight {
        /// The most open at once.
        max: u64,
    },
}

impl Refusal {
    /// What refused, as a client may be told: the policy's name, or
    /// `"<budget>-in-flight"` for streams in flight.
    ///
    /// ```
    /// use portcullis::{Policy, Refusal, TokenBudget};
    ///
    /// let budget = TokenBudget::tokens(Policy::per_minute(1_000).name("tokens").build()?).build()?;
    /// assert_eq!(Refusal::Policy { index: 0 }.name(&budget), "tokens");
    /// assert_eq!(Refusal::InFlight { max: 2 }.name(&budget), "budget-in-flight");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn name(&self, budget: &TokenBudget) -> String {
        match self {
            Self::Policy { index } => budget
                .policies()
                .get(*index)
                .map_or_else(|| budget.name().to_owned(), |p| p.name().to_owned()),
            Self::InFlight { .. } => format!("{}-in-flight", budget.name()),
        }
    }
}

/// The answer to [`ReservationStore::reserve`](crate::ReservationStore::reserve).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    verdict: Verdict,
    refusal: Option<Refusal>,
    in_flight: u64,
    retry_after: Option<Duration>,
    replay: bool,
}

impl Reserved {
    /// An admission (for stores): every policy charged, the reservation
    /// open, `in_flight` reservations open with it. `replay` when the id
    /// was already reserved (nothing charged again).
    #[must_use]
    pub fn admitted(verdict: Verdict, in_flight: u64, replay: bool) -> Self {
        Self {
            verdict,
            refusal: None,
            in_flight,
            retry_after: None,
            replay,
        }
    }

    /// A refusal (for stores): nothing charged, the verdict's decisions
    /// as peeks report them.
    #[must_use]
    pub fn refused(
        verdict: Verdict,
        refusal: Refusal,
        in_flight: u64,
        retry_after: Option<Duration>,
    ) -> Self {
        Self {
            verdict,
            refusal: Some(refusal),
            in_flight,
            retry_after,
            replay: false,
        }
    }

    /// A refusal by the policies of `verdict` (for stores): the denying
    /// policy with the longest `retry_after`.
    #[must_use]
    pub fn refused_by_policy(verdict: Verdict, in_flight: u64) -> Self {
        let index = verdict
            .decisions()
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.is_allowed())
            .max_by_key(|(_, d)| d.retry_after())
            .map_or(0, |(index, _)| index);
        let retry_after = verdict.retry_after();
        Self::refused(verdict, Refusal::Policy { index }, in_flight, retry_after)
    }

    /// Whether the reservation was made (and its estimate charged).
    #[must_use]
    pub fn is_admitted(&self) -> bool {
        self.refusal.is_none()
    }

    /// What refused it, when refused.
    #[must_use]
    pub fn refusal(&self) -> Option<Refusal> {
        self.refusal
    }

    /// One decision per policy of the budget, token policies first: after
    /// the charge when admitted, as peeks when refused.
    #[must_use]
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// Reservations of the subject open after this call (counted only when
    /// the budget limits them; else 0).
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// When refused, how long until the same reservation could be made:
    /// when the policies would have room, or when the first open
    /// reservation expires. `None` when admitted, or never (an estimate no
    /// policy can hold is an error, not a refusal).
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether the id was already reserved: answered without charging.
    #[must_use]
    pub fn is_replay(&self) -> bool {
        self.replay
    }
}

/// How a settlement went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SettleOutcome {
    /// The open reservation was settled now.
    Settled,
    /// It had been settled before (a retried settle): nothing charged
    /// again; the figures are the first settlement's.
    Replayed,
    /// No such reservation is live: it expired (its estimate stays
    /// charged) or never existed. Nothing was charged.
    Unknown,
}

/// The answer to [`ReservationStore::settle`](crate::ReservationStore::settle).
///
/// ```
/// use portcullis::{SettleOutcome, Settlement, Verdict};
///
/// let settled = Settlement::new(SettleOutcome::Settled, 1_000, 1_500, 200, Verdict::from_iter([]));
/// assert_eq!(settled.charged(), 1_200);
/// assert_eq!(settled.forgiven(), 300);
/// assert_eq!(settled.refunded(), 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    outcome: SettleOutcome,
    estimate: u64,
    used: u64,
    overage: u64,
    verdict: Verdict,
}

impl Settlement {
    /// A settlement (for stores): the reservation's `estimate`, the
    /// `used` tokens reported, the `overage` charged beyond the estimate,
    /// and the token policies' state after it as peeks.
    #[must_use]
    pub fn new(
        outcome: SettleOutcome,
        estimate: u64,
        used: u64,
        overage: u64,
        verdict: Verdict,
    ) -> Self {
        Self {
            outcome,
            estimate,
            used,
            overage,
            verdict,
        }
    }

    /// How it went.
    #[must_use]
    pub fn outcome(&self) -> SettleOutcome {
        self.outcome
    }

    /// The estimate the reservation held (0 when [`SettleOutcome::Unknown`]).
    #[must_use]
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// The usage reported.
    #[must_use]
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Tokens charged beyond the estimate (at most the budget's
    /// [`max_overage`](TokenBudget::max_overage)).
    #[must_use]
    pub fn overage(&self) -> u64 {
        self.overage
    }

    /// Tokens of the estimate given back.
    #[must_use]
    pub fn refunded(&self) -> u64 {
        self.estimate.saturating_sub(self.used)
    }

    /// Tokens the reservation cost in the end: the estimate, less the
    /// refund, plus the overage.
    #[must_use]
    pub fn charged(&self) -> u64 {
        self.estimate.min(self.used).saturating_add(self.overage)
    }

    /// Tokens used beyond the estimate and the overage cap: not charged.
    #[must_use]
    pub fn forgiven(&self) -> u64 {
        if self.outcome == SettleOutcome::Unknown {
            return 0;
        }
        self.used
            .saturating_sub(self.estimate.saturating_add(self.overage))
    }

    /// The token policies after the settlement, as peeks report them.
    #[must_use]
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }
}
