//! The `Store` trait every backend implements.

use std::future::Future;

use crate::{Policy, StoreError, Verdict};

/// Where rate-limit state lives: process memory ([`MemoryStore`]) or Redis
/// (`tollgate-redis`).
///
/// Every method takes the subject (who is limited: a user id, an IP, a token
/// hash) and the policies to apply to it. One call is one atomic step: the
/// policies are checked together and either all admit and are all charged,
/// or none is charged.
///
/// The check future is an associated type so middleware can name it without
/// boxing; a store that answers synchronously uses
/// [`std::future::Ready`] and also answers through [`Store::check_now`].
/// [`BoxStore`](crate::BoxStore) holds any store behind one type.
///
/// [`MemoryStore`]: crate::MemoryStore
///
/// ```
/// use tollgate_core::{MemoryStore, Policy, Store};
///
/// # futures::executor::block_on(async {
/// let store = MemoryStore::new();
/// let policies = [Policy::per_second(2).name("api").build()?];
/// assert!(store.check("alice", &policies, 1).await?.is_allowed());
/// assert!(store.check("alice", &policies, 1).await?.is_allowed());
/// assert!(!store.check("alice", &policies, 1).await?.is_allowed());
/// assert!(store.check("bob", &policies, 1).await?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub trait Store: Send + Sync + 'static {
    /// The future returned by [`Store::check`].
    type CheckFuture: Future<Output = Result<Verdict, StoreError>> + Send + 'static;

    /// Checks `policies` for `subject` and charges `cost` permits to each if
    /// all admit. A cost of 0 is a peek: it reports the current state (is a
    /// cost-1 request admitted now? how many remain?) and changes nothing.
    ///
    /// When one policy denies, none is charged, and the decisions of the
    /// policies that would have admitted are their peeks: allowed, with
    /// `remaining` and `reset_after` as their state stays.
    ///
    /// # Errors
    ///
    /// [`StoreError::NoPolicies`], [`StoreError::DuplicatePolicy`],
    /// [`StoreError::CostTooHigh`] for bad requests; backend errors
    /// ([`StoreError::is_backend`]) otherwise.
    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture;

    /// Answers a check at once when the store can, without a future:
    /// `Some(result)` is exactly what [`Store::check`] would have answered
    /// (and has charged the permits); `None` means the store cannot answer
    /// synchronously and nothing was done, so the caller uses
    /// [`Store::check`].
    ///
    /// This is how middleware recognises a synchronous store (the
    /// [`MemoryStore`](crate::MemoryStore) answers here; a network store
    /// keeps the default `None`): a request decided now skips the waiting
    /// future, and a [`BoxStore`](crate::BoxStore) needs no allocation.
    /// Implement it only if it never blocks on I/O.
    fn check_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        let _ = (subject, policies, cost);
        None
    }

    /// Reports the state of `policies` for `subject` without changing it
    /// (a check with cost 0).
    fn peek(&self, subject: &str, policies: &[Policy]) -> Self::CheckFuture {
        self.check(subject, policies, 0)
    }

    /// Forgets the state of `policies` for `subject`: its next check sees
    /// full capacity.
    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static;
}

/// Validates the request part every store must refuse the same way: no
/// policies, duplicate names, a cost above a policy's capacity.
///
/// # Errors
///
/// As [`Store::check`] documents for bad requests.
pub fn validate_check(policies: &[Policy], cost: u64) -> Result<(), StoreError> {
    if policies.is_empty() {
        return Err(StoreError::NoPolicies);
    }
    for (i, policy) in policies.iter().enumerate() {
        if cost > policy.capacity() {
            return Err(StoreError::CostTooHigh {
                policy: policy.name().to_owned(),
                cost,
                capacity: policy.capacity(),
            });
        }
        if policies[..i].iter().any(|p| p.name() == policy.name()) {
            return Err(StoreError::DuplicatePolicy {
                name: policy.name().to_owned(),
            });
        }
    }
    Ok(())
}
