//! `MemoryStore`'s checks with options ([`Store::check_with`](crate::Store::check_with)):
//! idempotency records and priority classes, in one critical section under
//! the subject's shard write lock (the general path), and the shard's
//! bounded table of records ([`Records`]).
//!
//! A record is keyed by the SHA-256 of the subject's key and the record id
//! ([`Record::id`](crate::Record::id)), and holds the first decision until
//! its window ends. Records live in the subject's shard, so the lookup, the
//! check and the write are one step. Each shard holds at most its share of
//! the store's bound ([`MemoryStore::max_keys`] divided by the shards, at
//! least 16): when full, expired records are swept, then
//! ([`WhenFull::EvictNearestFull`]) the sampled record nearest its end is
//! dropped (a retry of that key would be charged again: never more
//! admitted, at worst one extra charge), or ([`WhenFull::Deny`]) the check
//! is refused with [`StoreError::Full`], nothing charged.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use super::fast::check_policy;
use super::table::{Key, Shard};
use super::{Inner, MemoryStore, WhenFull};
use crate::algorithms::Step;
use crate::classes::check_class;
use crate::{CheckOptions, CheckPlan, Checked, Policy, StoreError, Verdict};

/// Records a shard compares when it must drop one.
const RECORD_SAMPLE: usize = 16;
/// Fewest records a shard may hold, whatever the bound.
const MIN_RECORDS_PER_SHARD: usize = 16;

/// One shard's idempotency records.
#[derive(Default)]
pub(super) struct Records {
    map: HashMap<[u8; 32], (u64, Verdict)>,
    /// Sweep expired records when the map reaches this length.
    sweep_at: usize,
}

impl Records {
    /// The live record `id`, if any.
    fn get(&self, id: &[u8; 32], now: u64) -> Option<&Verdict> {
        self.map
            .get(id)
            .filter(|(expires_at_us, _)| *expires_at_us > now)
            .map(|(_, verdict)| verdict)
    }

    /// Makes room for one more record, per the bound; `false` when the
    /// store denies rather than evicts and nothing has expired.
    fn make_room(&mut self, inner: &Inner, now: u64) -> bool {
        let share = inner
            .max_keys
            .map(|max| (max / inner.shards.len()).max(MIN_RECORDS_PER_SHARD));
        let len = self.map.len();
        if len >= self.sweep_at.max(64) || share.is_some_and(|share| len >= share) {
            self.map
                .retain(|_, (expires_at_us, _)| *expires_at_us > now);
            // Amortized: the next sweep after as many inserts again.
            self.sweep_at = self.map.len() * 2;
        }
        let Some(share) = share else {
            return true;
        };
        if self.map.len() < share {
            return true;
        }
        if inner.when_full == WhenFull::Deny {
            return false;
        }
        let nearest = self
            .map
            .iter()
            .take(RECORD_SAMPLE)
            .min_by_key(|(_, (expires_at_us, _))| *expires_at_us)
            .map(|(id, _)| *id);
        if let Some(id) = nearest {
            self.map.remove(&id);
        }
        true
    }

    /// Records held (live or expired but not yet swept).
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}

impl MemoryStore {
    /// [`Store::check_with`](crate::Store::check_with), answered at once.
    pub(super) fn check_with_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &CheckOptions,
    ) -> Result<Checked, StoreError> {
        let plan = options.plan(policies, cost)?;
        let key = Key::new(subject);
        let key = key.as_bytes();
        let record = plan.record().map(|record| {
            let mut hasher = Sha256::new();
            hasher.update(key);
            // Never a byte of a plain key, and a hashed key has a fixed length.
            hasher.update([0xFF]);
            hasher.update(record.id().as_bytes());
            let id: [u8; 32] = hasher.finalize().into();
            (id, record.window_micros())
        });
        let hash = self.inner.hash_key(key);
        let now = self.inner.clock.now_micros();
        self.on_shard(hash, now, |shard, inner| {
            shard.check_with(inner, hash, key, policies, now, cost, &plan, record)
        })
    }

    /// Idempotency records held in all shards (live or expired but not yet
    /// swept): at most [`MemoryStore::max_keys`] in all, or 16 per shard
    /// when that is more.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{CheckOptions, MemoryStore, Policy, Store};
    ///
    /// # futures::executor::block_on(async {
    /// let store = MemoryStore::new();
    /// let policies = [Policy::per_second(5).build()?];
    /// let options = CheckOptions::new().idempotency_key("k1", Duration::from_secs(60));
    /// store.check_with("alice", &policies, 1, &options).await?;
    /// assert_eq!(store.idempotency_records(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn idempotency_records(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| shard.read().records.len())
            .sum()
    }
}

impl Shard {
    /// The check with a plan: the record first (a live one answers at
    /// once), then every policy with its class reserve, written only if
    /// all admit, then the record.
    #[allow(clippy::too_many_arguments)]
    fn check_with(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policies: &[Policy],
        now: u64,
        cost: u64,
        plan: &CheckPlan,
        record: Option<([u8; 32], u64)>,
    ) -> Result<Checked, StoreError> {
        // The time again, under the lock (as `check_many`).
        let now = now.max(inner.clock.now_micros());
        if let Some((id, _)) = &record {
            if let Some(verdict) = self.records.get(id, now) {
                return Ok(Checked::new(verdict.clone(), true));
            }
            // Room first: a refusal must charge nothing.
            if !self.records.make_room(inner, now) {
                return Err(StoreError::Full {
                    max_keys: inner.max_keys.unwrap_or(usize::MAX),
                    retry_after: std::time::Duration::ZERO,
                });
            }
        }
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(std::sync::atomic::Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let state_of = |policy: &Policy| {
            entry.and_then(|entry| entry.live_state(names, policy.shared_name(), now, hot))
        };
        let mut steps: SmallVec<[Step; 2]> = policies
            .iter()
            .zip(plan.reserves())
            .map(|(policy, reserve)| {
                let state = state_of(policy);
                check_class(policy, state.as_deref(), now, cost, *reserve, check_policy)
            })
            .collect();
        if cost > 0 && steps.iter().any(|step| !step.decision.is_allowed()) {
            // Nothing is charged: the policies that would have admitted
            // report their state as a peek of their class does.
            for ((policy, reserve), step) in
                policies.iter().zip(plan.reserves()).zip(steps.iter_mut())
            {
                if step.decision.is_allowed() {
                    let state = state_of(policy);
                    *step = check_class(policy, state.as_deref(), now, 0, *reserve, check_policy);
                }
            }
        }
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        let write = cost > 0 && steps.iter().any(|step| step.new_state.is_some());
        if write {
            self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        }
        self.tick(inner, now);
        if let Some((id, window_us)) = record {
            self.records
                .map
                .insert(id, (now.saturating_add(window_us), verdict.clone()));
        }
        Ok(Checked::new(verdict, false))
    }
}
