//! The object-safe face of a store that a box holds ([`DynStore`], private
//! to the crate): every store is one by a blanket implementation, and a
//! store boxed with its leases is one through [`WithLeases`]; and the
//! boxed futures its methods return.

use std::future::Future;
use std::pin::Pin;

use crate::{
    CheckOptions, Checked, ConcurrencyPolicy, LeaseDecision, LeaseId, LeaseStore, Policy, Store,
    StoreError, Verdict,
};

/// The future of [`Store::check_with`] on a box.
type BoxCheckWithFuture = Pin<Box<dyn Future<Output = Result<Checked, StoreError>> + Send>>;

/// The check future of a [`BoxStore`](crate::BoxStore): the wrapped store's future, boxed.
pub type BoxCheckFuture = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send>>;

/// The reset future of a [`BoxStore`](crate::BoxStore).
pub type BoxResetFuture = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// The acquire future of a [`BoxStore`](crate::BoxStore) ([`LeaseStore::acquire`]).
pub type BoxAcquireFuture = Pin<Box<dyn Future<Output = Result<LeaseDecision, StoreError>> + Send>>;

/// The renew future of a [`BoxStore`](crate::BoxStore) ([`LeaseStore::renew`]).
pub type BoxRenewFuture = Pin<Box<dyn Future<Output = Result<Option<u64>, StoreError>> + Send>>;

/// The release future of a [`BoxStore`](crate::BoxStore) ([`LeaseStore::release`]).
pub type BoxReleaseFuture = Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send>>;

/// The object-safe face of a [`Store`], and optionally of its
/// [`LeaseStore`]: every store is one (a blanket implementation), so
/// `dyn DynStore` can hold any of them. Use it through [`BoxStore`](crate::BoxStore).
///
/// The lease methods have defaults that answer
/// [`StoreError::Unsupported`]: the blanket implementation cannot tell
/// whether a store also implements [`LeaseStore`], so it keeps the
/// defaults (unreachable: only a [`BoxLeaseStore`](crate::BoxLeaseStore) exposes lease calls, and
/// it always wraps the store in a private type that forwards them).
//
// Why one trait with lease methods rather than a second `DynLeaseStore`
// trait: a `BoxStore` stays one `Arc` to one vtable, and its check path is
// exactly what it was (one virtual call, no branch on "which kind of box",
// no second pointer, no upcast), which the dhat test
// (`portcullis-tower/tests/boxed_allocations.rs`) holds. A second trait
// would need either two `Arc`s or an enum matched on every check.
pub(super) trait DynStore: Send + Sync + 'static {
    /// [`Store::check`], its future boxed.
    fn check_boxed(&self, subject: &str, policies: &[Policy], cost: u64) -> BoxCheckFuture;

    /// [`Store::check_now`], unchanged: no allocation.
    fn check_now_dyn(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>>;

    /// [`Store::charge`], its future boxed.
    fn charge_boxed(&self, subject: &str, policies: &[Policy], cost: u64) -> BoxCheckFuture;

    /// [`Store::check_with`], its future boxed.
    fn check_with_boxed(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &CheckOptions,
    ) -> BoxCheckWithFuture;

    /// [`Store::reset`], its future boxed.
    fn reset_boxed(&self, subject: &str, policies: &[Policy]) -> BoxResetFuture;

    /// The wrapped store's type name, for `Debug`.
    fn type_name(&self) -> &'static str;

    /// [`LeaseStore::acquire`], its future boxed. By default
    /// [`StoreError::Unsupported`].
    fn acquire_boxed(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> BoxAcquireFuture {
        let _ = (subject, policy, lease);
        Box::pin(std::future::ready(Err(no_leases(
            "acquire",
            self.type_name(),
        ))))
    }

    /// [`LeaseStore::acquire_now`], unchanged: no allocation. By default
    /// [`StoreError::Unsupported`], answered at once.
    fn acquire_now_dyn(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<LeaseDecision, StoreError>> {
        let _ = (subject, policy, lease);
        Some(Err(no_leases("acquire", self.type_name())))
    }

    /// [`LeaseStore::renew`], its future boxed. By default
    /// [`StoreError::Unsupported`].
    fn renew_boxed(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> BoxRenewFuture {
        let _ = (subject, policy, lease);
        Box::pin(std::future::ready(Err(no_leases(
            "renew",
            self.type_name(),
        ))))
    }

    /// [`LeaseStore::release_now`]. By default
    /// [`StoreError::Unsupported`], at once.
    fn release_now_dyn(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<bool, StoreError>> {
        let _ = (subject, policy, lease);
        Some(Err(no_leases("release", self.type_name())))
    }

    /// [`LeaseStore::release`], its future boxed. By default
    /// [`StoreError::Unsupported`].
    fn release_boxed(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> BoxReleaseFuture {
        let _ = (subject, policy, lease);
        Box::pin(std::future::ready(Err(no_leases(
            "release",
            self.type_name(),
        ))))
    }
}

/// The error of a lease call on a store boxed without its leases.
fn no_leases(operation: &'static str, store: &str) -> StoreError {
    StoreError::Unsupported {
        operation,
        detail: format!(
            "the store {store} was boxed without concurrency leases: box it with \
             BoxLeaseStore::new(store) (MemoryStore and RedisStore hold leases)"
        ),
    }
}

/// The rate-limit methods of [`DynStore`], forwarded to the store that
/// `|$store| $inner` reaches (the same for a bare store and one boxed with
/// its leases).
macro_rules! forward_rates {
    ($ty:ty, |$store:ident| $inner:expr_2021) => {
        fn check_boxed(&self, subject: &str, policies: &[Policy], cost: u64) -> BoxCheckFuture {
            let $store = self;
            Box::pin($inner.check(subject, policies, cost))
        }

        fn check_now_dyn(
            &self,
            subject: &str,
            policies: &[Policy],
            cost: u64,
        ) -> Option<Result<Verdict, StoreError>> {
            let $store = self;
            $inner.check_now(subject, policies, cost)
        }

        fn charge_boxed(&self, subject: &str, policies: &[Policy], cost: u64) -> BoxCheckFuture {
            let $store = self;
            Box::pin($inner.charge(subject, policies, cost))
        }

        fn check_with_boxed(
            &self,
            subject: &str,
            policies: &[Policy],
            cost: u64,
            options: &CheckOptions,
        ) -> BoxCheckWithFuture {
            let $store = self;
            Box::pin($inner.check_with(subject, policies, cost, options))
        }

        fn reset_boxed(&self, subject: &str, policies: &[Policy]) -> BoxResetFuture {
            let $store = self;
            Box::pin($inner.reset(subject, policies))
        }

        fn type_name(&self) -> &'static str {
            std::any::type_name::<$ty>()
        }
    };
}

impl<S: Store> DynStore for S {
    forward_rates!(S, |store| store);
}

/// A store boxed with its leases ([`BoxLeaseStore::new`](crate::BoxLeaseStore::new)): forwards
/// every method of [`DynStore`], the lease methods included. It does not
/// implement [`Store`] itself, so the blanket implementation above does
/// not cover it.
pub(super) struct WithLeases<S>(pub(super) S);

impl<S: Store + LeaseStore> DynStore for WithLeases<S> {
    forward_rates!(S, |store| store.0);

    fn acquire_boxed(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> BoxAcquireFuture {
        Box::pin(self.0.acquire(subject, policy, lease))
    }

    fn acquire_now_dyn(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<LeaseDecision, StoreError>> {
        self.0.acquire_now(subject, policy, lease)
    }

    fn renew_boxed(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> BoxRenewFuture {
        Box::pin(self.0.renew(subject, policy, lease))
    }

    fn release_now_dyn(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<bool, StoreError>> {
        self.0.release_now(subject, policy, lease)
    }

    fn release_boxed(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> BoxReleaseFuture {
        Box::pin(self.0.release(subject, policy, lease))
    }
}
