//! [`Store::check_with`](crate::Store::check_with) for [`MemoryStore`]:
//! idempotency records and priority classes, in one critical section
//! under the subject's shard write lock (`Shard::check_with`, the general
//! path), and how many records the store holds. The records themselves
//! and their bounds are in `records.rs`.

use sha2::{Digest, Sha256};

use super::MemoryStore;
use crate::memory::key::Key;
use crate::{CheckOptions, Checked, Policy, StoreError};

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
