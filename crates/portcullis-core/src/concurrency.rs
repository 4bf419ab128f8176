//! Keyed concurrency limits: [`ConcurrencyPolicy`] (at most N permits in
//! flight per subject, each a lease with a TTL), the lease types
//! ([`LeaseId`], [`Lease`], [`LeaseDecision`]) and the [`LeaseStore`] trait
//! that stores holding leases implement. The algorithm itself is
//! `algorithms::lease` (shared with the Redis store, not public).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::policy::validate_name;
use crate::{PolicyError, StoreError};

/// The most permits a [`ConcurrencyPolicy`] may allow in flight per
/// subject: 10 000. Every live lease is remembered (in memory, or as a
/// member of a Redis sorted set) until it is released or expires.
pub const MAX_IN_FLIGHT: u64 = 10_000;
/// The shortest lease TTL accepted: 10 ms (holders renew at a third of it).
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(10);
/// The longest lease TTL accepted: one day.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(86_400);

/// "At most `max_in_flight` permits in flight per subject", each permit a
/// lease that expires `lease_ttl` after it was acquired or last renewed, so
/// the permits of a crashed holder come back by themselves.
///
/// ```
/// use std::time::Duration;
/// use portcullis::ConcurrencyPolicy;
///
/// let exports = ConcurrencyPolicy::max_in_flight(3)
///     .lease_ttl(Duration::from_secs(30))
///     .name("exports")
///     .build()?;
/// assert_eq!(exports.limit(), 3);
/// assert_eq!(exports.lease_ttl(), Duration::from_secs(30));
/// assert_eq!(exports.name(), "exports");
///
/// // Invalid values are refused with an error naming the field.
/// let err = ConcurrencyPolicy::max_in_flight(0).build().unwrap_err();
/// assert!(err.to_string().contains("max_in_flight"));
/// # Ok::<(), portcullis::ConcurrencyPolicyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConcurrencyPolicy {
    name: Arc<str>,
    max_in_flight: u64,
    lease_ttl_us: u64,
}

impl ConcurrencyPolicy {
    /// A builder for at most `max` permits in flight per subject (default
    /// TTL 30 s, default name `concurrency`).
    pub fn max_in_flight(max: u64) -> ConcurrencyPolicyBuilder {
        ConcurrencyPolicyBuilder {
            name: None,
            max_in_flight: max,
            lease_ttl: Duration::from_secs(30),
        }
    }

    /// The policy's name (the last part of its Redis key).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The most permits in flight per subject.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.max_in_flight
    }

    /// How long a lease lives after it is acquired or renewed.
    #[must_use]
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_micros(self.lease_ttl_us)
    }

    /// The lease TTL in microseconds.
    #[must_use]
    pub fn lease_ttl_micros(&self) -> u64 {
        self.lease_ttl_us
    }
}

/// Builds a [`ConcurrencyPolicy`]; see [`ConcurrencyPolicy::max_in_flight`].
///
/// ```
/// use std::time::Duration;
/// use portcullis::ConcurrencyPolicy;
///
/// let builder = ConcurrencyPolicy::max_in_flight(20).name("llm");
/// // Renewed every 20 s while a request runs; a crashed holder's permits
/// // come back within a minute.
/// let policy = builder.lease_ttl(Duration::from_secs(60)).build()?;
/// assert_eq!(policy.lease_ttl_micros(), 60_000_000);
/// # Ok::<(), portcullis::ConcurrencyPolicyError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ConcurrencyPolicyBuilder {
    name: Option<String>,
    max_in_flight: u64,
    lease_ttl: Duration,
}

impl ConcurrencyPolicyBuilder {
    /// Names the policy (1 to 64 ASCII letters, digits, `_`, `-`, `.`).
    ///
    /// In Redis the leases live at `<prefix>:{<subject>}:lease:<name>`, a
    /// key no rate-limit [`Policy`](crate::Policy) uses, so a concurrency
    /// policy and a rate policy may share a name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How long a lease lives unless renewed: between [`MIN_LEASE_TTL`] and
    /// [`MAX_LEASE_TTL`], in whole microseconds. A holder that crashes gives
    /// its permits back after at most this long; a live holder renews at a
    /// third of it.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Validates and builds the policy.
    ///
    /// # Errors
    ///
    /// A [`ConcurrencyPolicyError`] naming the field.
    pub fn build(self) -> Result<ConcurrencyPolicy, ConcurrencyPolicyError> {
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return Err(ConcurrencyPolicyError::MaxInFlight {
                value: self.max_in_flight,
            });
        }
        let ttl = self.lease_ttl;
        if ttl < MIN_LEASE_TTL || ttl > MAX_LEASE_TTL || !ttl.subsec_nanos().is_multiple_of(1_000) {
            return Err(ConcurrencyPolicyError::LeaseTtl { ttl });
        }
        let name = self.name.unwrap_or_else(|| "concurrency".to_owned());
        validate_name(&name).map_err(ConcurrencyPolicyError::Name)?;
        Ok(ConcurrencyPolicy {
            name: name.into(),
            max_in_flight: self.max_in_flight,
            // At most a day: fits.
            lease_ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX),
        })
    }
}

/// Why a [`ConcurrencyPolicy`] could not be built. Each message says what
/// to change.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{ConcurrencyPolicy, ConcurrencyPolicyError};
///
/// let err = ConcurrencyPolicy::max_in_flight(5)
///     .lease_ttl(Duration::from_millis(1))
///     .build()
///     .unwrap_err();
/// assert!(matches!(err, ConcurrencyPolicyError::LeaseTtl { .. }));
/// assert!(err.to_string().contains("lease_ttl"));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ConcurrencyPolicyError {
    /// `max_in_flight` was 0 or above [`MAX_IN_FLIGHT`].
    MaxInFlight {
        /// The value given.
        value: u64,
    },
    /// The lease TTL was outside [`MIN_LEASE_TTL`]..=[`MAX_LEASE_TTL`] or
    /// had a fraction of a microsecond.
    LeaseTtl {
        /// The TTL given.
        ttl: Duration,
    },
    /// The name was invalid (the cause says how).
    Name(PolicyError),
}

impl fmt::Display for ConcurrencyPolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MaxInFlight { value } => write!(f, "concurrency policy max_in_flight is {value}: give between 1 and {MAX_IN_FLIGHT} permits in flight per subject"),
            Self::LeaseTtl { ttl } => write!(f, "concurrency policy lease_ttl {ttl:?} is invalid: give a whole number of microseconds between {MIN_LEASE_TTL:?} and {MAX_LEASE_TTL:?}"),
            Self::Name(_) => f.write_str("concurrency policy name is invalid: use 1 to 64 ASCII letters, digits, '_', '-' or '.'"),
        }
    }
}

impl Error for ConcurrencyPolicyError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Name(source) => Some(source),
            _ => None,
        }
    }
}

/// A lease's identity: 128 bits, unique within a process (a counter run
/// through a bijective mixer) and, across processes, by a random 64-bit
/// per-process prefix. Not guessable from other leases' ids.
///
/// ```
/// use portcullis::LeaseId;
///
/// let a = LeaseId::generate();
/// let b = LeaseId::generate();
/// assert_ne!(a, b);
/// assert_eq!(a.to_string().len(), 32);
/// assert_eq!(LeaseId::from_u128(a.as_u128()), a);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(u128);

impl LeaseId {
    /// A new id, different from every other id this process generated.
    #[must_use]
    pub fn generate() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let (prefix, key) = *process_seed();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self((u128::from(prefix) << 64) | u128::from(mix(n ^ key)))
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

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

/// Two random 64-bit words, drawn once per process from the standard
/// library's randomly seeded hasher, the time and the process id.
fn process_seed() -> &'static (u64, u64) {
    static SEED: OnceLock<(u64, u64)> = OnceLock::new();
    SEED.get_or_init(|| {
        use std::hash::BuildHasher;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let a =
            std::collections::hash_map::RandomState::new().hash_one((now, std::process::id(), 1u8));
        let b =
            std::collections::hash_map::RandomState::new().hash_one((now, std::process::id(), 2u8));
        (a, b)
    })
}

/// SplitMix64's finaliser: a bijection on `u64`, so distinct counters give
/// distinct ids.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A granted permit: its id and when it expires unless renewed.
///
/// ```
/// use portcullis::{Lease, LeaseId};
///
/// let id = LeaseId::generate();
/// let lease = Lease::new(id, 1_700_000_030_000_000);
/// assert_eq!(lease.id(), id);
/// assert_eq!(lease.expires_at_micros(), 1_700_000_030_000_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    id: LeaseId,
    expires_at_us: u64,
}

impl Lease {
    /// A lease with this id expiring at `expires_at_us` (microseconds since
    /// the Unix epoch, on the store's clock).
    #[must_use]
    pub const fn new(id: LeaseId, expires_at_us: u64) -> Self {
        Self { id, expires_at_us }
    }

    /// The lease's id, to renew or release it.
    #[must_use]
    pub const fn id(&self) -> LeaseId {
        self.id
    }

    /// When the lease expires unless renewed, in microseconds since the
    /// Unix epoch on the store's clock (Redis' `TIME` for a `RedisStore`).
    #[must_use]
    pub const fn expires_at_micros(&self) -> u64 {
        self.expires_at_us
    }
}

/// What an acquire decided: a [`Lease`], or a denial with how many are in
/// flight and when the first of them expires unless renewed.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{ConcurrencyPolicy, LeaseId, LeaseStore, ManualClock, MemoryStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let clock = std::sync::Arc::new(ManualClock::new(0));
/// let store = MemoryStore::with_clock(clock.clone());
/// let policy = ConcurrencyPolicy::max_in_flight(1).lease_ttl(Duration::from_secs(10)).build()?;
/// let granted = store.acquire("alice", &policy, LeaseId::generate()).await?;
/// assert!(granted.is_granted());
/// clock.advance(Duration::from_secs(1));
/// let denied = store.acquire("alice", &policy, LeaseId::generate()).await?;
/// assert!(!denied.is_granted());
/// assert_eq!(denied.in_flight(), 1);
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(9)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseDecision {
    lease: Option<Lease>,
    in_flight: u64,
    max_in_flight: u64,
    retry_after_us: u64,
}

impl LeaseDecision {
    /// A granted lease; `in_flight` counts it.
    #[must_use]
    pub const fn granted(lease: Lease, in_flight: u64, max_in_flight: u64) -> Self {
        Self {
            lease: Some(lease),
            in_flight,
            max_in_flight,
            retry_after_us: 0,
        }
    }

    /// A denial: `in_flight` live leases, the first expiring in
    /// `retry_after_us` unless renewed.
    #[must_use]
    pub const fn denied(in_flight: u64, max_in_flight: u64, retry_after_us: u64) -> Self {
        Self {
            lease: None,
            in_flight,
            max_in_flight,
            retry_after_us,
        }
    }

    /// Whether a lease was granted.
    #[must_use]
    pub const fn is_granted(&self) -> bool {
        self.lease.is_some()
    }

    /// The granted lease.
    #[must_use]
    pub const fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// Live leases of the subject after this decision (counting the one
    /// granted).
    #[must_use]
    pub const fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The policy's `max_in_flight`.
    #[must_use]
    pub const fn max_in_flight(&self) -> u64 {
        self.max_in_flight
    }

    /// Permits still free after this decision.
    #[must_use]
    pub const fn remaining(&self) -> u64 {
        self.max_in_flight.saturating_sub(self.in_flight)
    }

    /// For a denial, when the earliest live lease expires unless its holder
    /// renews it: the latest a permit can come back without a renewal. A
    /// release may free one sooner; a renewal pushes it later. `None` when
    /// granted.
    #[must_use]
    pub const fn retry_after(&self) -> Option<Duration> {
        if self.lease.is_some() {
            None
        } else {
            Some(Duration::from_micros(self.retry_after_us))
        }
    }
}

/// A store that holds leases for [`ConcurrencyPolicy`]s: the memory store
/// and the Redis store. One call is one atomic step.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{ConcurrencyPolicy, LeaseId, LeaseStore, MemoryStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let policy = ConcurrencyPolicy::max_in_flight(1).lease_ttl(Duration::from_secs(30)).build()?;
/// let first = store.acquire("tenant-a", &policy, LeaseId::generate()).await?;
/// let lease = first.lease().expect("the first permit is free");
/// assert!(!store.acquire("tenant-a", &policy, LeaseId::generate()).await?.is_granted());
/// assert!(store.acquire("tenant-b", &policy, LeaseId::generate()).await?.is_granted());
/// assert!(store.renew("tenant-a", &policy, lease.id()).await?.is_some());
/// assert!(store.release("tenant-a", &policy, lease.id()).await?);
/// assert!(store.acquire("tenant-a", &policy, LeaseId::generate()).await?.is_granted());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub trait LeaseStore: Send + Sync + 'static {
    /// The future of [`LeaseStore::acquire`].
    type AcquireFuture: Future<Output = Result<LeaseDecision, StoreError>> + Send + 'static;

    /// Acquires a permit for `subject` under the id `lease` (a fresh
    /// [`LeaseId::generate`]): prunes expired leases, and grants a new lease
    /// (expiring `lease_ttl` from now) when fewer than `max_in_flight` are
    /// live. The caller picks the id so that it can release a lease whose
    /// acquire timed out (it may have been granted); an id already held is
    /// renewed, not counted twice.
    ///
    /// # Errors
    ///
    /// Backend errors, and [`StoreError::Full`] for a new subject of a full
    /// memory store.
    fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Self::AcquireFuture;

    /// Answers an acquire at once when the store can (the memory store);
    /// `None` means use [`LeaseStore::acquire`] (nothing was done).
    fn acquire_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<LeaseDecision, StoreError>> {
        let _ = (subject, policy, lease);
        None
    }

    /// Extends a live lease to `lease_ttl` from now (never shortens it).
    /// `Ok(None)` when the lease is no longer held (it expired, or was
    /// released); `Ok(Some(expires_at_us))` otherwise.
    fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send + 'static;

    /// Releases at once when the store can (the memory store):
    /// `Some(result)` is what [`LeaseStore::release`] would have answered,
    /// and the lease is released; `None` means use `release` (nothing was
    /// done). Lets a caller skip boxing a future that is already done.
    fn release_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<bool, StoreError>> {
        let _ = (subject, policy, lease);
        None
    }

    /// Gives a lease back. `Ok(true)` when it was live and is now released,
    /// `Ok(false)` when it had already expired or been released.
    fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static;
}

impl<T: LeaseStore> LeaseStore for Arc<T> {
    type AcquireFuture = T::AcquireFuture;

    fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Self::AcquireFuture {
        (**self).acquire(subject, policy, lease)
    }

    fn acquire_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<LeaseDecision, StoreError>> {
        (**self).acquire_now(subject, policy, lease)
    }

    fn release_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<bool, StoreError>> {
        (**self).release_now(subject, policy, lease)
    }

    fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send + 'static {
        (**self).renew(subject, policy, lease)
    }

    fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static {
        (**self).release(subject, policy, lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_validates_every_field() {
        assert!(matches!(
            ConcurrencyPolicy::max_in_flight(0).build(),
            Err(ConcurrencyPolicyError::MaxInFlight { value: 0 })
        ));
        assert!(ConcurrencyPolicy::max_in_flight(MAX_IN_FLIGHT + 1)
            .build()
            .is_err());
        let short = ConcurrencyPolicy::max_in_flight(1)
            .lease_ttl(Duration::from_millis(9))
            .build()
            .unwrap_err();
        assert!(short.to_string().contains("lease_ttl"), "{short}");
        assert!(ConcurrencyPolicy::max_in_flight(1)
            .lease_ttl(Duration::from_nanos(20_000_001))
            .build()
            .is_err());
        let name = ConcurrencyPolicy::max_in_flight(1)
            .name("a b")
            .build()
            .unwrap_err();
        assert!(name.source().is_some());
        let ok = ConcurrencyPolicy::max_in_flight(MAX_IN_FLIGHT)
            .lease_ttl(MAX_LEASE_TTL)
            .build()
            .unwrap();
        assert_eq!(ok.lease_ttl_micros(), 86_400_000_000);
        assert_eq!(ok.name(), "concurrency");
    }

    #[test]
    fn ids_are_unique() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| LeaseId::generate()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
