//! The check behind [`Store::check`] and
//! [`MemoryStore::check_denial`]: one GCRA policy of a held subject
//! charged inline in the caller (`hot_path.rs`), everything else one call
//! out of line, under the shard's write lock or through the general
//! path.
//!
//! [`Store::check`]: crate::Store::check

use super::super::entry::Entry;
use super::super::key::Key;
use super::super::tat::{tat_denied, TatCharge};
use super::MemoryStore;
use crate::subject::MAX_PLAIN_SUBJECT_LEN;
use crate::{validate_check, Policy, StoreError, Verdict};

impl MemoryStore {
    /// [`Store::check`], answered in the call. The common case, one GCRA
    /// policy with a cost it can admit for a short subject the store holds,
    /// is written here to be inlined into the caller (the hash, the read
    /// lock, the compare-and-swap), so that a caller that never reads a
    /// figure of the decision does not compute it; everything else is one
    /// call out of line.
    ///
    /// [`Store::check`]: crate::Store::check
    #[inline(always)]
    pub(super) fn check_sync(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        if let [policy] = policies {
            // A GCRA policy and `1 <= cost <= capacity`: valid, and a
            // charge (a peek writes nothing and takes the general path).
            if cost.wrapping_sub(1) < policy.gcra_consts().charge_capacity
                && subject.len() <= MAX_PLAIN_SUBJECT_LEN
            {
                // Read before locking to keep the critical section short.
                // Two concurrent checks may then apply their times out of
                // order; every algorithm handles a time earlier than its
                // state's (it never admits more than it would have at the
                // later time).
                let now = self.inner.clock.now_micros();
                // A short subject is its own key.
                let key = subject.as_bytes();
                let hash = self.inner.hash_key(key);
                if let Some(decision) = self.charge_known_gcra(
                    key,
                    |e: &Entry| e.key.matches(key),
                    hash,
                    now,
                    policy,
                    cost,
                ) {
                    return Ok(Verdict::from_one(decision));
                }
                return self.check_one_locked(key, hash, now, policy, cost);
            }
        }
        self.check_general(subject, policies, cost)
    }

    /// A check that answers the verdict only when it denies: `Ok(None)`
    /// when every policy admitted (and charged) the request, `Ok(Some)`
    /// with the full verdict when one denied (nothing charged), the same
    /// errors as [`Store::check`].
    ///
    /// It charges exactly as [`Store::check`] does; only the figures of an
    /// admission (`remaining`, `reset_after`, a leaky bucket queue's
    /// `delay`) are not computed, which is what a caller that answers
    /// admitted requests without headers throws away. A GCRA charge of a
    /// held subject then costs the hash, the shard's read lock and one
    /// compare-and-swap, written to be inlined into the caller. Use
    /// [`Store::check`] when an admission's figures are wanted (headers on
    /// every response, a queue's delay). Generic code reaches it through
    /// [`Store::check_denial_now`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{ManualClock, MemoryStore, Policy};
    ///
    /// let clock = ManualClock::new(1_700_000_000_000_000);
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let policies = [Policy::per_second(1).name("api").build()?];
    ///
    /// assert!(store.check_denial("alice", &policies, 1)?.is_none());
    /// let denied = store.check_denial("alice", &policies, 1)?.expect("denied");
    /// assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Store::check`]: a bad request (no policies, duplicate names,
    /// a cost above a capacity) and a full store ([`StoreError::Full`]).
    ///
    /// [`Store::check`]: crate::Store::check
    /// [`Store::check_denial_now`]: crate::Store::check_denial_now
    #[inline]
    pub fn check_denial(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<Option<Verdict>, StoreError> {
        if let [policy] = policies
            && cost.wrapping_sub(1) < policy.gcra_consts().charge_capacity
            && subject.len() <= MAX_PLAIN_SUBJECT_LEN
        {
            let now = self.inner.clock.now_micros();
            let key = subject.as_bytes();
            let hash = self.inner.hash_key(key);
            return match self.charge_known_gcra_tat(
                key,
                |e: &Entry| e.key.matches(key),
                hash,
                now,
                policy,
                cost,
            ) {
                Some(TatCharge::Admitted(_)) => Ok(None),
                Some(TatCharge::Denied(packed)) => Ok(Some(Verdict::from_one(tat_denied(
                    policy, packed, now, cost,
                )))),
                None => self
                    .check_one_locked(key, hash, now, policy, cost)
                    .map(denial),
            };
        }
        self.check_general(subject, policies, cost).map(denial)
    }

    /// One policy under the shard's write lock: a new subject, a state
    /// the hot path does not take (or, with a cost it can admit, the hot
    /// path declined).
    #[inline(never)]
    fn check_one_locked(
        &self,
        key: &[u8],
        hash: u64,
        now: u64,
        policy: &Policy,
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        self.on_shard(hash, now, |shard, inner| {
            shard.check_one(inner, hash, key, policy, now, cost)
        })
        .map(Verdict::from_one)
    }

    /// Every check [`MemoryStore::check_sync`] does not answer inline:
    /// peeks, other algorithms, several policies, long subjects and bad
    /// requests.
    #[inline(never)]
    fn check_general(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        // A single policy with a cost it can admit is valid; anything else
        // goes through the shared validation (same errors as every store).
        let valid = matches!(policies, [policy] if cost <= policy.capacity());
        if !valid {
            validate_check(policies, cost)?;
        }
        let now = self.inner.clock.now_micros();
        // A short subject is its own key (no `Key` to build and match on).
        let hashed;
        let key = if subject.len() <= MAX_PLAIN_SUBJECT_LEN {
            subject.as_bytes()
        } else {
            hashed = Key::hashed(subject);
            &hashed[..]
        };
        let hash = self.inner.hash_key(key);
        // One policy, the common case, carries a `Decision` until the very
        // end rather than a `Verdict` (twice its size).
        if let [policy] = policies {
            // (A long subject's GCRA charge: the inline path took the rest.)
            if cost.wrapping_sub(1) < policy.gcra_consts().charge_capacity
                && let Some(decision) = self.charge_known_gcra(
                    key,
                    |e: &Entry| e.key.matches(key),
                    hash,
                    now,
                    policy,
                    cost,
                )
            {
                return Ok(Verdict::from_one(decision));
            }
            let decision = self.on_shard(hash, now, |shard, inner| {
                shard.check_one(inner, hash, key, policy, now, cost)
            });
            return decision.map(Verdict::from_one);
        }
        self.on_shard(hash, now, |shard, inner| {
            shard.check_many(inner, hash, key, policies, now, cost)
        })
    }
}

/// The verdict, when it denies.
fn denial(verdict: Verdict) -> Option<Verdict> {
    (!verdict.is_allowed()).then_some(verdict)
}
