//! `BoxStore`: any [`Store`] behind one type, chosen at run time (memory or
//! Redis from configuration), with or without its concurrency leases
//! ([`LeaseStore`]): [`BoxStore`] and [`BoxLeaseStore`]. The object-safe
//! `DynStore` they hold, and their futures, are in `dyn_store.rs`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::{
    CheckOptions, Checked, ConcurrencyPolicy, LeaseDecision, LeaseId, LeaseStore, Policy, Store,
    StoreError, Verdict,
};

mod dyn_store;

pub use self::dyn_store::{
    BoxAcquireFuture, BoxCheckFuture, BoxReleaseFuture, BoxRenewFuture, BoxResetFuture,
};
use self::dyn_store::{DynStore, WithLeases};

/// Any [`Store`] behind one type, so an application picks its store at
/// start-up (memory, or Redis when configured) without making its router
/// generic, and any store can be a layer's fallback store.
///
/// Cloning is cheap (an [`Arc`]). A check through a `BoxStore` costs at
/// most one allocation more than through the store itself: a store that
/// answers at once ([`Store::check_now`], as [`MemoryStore`] does) is
/// answered without any, and a store that waits (Redis) has its future
/// boxed once.
///
/// For a concurrency limit too, box a store that holds leases
/// ([`MemoryStore`], `RedisStore`) as a [`BoxLeaseStore`]: it forwards them
/// the same way (an acquire the store answers at once through
/// [`LeaseStore::acquire_now`] needs no allocation).
///
/// [`MemoryStore`]: crate::MemoryStore
///
/// ```
/// use portcullis::{BoxStore, MemoryStore, Policy, Store};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // In an application: `match std::env::var("REDIS_URL") { Ok(url) =>
/// // BoxStore::new(RedisStore::connect(&url).await?), Err(_) => ... }`
/// // (portcullis-redis's `store_from_env` does this, with leases).
/// let store: BoxStore = BoxStore::new(MemoryStore::new());
/// let policies = [Policy::per_second(1).name("api").build()?];
/// assert!(store.check("alice", &policies, 1).await?.is_allowed());
/// assert!(!store.check_now("alice", &policies, 1).unwrap()?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct BoxStore {
    inner: Arc<dyn DynStore>,
}

impl BoxStore {
    /// Boxes `store` for rate limits: a `BoxStore` is a [`Store`] only.
    /// For a store whose concurrency leases are wanted too, use
    /// [`BoxLeaseStore`], which is also a [`LeaseStore`]. (To share a
    /// `BoxStore`, clone it rather than box it again.)
    #[must_use]
    pub fn new<S: Store>(store: S) -> Self {
        Self {
            inner: Arc::new(store),
        }
    }

    /// Boxes a store that is already shared, for rate limits only (as
    /// [`BoxStore::new`]).
    #[must_use]
    pub fn from_arc<S: Store>(store: Arc<S>) -> Self {
        Self { inner: store }
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStore")
            .field(&self.inner.type_name())
            .finish()
    }
}

/// `Store` for a box: every call forwarded to the `dyn DynStore` it holds
/// (the same for [`BoxStore`] and [`BoxLeaseStore`]).
macro_rules! forward_store {
    ($box:ty) => {
        impl Store for $box {
            type CheckFuture = BoxCheckFuture;

            fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
                self.inner.check_boxed(subject, policies, cost)
            }

            fn check_now(
                &self,
                subject: &str,
                policies: &[Policy],
                cost: u64,
            ) -> Option<Result<Verdict, StoreError>> {
                self.inner.check_now_dyn(subject, policies, cost)
            }

            fn charge(
                &self,
                subject: &str,
                policies: &[Policy],
                cost: u64,
            ) -> impl Future<Output = Result<Verdict, StoreError>> + Send + 'static {
                self.inner.charge_boxed(subject, policies, cost)
            }

            fn check_with(
                &self,
                subject: &str,
                policies: &[Policy],
                cost: u64,
                options: &CheckOptions,
            ) -> impl Future<Output = Result<Checked, StoreError>> + Send + 'static {
                self.inner
                    .check_with_boxed(subject, policies, cost, options)
            }

            fn reset(
                &self,
                subject: &str,
                policies: &[Policy],
            ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
                self.inner.reset_boxed(subject, policies)
            }
        }
    };
}

forward_store!(BoxStore);

/// Any store that holds concurrency leases behind one type: a [`Store`] and
/// a [`LeaseStore`], so one box serves both a `RateLimitLayer` and a
/// `ConcurrencyLimitLayer`. A store without leases cannot be put in one (it
/// does not implement [`LeaseStore`]), so a concurrency layer is never
/// given a store it cannot use. Converts into a [`BoxStore`] for code that
/// only checks rates.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{BoxLeaseStore, BoxStore, ConcurrencyPolicy, LeaseId, LeaseStore, MemoryStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = BoxLeaseStore::new(MemoryStore::new());
/// let policy = ConcurrencyPolicy::max_in_flight(2).lease_ttl(Duration::from_secs(30)).build()?;
/// let first = store.acquire("tenant", &policy, LeaseId::generate()).await?;
/// let second = store.acquire("tenant", &policy, LeaseId::generate()).await?;
/// assert!(first.is_granted() && second.is_granted());
/// // Both permits are taken: the third is denied.
/// let third = store.acquire("tenant", &policy, LeaseId::generate()).await?;
/// assert!(!third.is_granted());
/// assert_eq!(third.in_flight(), 2);
/// // Releasing one frees a permit.
/// assert!(store.release("tenant", &policy, first.lease().unwrap().id()).await?);
/// assert!(store.acquire("tenant", &policy, LeaseId::generate()).await?.is_granted());
/// // The same state, as a rates-only box.
/// let rates: BoxStore = store.into();
/// # let _ = rates;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct BoxLeaseStore {
    inner: Arc<dyn DynStore>,
}

impl BoxLeaseStore {
    /// Boxes `store` with its concurrency leases.
    #[must_use]
    pub fn new<S: Store + LeaseStore>(store: S) -> Self {
        Self {
            inner: Arc::new(WithLeases(store)),
        }
    }
}

impl From<BoxLeaseStore> for BoxStore {
    /// The same store (the same state), for rate limits only.
    fn from(store: BoxLeaseStore) -> Self {
        Self { inner: store.inner }
    }
}

impl fmt::Debug for BoxLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxLeaseStore")
            .field(&self.inner.type_name())
            .finish()
    }
}

forward_store!(BoxLeaseStore);

impl LeaseStore for BoxLeaseStore {
    type AcquireFuture = BoxAcquireFuture;

    fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Self::AcquireFuture {
        self.inner.acquire_boxed(subject, policy, lease)
    }

    fn acquire_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<LeaseDecision, StoreError>> {
        self.inner.acquire_now_dyn(subject, policy, lease)
    }

    fn release_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<bool, StoreError>> {
        self.inner.release_now_dyn(subject, policy, lease)
    }

    fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send + 'static {
        self.inner.renew_boxed(subject, policy, lease)
    }

    fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static {
        self.inner.release_boxed(subject, policy, lease)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::time::Duration;

    use super::*;
    use crate::MemoryStore;

    /// A store that only answers through its future, as Redis does.
    struct Deferred(MemoryStore);

    impl Store for Deferred {
        type CheckFuture = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send>>;

        fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
            let answer = self.0.check_now(subject, policies, cost);
            Box::pin(async move { answer.unwrap() })
        }

        fn reset(
            &self,
            subject: &str,
            policies: &[Policy],
        ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
            self.0.reset(subject, policies)
        }
    }

    fn policies() -> [Policy; 1] {
        [Policy::per_minute(2).name("api").build().unwrap()]
    }

    #[test]
    fn memory_answers_now_through_the_box() {
        let store = BoxStore::new(MemoryStore::new());
        let p = policies();
        assert!(store.check_now("a", &p, 1).unwrap().unwrap().is_allowed());
        assert_eq!(
            store.check_now("a", &p, 1).unwrap().unwrap().decisions()[0].remaining(),
            0
        );
        assert!(!store.check_now("a", &p, 1).unwrap().unwrap().is_allowed());
        futures::executor::block_on(store.reset("a", &p)).unwrap();
        assert!(store.check_now("a", &p, 1).unwrap().unwrap().is_allowed());
        assert!(format!("{store:?}").contains("MemoryStore"));
    }

    #[test]
    fn charge_is_forwarded_and_refused_by_stores_without_it() {
        let store = BoxStore::new(MemoryStore::new());
        let p = policies();
        let after = futures::executor::block_on(store.charge("a", &p, 5)).unwrap();
        assert!(!after.is_allowed());
        let deferred = BoxStore::new(Deferred(MemoryStore::new()));
        let err = futures::executor::block_on(deferred.charge("a", &p, 1)).unwrap_err();
        assert!(matches!(
            err,
            StoreError::Unsupported {
                operation: "charge",
                ..
            }
        ));
        assert!(err.to_string().contains("Deferred"), "{err}");
    }

    #[test]
    fn a_deferred_store_answers_through_its_future() {
        let store = BoxStore::new(Deferred(MemoryStore::new()));
        let p = policies();
        assert!(store.check_now("a", &p, 1).is_none());
        let verdict = futures::executor::block_on(store.check("a", &p, 2)).unwrap();
        assert_eq!(verdict.decisions()[0].remaining(), 0);
        let verdict = futures::executor::block_on(store.check("a", &p, 1)).unwrap();
        assert!(!verdict.is_allowed());
    }

    fn concurrency(max: u64) -> ConcurrencyPolicy {
        ConcurrencyPolicy::max_in_flight(max)
            .lease_ttl(Duration::from_secs(30))
            .name("exports")
            .build()
            .unwrap()
    }

    #[test]
    fn a_lease_box_grants_up_to_the_limit_and_release_frees_a_permit() {
        let store = BoxLeaseStore::new(MemoryStore::new());
        let policy = concurrency(2);
        // The memory store answers at once through the box.
        let first = store
            .acquire_now("t", &policy, LeaseId::generate())
            .unwrap()
            .unwrap();
        let second =
            futures::executor::block_on(store.acquire("t", &policy, LeaseId::generate())).unwrap();
        assert!(first.is_granted() && second.is_granted());
        assert_eq!(second.in_flight(), 2);
        let denied = store
            .acquire_now("t", &policy, LeaseId::generate())
            .unwrap()
            .unwrap();
        assert!(!denied.is_granted());
        assert_eq!(denied.in_flight(), 2);
        assert!(denied.retry_after().is_some());
        // Another subject has its own permits.
        assert!(
            futures::executor::block_on(store.acquire("u", &policy, LeaseId::generate()))
                .unwrap()
                .is_granted()
        );
        let id = first.lease().unwrap().id();
        assert!(futures::executor::block_on(store.renew("t", &policy, id))
            .unwrap()
            .is_some());
        assert!(futures::executor::block_on(store.release("t", &policy, id)).unwrap());
        assert!(!futures::executor::block_on(store.release("t", &policy, id)).unwrap());
        assert_eq!(
            futures::executor::block_on(store.renew("t", &policy, id)).unwrap(),
            None
        );
        let again =
            futures::executor::block_on(store.acquire("t", &policy, LeaseId::generate())).unwrap();
        assert!(again.is_granted(), "the released permit is free again");
        // Rate limits still go through the same box.
        let p = policies();
        assert!(store.check_now("t", &p, 1).unwrap().unwrap().is_allowed());
        assert!(format!("{store:?}").contains("MemoryStore"));
        assert!(format!("{store:?}").starts_with("BoxLeaseStore"));
    }

    #[test]
    fn a_lease_box_and_the_rates_only_box_made_from_it_share_one_state() {
        let leases = BoxLeaseStore::new(MemoryStore::new());
        let rates = BoxStore::from(leases.clone());
        let p = policies();
        let first = futures::executor::block_on(leases.check("t", &p, 1)).unwrap();
        let second = futures::executor::block_on(rates.check("t", &p, 1)).unwrap();
        assert_eq!(
            second.decisions()[0].remaining() + 1,
            first.decisions()[0].remaining()
        );
        assert!(format!("{rates:?}").starts_with("BoxStore"));
        assert!(format!("{rates:?}").contains("MemoryStore"));
    }
}
