//! `BoxStore`: any [`Store`] behind one type, chosen at run time (memory or
//! Redis from configuration), and the object-safe [`DynStore`] it holds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{Policy, Store, StoreError, Verdict};

/// The check future of a [`BoxStore`]: the wrapped store's future, boxed.
pub type BoxCheckFuture = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send>>;

/// The reset future of a [`BoxStore`].
pub type BoxResetFuture = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// The object-safe face of a [`Store`]: every store is one (a blanket
/// implementation), so `dyn DynStore` can hold any of them. Use it through
/// [`BoxStore`].
pub trait DynStore: Send + Sync + 'static {
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

    /// [`Store::reset`], its future boxed.
    fn reset_boxed(&self, subject: &str, policies: &[Policy]) -> BoxResetFuture;

    /// The wrapped store's type name, for `Debug`.
    fn type_name(&self) -> &'static str;
}

impl<S: Store> DynStore for S {
    fn check_boxed(&self, subject: &str, policies: &[Policy], cost: u64) -> BoxCheckFuture {
        Box::pin(self.check(subject, policies, cost))
    }

    fn check_now_dyn(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        self.check_now(subject, policies, cost)
    }

    fn charge_boxed(&self, subject: &str, policies: &[Policy], cost: u64) -> BoxCheckFuture {
        Box::pin(self.charge(subject, policies, cost))
    }

    fn reset_boxed(&self, subject: &str, policies: &[Policy]) -> BoxResetFuture {
        Box::pin(self.reset(subject, policies))
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<S>()
    }
}

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
/// [`MemoryStore`]: crate::MemoryStore
///
/// ```
/// use tollgate_core::{BoxStore, MemoryStore, Policy, Store};
///
/// # futures::executor::block_on(async {
/// // In an application: `match std::env::var("REDIS_URL") { Ok(url) =>
/// // BoxStore::new(RedisStore::connect(&url).await?), Err(_) => ... }`.
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
    /// Boxes `store` (to share a `BoxStore`, clone it rather than box it
    /// again).
    #[must_use]
    pub fn new<S: Store>(store: S) -> Self {
        Self {
            inner: Arc::new(store),
        }
    }

    /// Boxes a store that is already shared.
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

impl Store for BoxStore {
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

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.inner.reset_boxed(subject, policies)
    }
}

#[cfg(test)]
mod tests {
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
}
