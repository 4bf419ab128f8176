//! [`RedisStore::check_subjects`]: one all-or-nothing check of several
//! subjects, one policy each, as ONE call of the general check script
//! (check.lua decides its key list all or nothing, whatever subjects the
//! keys belong to). On Redis Cluster every key of one call must share a
//! hash slot, so the subjects must be equal there (the key's hash tag is
//! the subject); a check whose subjects differ is refused, never split.

use std::future::Future;
use std::sync::Arc;

use portcullis_core::{validate_subjects, Policy, StoreError, Verdict};

use super::RedisStore;
use crate::call::{Call, Kind, PolicySet, Target};
use crate::scripts::Serving;

impl RedisStore {
    /// Checks several subjects, each against its own policy, in one atomic
    /// step: one script call that charges `cost` to every policy if all
    /// admit, and none otherwise (the decisions of those that would have
    /// admitted are then their peeks). The verdict holds one decision per
    /// pair, in order; a cost of 0 peeks. It takes neither the local budget
    /// nor coalescing: every call goes to Redis as it is.
    ///
    /// The keys are the ones [`Store::check`](portcullis_core::Store::check)
    /// uses (`<prefix>:{<subject>}:<policy>`), so a subject checked here
    /// and through `check` shares one state.
    ///
    /// **Redis Cluster.** One call reaches one node, so its keys must share
    /// a hash slot: on a Cluster every pair must name the same subject
    /// (several policies of one subject), or the check is refused with
    /// [`StoreError::Unsupported`] (nothing is charged). Standalone and
    /// Sentinel-managed servers take any subjects.
    ///
    /// ```
    /// use portcullis::redis::RedisStore;
    /// use portcullis::{Policy, StoreError};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = RedisStore::builder().url("redis://127.0.0.1").lazy_connect(true).build().await?;
    /// let user = Policy::per_minute(10).name("per-user").build()?;
    /// let route = Policy::per_minute(100).name("per-route").build()?;
    /// // One call decides both: store.check_subjects(&[("alice", &user), ("/search", &route)], 1)
    /// // A bad request is refused before anything is sent:
    /// let twice = store.check_subjects(&[("alice", &user), ("alice", &user)], 1).await;
    /// assert!(matches!(twice, Err(StoreError::DuplicatePolicy { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`validate_subjects`] for a
    /// bad request; [`StoreError::Unsupported`] for subjects that differ on
    /// a Cluster; backend errors as [`Store::check`](portcullis_core::Store::check).
    pub fn check_subjects(
        &self,
        checks: &[(&str, &Policy)],
        cost: u64,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send + 'static {
        let call = self.subjects_call(checks, cost);
        let caller = Arc::clone(&self.inner.caller);
        async move { call?.verdict(&caller).await }
    }

    fn subjects_call(&self, checks: &[(&str, &Policy)], cost: u64) -> Result<Call, StoreError> {
        validate_subjects(checks, cost)?;
        let caller = &self.inner.caller;
        let encoded: Vec<_> = checks.iter().map(|(s, _)| self.subject(s)).collect();
        if caller.pool.is_cluster() && encoded.iter().any(|e| *e != encoded[0]) {
            return Err(StoreError::Unsupported {
                operation: "check_subjects",
                detail: "on Redis Cluster one atomic check reaches one node, so every pair must \
                         name the same subject: check different subjects separately, or use a \
                         standalone or Sentinel-managed server"
                    .to_owned(),
            });
        }
        let policies: Vec<Policy> = checks.iter().map(|(_, p)| (*p).clone()).collect();
        let mut target = Target::new(PolicySet::new(&policies, Serving::General), &policies);
        for (encoded, policy) in encoded.iter().zip(&policies) {
            target.push_key(&caller.keys.parts(encoded, policy.name()));
        }
        let path = caller.scripts.path().choose(&encoded[0]);
        Call::new(caller, path, Kind::Check, Arc::new(target), cost)
    }
}
