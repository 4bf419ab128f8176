//! The [`LeaseStore`] impl of [`MemoryStore`], over the lease table in
//! `memory/lease.rs`, and how many subjects hold leases.

use std::future::{ready, Ready};

use super::MemoryStore;
use crate::{ConcurrencyPolicy, LeaseDecision, LeaseId, LeaseStore, StoreError};

impl MemoryStore {
    /// The number of (subject, concurrency policy) pairs holding leases,
    /// counting ones whose leases expired but were not swept yet; at most
    /// [`MemoryStore::max_keys`].
    ///
    /// ```
    /// use portcullis::{ConcurrencyPolicy, LeaseId, LeaseStore, MemoryStore};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let policy = ConcurrencyPolicy::max_in_flight(2).build()?;
    /// let lease = store.acquire("alice", &policy, LeaseId::generate()).await?.lease().unwrap();
    /// assert_eq!(store.lease_subjects(), 1);
    /// store.release("alice", &policy, lease.id()).await?;
    /// assert_eq!(store.lease_subjects(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn lease_subjects(&self) -> usize {
        self.inner.leases.len()
    }
}

impl LeaseStore for MemoryStore {
    type AcquireFuture = Ready<Result<LeaseDecision, StoreError>>;

    fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Self::AcquireFuture {
        let now = self.inner.clock.now_micros();
        ready(self.inner.leases.acquire(subject, policy, lease, now))
    }

    fn acquire_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<LeaseDecision, StoreError>> {
        Some(self.acquire(subject, policy, lease).into_inner())
    }

    fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<Option<u64>, StoreError>> + Send + 'static {
        let now = self.inner.clock.now_micros();
        ready(Ok(self.inner.leases.renew(subject, policy, lease, now)))
    }

    fn release_now(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Option<Result<bool, StoreError>> {
        let now = self.inner.clock.now_micros();
        Some(Ok(self.inner.leases.release(subject, policy, lease, now)))
    }

    fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl std::future::Future<Output = Result<bool, StoreError>> + Send + 'static {
        ready(
            self.release_now(subject, policy, lease)
                .unwrap_or(Ok(false)),
        )
    }
}
