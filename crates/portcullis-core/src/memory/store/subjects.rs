//! [`MemoryStore::check_subjects`]: one all-or-nothing check of several
//! subjects, one policy each (the descriptors of one request behind
//! Envoy's rate-limit service). The shards the subjects hash to are
//! write-locked in ascending order (so two such checks never wait on each
//! other in a cycle), every decision is computed, and states are written
//! only when all admit.

use std::sync::atomic::Ordering;
use std::sync::RwLockWriteGuard;

use smallvec::SmallVec;

use super::MemoryStore;
use crate::algorithms::Step;
use crate::memory::key::Key;
use crate::memory::table::{checked, Shard};
use crate::{validate_subjects, Policy, StoreError, Verdict};

impl MemoryStore {
    /// Checks several subjects, each against its own policy, in one atomic
    /// step: either every policy admits and each is charged `cost`, or none
    /// is charged (the decisions of those that would have admitted are
    /// then their peeks, as in a [`Store::check`](crate::Store::check) of
    /// several policies). The verdict holds one decision per pair, in
    /// order. A cost of 0 peeks.
    ///
    /// This is what a request limited on several keys at once needs (a
    /// user, an API route and a tenant, say): a denial by one charges
    /// none of the others.
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let user = Policy::per_minute(10).name("per-user").build()?;
    /// let route = Policy::per_minute(1).name("per-route").build()?;
    /// let first = store.check_subjects(&[("alice", &user), ("/search", &route)], 1)?;
    /// assert!(first.is_allowed());
    /// // The route is spent: the request is denied and alice is not charged.
    /// let second = store.check_subjects(&[("alice", &user), ("/search", &route)], 1)?;
    /// assert!(!second.is_allowed());
    /// assert_eq!(second.decisions()[0].remaining(), 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// **At the store's bound.** A subject the store does not hold needs
    /// room; when none can be made ([`WhenFull::Deny`](crate::WhenFull::Deny)
    /// at [`MemoryStoreBuilder::max_keys`](crate::MemoryStoreBuilder::max_keys))
    /// the check answers [`StoreError::Full`] and the subjects written
    /// before the one that found no room keep their charge: such a request
    /// is refused, so the store may charge more than it admitted, never
    /// admit more.
    ///
    /// # Errors
    ///
    /// As [`validate_subjects`](crate::validate_subjects) for a bad request
    /// (no pairs, one subject with one policy name twice, a cost above a
    /// capacity); [`StoreError::Full`] as above.
    pub fn check_subjects(
        &self,
        checks: &[(&str, &Policy)],
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        validate_subjects(checks, cost)?;
        let inner = &*self.inner;
        let keys: SmallVec<[Key<'_>; 4]> = checks.iter().map(|(s, _)| Key::new(s)).collect();
        let hashes: SmallVec<[u64; 4]> =
            keys.iter().map(|k| inner.hash_key(k.as_bytes())).collect();
        let mut order: SmallVec<[usize; 4]> =
            hashes.iter().map(|&hash| inner.shard_index(hash)).collect();
        order.sort_unstable();
        order.dedup();
        // Ascending shard order: every multi-shard check locks alike.
        let mut guards: SmallVec<[(usize, RwLockWriteGuard<'_, Shard>); 4]> = order
            .iter()
            .map(|&index| (index, inner.shards[index].write()))
            .collect();
        let shard_of = |guards: &mut SmallVec<[(usize, RwLockWriteGuard<'_, Shard>); 4]>,
                        hash: u64|
         -> usize {
            let index = inner.shard_index(hash);
            guards.iter().position(|(i, _)| *i == index).unwrap_or(0)
        };
        // The time under the locks (see `Shard::check_one`).
        let now = inner.clock.now_micros();
        for &hash in &hashes {
            let at = shard_of(&mut guards, hash);
            guards[at].1.demote_if_hot(hash);
        }
        let step_of = |shard: &Shard, key: &[u8], hash: u64, policy: &Policy, cost: u64| -> Step {
            let hot = shard.hot_tat.load(Ordering::Relaxed);
            let entry = shard
                .find(hash, key)
                .and_then(|index| shard.table.get_bucket(index));
            let live = entry.and_then(|entry| entry.live(&shard.names, policy, now, hot));
            checked(policy, live, now, cost)
        };
        let mut steps: SmallVec<[Step; 4]> = SmallVec::with_capacity(checks.len());
        for (i, (_, policy)) in checks.iter().enumerate() {
            let at = shard_of(&mut guards, hashes[i]);
            steps.push(step_of(
                &guards[at].1,
                keys[i].as_bytes(),
                hashes[i],
                policy,
                cost,
            ));
        }
        let all = steps.iter().all(|step| step.decision.is_allowed());
        if cost > 0 && !all {
            // Nothing is charged: the ones that would have admitted report
            // their state as it stays (a peek; a rescaled state is still
            // written back as a repair, as `Shard::check_many` does).
            for (i, (_, policy)) in checks.iter().enumerate() {
                if steps[i].decision.is_allowed() {
                    let at = shard_of(&mut guards, hashes[i]);
                    let shard = &guards[at].1;
                    let hot = shard.hot_tat.load(Ordering::Relaxed);
                    let key = keys[i].as_bytes();
                    let entry = shard
                        .find(hashes[i], key)
                        .and_then(|index| shard.table.get_bucket(index));
                    let live = entry.and_then(|entry| entry.live(&shard.names, policy, now, hot));
                    let repair = live
                        .as_ref()
                        .filter(|(_, rescaled)| *rescaled)
                        .map(|(state, _)| state.clone().into_owned());
                    let mut step = checked(policy, live, now, 0);
                    if step.new_state.is_none() {
                        step.new_state = repair;
                    }
                    steps[i] = step;
                }
            }
        }
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        let mut result = Ok(verdict);
        if cost > 0 {
            for (i, step) in steps.into_iter().enumerate() {
                if step.new_state.is_none() {
                    continue;
                }
                let at = shard_of(&mut guards, hashes[i]);
                let shard = &mut *guards[at].1;
                let key = keys[i].as_bytes();
                // Found again: an earlier write may have moved the table.
                let index = shard.find(hashes[i], key);
                let policy = checks[i].1;
                if let Err(error) = shard.write_steps(
                    inner,
                    hashes[i],
                    key,
                    index,
                    std::iter::once((policy, step)),
                    now,
                ) {
                    result = Err(error);
                    break;
                }
            }
        }
        for (_, shard) in &mut guards {
            shard.tick(inner, now);
        }
        result
    }
}
