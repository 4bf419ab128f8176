//! The [`ReservationStore`] trait and [`validate_reserve`], what every
//! store refuses before it reserves.

use std::future::Future;
use std::sync::Arc;

use crate::{ReservationId, Reserved, Settlement, StoreError, TokenBudget};

/// A store that holds token reservations: [`MemoryStore`](crate::MemoryStore)
/// and `RedisStore`.
///
/// A reservation charges the estimate to every token policy of a
/// [`TokenBudget`] and 1 to every request policy, and opens a place among
/// the subject's streams in flight when the budget limits them: all in one
/// atomic step, all or nothing. Settling it refunds the unused part and
/// charges usage beyond the estimate up to the budget's overage cap, once:
/// a settle repeated with the same id charges nothing more.
///
/// ```
/// use portcullis::{MemoryStore, Policy, ReservationId, ReservationStore, SettleOutcome, TokenBudget};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let budget = TokenBudget::tokens(Policy::per_minute(1_000).name("tokens").build()?).build()?;
///
/// let id = ReservationId::generate();
/// let reserved = store.reserve("key-1", &budget, 800, id).await?;
/// assert!(reserved.is_admitted());
/// assert_eq!(reserved.verdict().decisions()[0].remaining(), 200);
/// // A second prompt of 800 does not fit beside the first.
/// assert!(!store.reserve("key-1", &budget, 800, ReservationId::generate()).await?.is_admitted());
///
/// // The response used 300: 500 come back.
/// let settled = store.settle("key-1", &budget, id, 300).await?;
/// assert_eq!(settled.refunded(), 500);
/// assert_eq!(settled.verdict().decisions()[0].remaining(), 700);
/// // A retried settle charges nothing more.
/// let again = store.settle("key-1", &budget, id, 300).await?;
/// assert_eq!(again.outcome(), SettleOutcome::Replayed);
/// assert_eq!(again.verdict().decisions()[0].remaining(), 700);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub trait ReservationStore: Send + Sync + 'static {
    /// Reserves `estimate` tokens (at least 1: an estimate of 0 reserves
    /// one) of every token policy of `budget` for `subject`, and one
    /// request of every request policy, as reservation `id`; when the
    /// budget limits streams in flight, the reservation takes one place
    /// until settled or expired. Refused, with nothing charged, when any
    /// policy lacks room or the places are taken. An `id` already reserved
    /// and live answers as admitted without charging again (a retried
    /// reserve).
    ///
    /// # Errors
    ///
    /// [`validate_reserve`]'s errors for a budget or an estimate no store
    /// can reserve; backend errors otherwise.
    fn reserve(
        &self,
        subject: &str,
        budget: &TokenBudget,
        estimate: u64,
        id: ReservationId,
    ) -> impl Future<Output = Result<Reserved, StoreError>> + Send + 'static;

    /// Settles reservation `id` of `subject` with the `used` tokens:
    /// refunds `estimate − used` when less was used, charges `used −
    /// estimate` up to [`TokenBudget::max_overage`] when more (never
    /// denied: a debt, as [`Store::charge`](crate::Store::charge)), frees
    /// its place in flight, and keeps a record for the budget's
    /// reservation TTL so that a settle retried within it charges nothing
    /// more ([`SettleOutcome::Replayed`](crate::SettleOutcome::Replayed)).
    /// A reservation that is not live (expired, or never made) is
    /// [`SettleOutcome::Unknown`](crate::SettleOutcome::Unknown): nothing
    /// is charged.
    ///
    /// # Errors
    ///
    /// As [`ReservationStore::reserve`].
    fn settle(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
        used: u64,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send + 'static;

    /// Keeps open reservation `id` of `subject` for the budget's
    /// reservation TTL from now, its place in flight with it: what a
    /// response that streams longer than the TTL calls while it streams
    /// (the tower layer `TokenBudgetLayer` does, every half TTL), so that the reservation neither expires with its
    /// estimate charged nor frees its place early. Charges nothing.
    /// `false` when the reservation is not open (settled, expired, or
    /// never made): there is nothing to keep.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{ManualClock, MemoryStore, Policy, ReservationId, ReservationStore, SettleOutcome, TokenBudget};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let clock = ManualClock::new(1_700_000_000_000_000);
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let budget = TokenBudget::tokens(Policy::per_hour(1_000).name("tokens").build()?)
    ///     .reservation_ttl(Duration::from_secs(60))
    ///     .build()?;
    /// let id = ReservationId::generate();
    /// store.reserve("key-1", &budget, 800, id).await?;
    /// // A long stream: kept open every 30 s, it outlives the 60 s TTL.
    /// for _ in 0..4 {
    ///     clock.advance(Duration::from_secs(30));
    ///     assert!(store.renew("key-1", &budget, id).await?);
    /// }
    /// let settled = store.settle("key-1", &budget, id, 300).await?;
    /// assert_eq!(settled.outcome(), SettleOutcome::Settled);
    /// assert!(!store.renew("key-1", &budget, id).await?, "settled: nothing to keep");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// Backend errors.
    fn renew(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static;
}

impl<T: ReservationStore> ReservationStore for Arc<T> {
    fn reserve(
        &self,
        subject: &str,
        budget: &TokenBudget,
        estimate: u64,
        id: ReservationId,
    ) -> impl Future<Output = Result<Reserved, StoreError>> + Send + 'static {
        (**self).reserve(subject, budget, estimate, id)
    }

    fn settle(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
        used: u64,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send + 'static {
        (**self).settle(subject, budget, id, used)
    }

    fn renew(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static {
        (**self).renew(subject, budget, id)
    }
}

/// What every store refuses before reserving, and the estimate it
/// reserves (at least 1): token policies of an algorithm that cannot be
/// refunded ([`StoreError::Unsupported`]: use GCRA or the token bucket),
/// and an estimate above a token policy's capacity
/// ([`StoreError::CostTooHigh`]: it could never fit).
///
/// ```
/// use portcullis::store::validate_reserve;
/// use portcullis::{Algorithm, Policy, StoreError, TokenBudget};
///
/// let budget = TokenBudget::tokens(Policy::per_minute(1_000).build()?).build()?;
/// assert_eq!(validate_reserve(&budget, 0)?, 1);
/// assert!(matches!(validate_reserve(&budget, 1_001), Err(StoreError::CostTooHigh { .. })));
/// let window = Policy::per_minute(1_000).algorithm(Algorithm::FixedWindow).build()?;
/// let err = validate_reserve(&TokenBudget::tokens(window).build()?, 10).unwrap_err();
/// assert!(err.to_string().contains("TokenBucket"), "{err}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// As above.
pub fn validate_reserve(budget: &TokenBudget, estimate: u64) -> Result<u64, StoreError> {
    let estimate = estimate.max(1);
    for policy in budget.token_policies() {
        if !crate::algorithms::supports_charge(policy.algorithm()) {
            return Err(StoreError::Unsupported {
                operation: "reserve",
                detail: format!(
                    "token policy {:?} uses the {} algorithm, whose reservations cannot be refunded; give it Algorithm::Gcra (the default) or Algorithm::TokenBucket",
                    policy.name(),
                    policy.algorithm()
                ),
            });
        }
        if estimate > policy.capacity() {
            return Err(StoreError::CostTooHigh {
                policy: policy.name().to_owned(),
                cost: estimate,
                capacity: policy.capacity(),
            });
        }
    }
    Ok(estimate)
}

/// What every store refuses before settling (as [`validate_reserve`] for
/// the budget), and the usage it settles: a usage above
/// [`MAX_MAGNITUDE`](crate::MAX_MAGNITUDE) (2^52 tokens, beyond any
/// budget) counts as that much, so that every store settles it exactly.
///
/// ```
/// use portcullis::store::validate_settle;
/// use portcullis::{Policy, TokenBudget, MAX_MAGNITUDE};
///
/// let budget = TokenBudget::tokens(Policy::per_minute(1_000).build()?).build()?;
/// assert_eq!(validate_settle(&budget, 700)?, 700);
/// assert_eq!(validate_settle(&budget, u64::MAX)?, MAX_MAGNITUDE);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// As [`validate_reserve`] for the budget's token policies.
pub fn validate_settle(budget: &TokenBudget, used: u64) -> Result<u64, StoreError> {
    validate_reserve(budget, 1)?;
    Ok(used.min(crate::MAX_MAGNITUDE))
}
