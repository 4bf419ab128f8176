//! `MemoryStore`'s checks with options ([`Store::check_with`](crate::Store::check_with)):
//! idempotency records and priority classes, in one critical section under
//! the subject's shard write lock (the general path), and the shard's
//! bounded table of records ([`Records`]).
//!
//! Records live with their subject: a shard keeps, per subject key, that
//! subject's live records (the record id, [`Record::id`](crate::Record::id),
//! hashed to 32 bytes), each holding an admitted decision until its window
//! ends and counting the free replays it has left. Only an admitted check
//! writes one, so a subject gains records no faster than its policies
//! admit it. Bounds, none of which lets one subject touch another's
//! records:
//!
//! - a subject holds at most [`MAX_RECORDS_PER_SUBJECT`]; its next record
//!   replaces its own record nearest its end (a retry of that request is
//!   charged again: never more admitted);
//! - a shard holds at most its share of the store's bound
//!   ([`MemoryStore::max_keys`] divided by the shards, at least 16); when
//!   full, expired records are swept, and if none has expired the new
//!   record is not kept (the request is still decided and charged as
//!   usual; its retry is charged again). A missing record never denies a
//!   request and never answers `Retry-After: 0`.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use super::fast::check_policy;
use super::table::{Key, Shard};
use super::{Inner, MemoryStore};
use crate::algorithms::Step;
use crate::classes::check_class;
use crate::{CheckOptions, CheckPlan, Checked, Policy, StoreError, Verdict};

/// Most live idempotency records one subject holds; its next replaces its
/// own record nearest its end.
pub(super) const MAX_RECORDS_PER_SUBJECT: usize = 64;
/// Fewest records a shard may hold, whatever the bound.
const MIN_RECORDS_PER_SHARD: usize = 16;

/// One record: an admitted decision, until when, and the free replays
/// it has left.
struct Rec {
    id: [u8; 32],
    expires_at_us: u64,
    replays_left: u32,
    verdict: Verdict,
}

impl Rec {
    /// Bytes the record holds outside its slot (a verdict of several
    /// decisions).
    fn heap_bytes(&self) -> usize {
        let decisions = self.verdict.decisions();
        if decisions.len() > 1 {
            std::mem::size_of_val(decisions)
        } else {
            0
        }
    }
}

/// One shard's idempotency records, by subject key.
#[derive(Default)]
pub(super) struct Records {
    map: HashMap<Box<[u8]>, Vec<Rec>>,
    /// Records held, in all subjects' lists.
    len: usize,
    /// Sweep expired records when `len` reaches this.
    sweep_at: usize,
}

impl Records {
    /// Answers a repeat from the subject's live record `id`, if it has one
    /// with a free replay left (and spends that replay).
    fn replay(&mut self, subject: &[u8], id: &[u8; 32], now: u64) -> Option<Verdict> {
        let rec = self
            .map
            .get_mut(subject)?
            .iter_mut()
            .find(|rec| rec.id == *id && rec.expires_at_us > now && rec.replays_left > 0)?;
        rec.replays_left -= 1;
        Some(rec.verdict.clone())
    }

    /// Keeps an admitted decision for the subject, per the bounds in the
    /// module docs.
    fn insert(&mut self, inner: &Inner, subject: &[u8], rec: Rec, now: u64) {
        if let Some(list) = self.map.get_mut(subject) {
            let before = list.len();
            list.retain(|old| old.id != rec.id && old.expires_at_us > now);
            self.len -= before - list.len();
            if list.len() >= MAX_RECORDS_PER_SUBJECT {
                // The subject at its most: its own record nearest its end
                // makes room (no other subject's is touched).
                if let Some(nearest) = list
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, old)| old.expires_at_us)
                    .map(|(index, _)| index)
                {
                    list[nearest] = rec;
                }
                return;
            }
        }
        if !self.has_room(inner, now) {
            return;
        }
        self.map.entry(subject.into()).or_default().push(rec);
        self.len += 1;
    }

    /// Whether one more record fits in the shard's share, after sweeping
    /// expired records when due.
    fn has_room(&mut self, inner: &Inner, now: u64) -> bool {
        let share = inner
            .max_keys
            .map(|max| (max / inner.shards.len()).max(MIN_RECORDS_PER_SHARD));
        if self.len >= self.sweep_at.max(64) || share.is_some_and(|share| self.len >= share) {
            self.sweep(now);
            // Amortized: the next sweep after as many inserts again.
            self.sweep_at = self.len * 2;
        }
        share.is_none_or(|share| self.len < share)
    }

    /// Drops every expired record.
    fn sweep(&mut self, now: u64) {
        let mut len = 0;
        self.map.retain(|_, list| {
            list.retain(|rec| rec.expires_at_us > now);
            len += list.len();
            !list.is_empty()
        });
        self.len = len;
    }

    /// Records held (live or expired but not yet swept).
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes the records take: the map's slots, each subject's key and
    /// list, and what records hold outside their slot.
    pub(super) fn memory_bytes(&self) -> usize {
        let slots = self.map.capacity() * (std::mem::size_of::<(Box<[u8]>, Vec<Rec>)>() + 1);
        let lists: usize = self
            .map
            .iter()
            .map(|(key, list)| {
                key.len()
                    + list.capacity() * std::mem::size_of::<Rec>()
                    + list.iter().map(Rec::heap_bytes).sum::<usize>()
            })
            .sum();
        slots + lists
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
            let id: [u8; 32] = Sha256::digest(record.id().as_bytes()).into();
            (id, record.window_micros(), record.free_replays())
        });
        let hash = self.inner.hash_key(key);
        let now = self.inner.clock.now_micros();
        self.on_shard(hash, now, |shard, inner| {
            shard.check_with(inner, hash, key, policies, now, cost, &plan, record)
        })
    }

    /// Idempotency records held in all shards (live or expired but not yet
    /// swept): at most [`MemoryStore::max_keys`] in all, or 16 per shard
    /// when that is more, and at most 64 per subject. Only admitted checks
    /// write records.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{CheckOptions, MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
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
        record: Option<([u8; 32], u64, u32)>,
    ) -> Result<Checked, StoreError> {
        // The time again, under the lock (as `check_many`).
        let now = now.max(inner.clock.now_micros());
        if let Some((id, _, _)) = &record {
            if let Some(verdict) = self.records.replay(key, id, now) {
                return Ok(Checked::new(verdict, true));
            }
        }
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(std::sync::atomic::Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let state_of =
            |policy: &Policy| entry.and_then(|entry| entry.live_state(names, policy, now, hot));
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
        // Admissions only: a denial is never replayed, so a retry after its
        // `retry_after` is checked afresh.
        if let Some((id, window_us, free_replays)) = record {
            if verdict.is_allowed() && free_replays > 0 {
                let rec = Rec {
                    id,
                    expires_at_us: now.saturating_add(window_us),
                    replays_left: free_replays,
                    verdict: verdict.clone(),
                };
                self.records.insert(inner, key, rec, now);
            }
        }
        Ok(Checked::new(verdict, false))
    }
}
