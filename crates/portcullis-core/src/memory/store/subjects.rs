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
    /// room, made as for [`Store::check`](crate::Store::check) (sweeping,
    /// or evicting per [`WhenFull`](crate::WhenFull)); when none can be
    /// made the check answers [`StoreError::Full`] and charges nothing.
    ///
    /// # Errors
    ///
    /// As [`validate_subjects`] for a bad request
    /// (no pairs, one subject with one policy name twice, a cost above a
    /// capacity); [`StoreError::Full`] as above.
    pub fn check_subjects(
        &self,
        checks: &[(&str, &Policy)],
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        validate_subjects(checks, cost)?;
        let now = self.inner.clock.now_micros();
        let first = self.subjects_once(checks, cost);
        if !matches!(first, Err(StoreError::Full { .. })) {
            return first;
        }
        // Nothing was written: free room in every shard, then try again.
        self.make_room(now, first, || self.subjects_once(checks, cost))
    }

    /// One attempt of [`MemoryStore::check_subjects`]: all or nothing,
    /// [`StoreError::Full`] (nothing written) when a new subject finds no
    /// room in its shard.
    fn subjects_once(&self, checks: &[(&str, &Policy)], cost: u64) -> Result<Verdict, StoreError> {
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
            // Subjects the store does not hold first: inserting one is the
            // only write that can fail (no room), and then the ones
            // inserted before it are removed again, so nothing is written.
            let mut done: SmallVec<[bool; 4]> = SmallVec::from_elem(false, checks.len());
            let mut inserted: SmallVec<[usize; 4]> = SmallVec::new();
            for (i, step) in steps.iter_mut().enumerate() {
                let at = shard_of(&mut guards, hashes[i]);
                let shard = &mut *guards[at].1;
                let key = keys[i].as_bytes();
                if step.new_state.is_none() || shard.find(hashes[i], key).is_some() {
                    continue;
                }
                done[i] = true;
                let step = Step {
                    decision: step.decision,
                    new_state: step.new_state.take(),
                    expires_at_us: step.expires_at_us,
                };
                let written = shard.write_steps(
                    inner,
                    hashes[i],
                    key,
                    None,
                    std::iter::once((checks[i].1, step)),
                    now,
                );
                if let Err(error) = written {
                    for &j in &inserted {
                        let at = shard_of(&mut guards, hashes[j]);
                        let key = keys[j].as_bytes();
                        if let Ok(entry) = guards[at]
                            .1
                            .table
                            .find_entry(hashes[j], |e| e.key.matches(key))
                        {
                            entry.remove();
                            inner.forget(1);
                        }
                    }
                    result = Err(error);
                    break;
                }
                inserted.push(i);
            }
            if result.is_ok() {
                for (i, step) in steps.into_iter().enumerate() {
                    if done[i] || step.new_state.is_none() {
                        continue;
                    }
                    let at = shard_of(&mut guards, hashes[i]);
                    let shard = &mut *guards[at].1;
                    let key = keys[i].as_bytes();
                    // Found again: an insert may have moved the table.
                    let index = shard.find(hashes[i], key);
                    // A held subject's write never fails (only an insert
                    // can find no room).
                    if let Err(error) = shard.write_steps(
                        inner,
                        hashes[i],
                        key,
                        index,
                        std::iter::once((checks[i].1, step)),
                        now,
                    ) {
                        result = Err(error);
                        break;
                    }
                }
            }
        }
        for (_, shard) in &mut guards {
            shard.tick(inner, now);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use crate::{ManualClock, MemoryStore, Policy, StoreError, WhenFull};

    #[test]
    fn a_denial_charges_none_and_a_full_store_writes_nothing() {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder()
            .clock(clock)
            .max_keys(2)
            .when_full(WhenFull::Deny)
            .build();
        let a = Policy::per_minute(5).name("a").build().unwrap();
        let b = Policy::per_minute(1).name("b").build().unwrap();
        assert!(store
            .check_subjects(&[("x", &a), ("y", &b)], 1)
            .unwrap()
            .is_allowed());
        let denied = store.check_subjects(&[("x", &a), ("y", &b)], 1).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.decisions()[0].remaining(), 4, "x was not charged");
        // Two subjects held, the bound is two: a new one finds no room, and
        // the held one beside it is not charged.
        let full = store.check_subjects(&[("x", &a), ("z", &a)], 1);
        assert!(matches!(full, Err(StoreError::Full { .. })), "{full:?}");
        assert_eq!(store.len(), 2);
        let x = store.check_subjects(&[("x", &a)], 0).unwrap();
        assert_eq!(x.decisions()[0].remaining(), 4);
        assert!(store.check_subjects(&[], 1).is_err());
        assert!(matches!(
            store.check_subjects(&[("x", &a), ("x", &a)], 1),
            Err(StoreError::DuplicatePolicy { .. })
        ));
    }

    #[test]
    fn concurrent_checks_over_many_shards_admit_exactly_the_limit() {
        let store = MemoryStore::new();
        let shared = Policy::per_minute(100).name("shared").build().unwrap();
        let own = Policy::per_minute(1_000).name("own").build().unwrap();
        let admitted: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let (store, shared, own) = (&store, &shared, &own);
                    scope.spawn(move || {
                        (0..100)
                            .filter(|i| {
                                let mine = format!("t{t}-{}", i % 7);
                                let other = format!("t{}-{}", (t + 1) % 4, i % 5);
                                store
                                    .check_subjects(
                                        &[(&mine, own), ("global", shared), (&other, own)],
                                        1,
                                    )
                                    .unwrap()
                                    .is_allowed()
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
    }
}
