//! The `Store` trait every backend implements.

use std::future::Future;

use crate::{CheckOptions, Checked, Policy, StoreError, Verdict};

/// Where rate-limit state lives: process memory ([`MemoryStore`]) or Redis
/// (`portcullis-redis`).
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
/// use portcullis::{MemoryStore, Policy, Store};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
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

    /// [`Store::check_now`] for a caller that reads a verdict only when it
    /// denies: `Some(Ok(None))` when every policy admitted (and charged)
    /// the request, `Some(Ok(Some(verdict)))` when one denied, `None` when
    /// the store cannot answer synchronously (nothing was done).
    ///
    /// It charges exactly as [`Store::check_now`]; a store may skip
    /// computing an admission's figures (`remaining`, `reset_after`, a
    /// queue's `delay`), which the answer does not carry. The default maps
    /// [`Store::check_now`]; the [`MemoryStore`](crate::MemoryStore)
    /// answers through [`MemoryStore::check_denial`](crate::MemoryStore::check_denial).
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy, Store};
    ///
    /// let store = MemoryStore::new();
    /// let policies = [Policy::per_minute(1).build()?];
    /// assert!(matches!(store.check_denial_now("alice", &policies, 1), Some(Ok(None))));
    /// assert!(matches!(store.check_denial_now("alice", &policies, 1), Some(Ok(Some(_)))));
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    fn check_denial_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Option<Verdict>, StoreError>> {
        self.check_now(subject, policies, cost)
            .map(|result| result.map(|verdict| (!verdict.is_allowed()).then_some(verdict)))
    }

    /// Reports the state of `policies` for `subject` without changing it
    /// (a check with cost 0).
    fn peek(&self, subject: &str, policies: &[Policy]) -> Self::CheckFuture {
        self.check(subject, policies, 0)
    }

    /// Charges `cost` permits to every policy of `subject` **after the
    /// fact** ("post-charging"): never denied, it may take the subject past
    /// its limit into a debt, paid back by waiting, of at most one full
    /// capacity beyond empty (so one charge locks a subject out for at most
    /// the policy's full reset plus one emission interval; see
    /// ALGORITHMS.md, "Charging after the response"). For costs known only once a request
    /// has run: the tokens a response used, a failed login.
    ///
    /// Returns the state after the charge as a peek reports it: allowed
    /// when a cost-1 request would be admitted now, with `remaining`,
    /// `retry_after` and `reset_after`. A cost of 0 changes nothing. One
    /// call is one atomic step for all the policies.
    ///
    /// Supported for [`Algorithm::Gcra`](crate::Algorithm::Gcra) and
    /// [`Algorithm::TokenBucket`](crate::Algorithm::TokenBucket) policies
    /// ([`validate_charge`](crate::validate_charge)). The default implementation answers
    /// [`StoreError::Unsupported`]: a store opts in by overriding it
    /// ([`MemoryStore`](crate::MemoryStore) and `RedisStore` do).
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let policies = [Policy::per_minute(5).name("failed-logins").build()?];
    /// let after = store.charge("203.0.113.7/alice", &policies, 5).await?;
    /// assert!(!after.is_allowed());
    /// assert!(!store.peek("203.0.113.7/alice", &policies).await?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] for a store or an algorithm without
    /// post-charging; [`StoreError::NoPolicies`] and
    /// [`StoreError::DuplicatePolicy`] as [`Store::check`]; backend errors
    /// otherwise. (A cost above the capacity is no error: it charges up to
    /// the debt bound.)
    fn charge(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send + 'static {
        let _ = (subject, policies, cost);
        std::future::ready(Err(StoreError::Unsupported {
            operation: "charge",
            detail: format!(
                "the store {} does not support charging after the fact; use MemoryStore or RedisStore, or implement Store::charge",
                std::any::type_name::<Self>()
            ),
        }))
    }

    /// [`Store::check`] with [`CheckOptions`]: an idempotency key (a repeat
    /// within its window answers the first decision and charges nothing)
    /// and a priority class (each policy's class reserve must remain after
    /// the charge). The record lookup, the class thresholds, the check and
    /// the record's write are one atomic step.
    ///
    /// With empty options it is [`Store::check`]. The default
    /// implementation answers [`StoreError::Unsupported`] for any other
    /// options: [`MemoryStore`](crate::MemoryStore) and `RedisStore`
    /// implement it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{CheckOptions, MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let policies = [Policy::per_minute(1).name("exports").build()?];
    /// let once = CheckOptions::new().idempotency_key("export-42", Duration::from_secs(60));
    /// assert!(store.check_with("acme", &policies, 1, &once).await?.verdict().is_allowed());
    /// // The retry is answered as the first attempt was, not denied.
    /// let retry = store.check_with("acme", &policies, 1, &once).await?;
    /// assert!(retry.is_replay() && retry.verdict().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Store::check`]; [`StoreError::Unsupported`] or
    /// [`StoreError::CostTooHigh`] for options these policies cannot apply
    /// (`portcullis::store::plan` lists them).
    fn check_with(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &CheckOptions,
    ) -> impl Future<Output = Result<Checked, StoreError>> + Send + 'static {
        let plain = if options.is_empty() {
            Ok(self.check(subject, policies, cost))
        } else {
            Err(StoreError::Unsupported {
                operation: "check_with",
                detail: format!(
                    "the store {} has no idempotency keys or priority classes; use MemoryStore or RedisStore, or implement Store::check_with",
                    std::any::type_name::<Self>()
                ),
            })
        };
        async move { Ok(Checked::new(plain?.await?, false)) }
    }

    /// Forgets the state of `policies` for `subject`: its next check sees
    /// full capacity.
    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static;
}
