//! [`TopDenied`]: the subjects a [`RateLimitLayer`](crate::RateLimitLayer)
//! denies most, counted per (subject, policy) in a table of fixed capacity
//! by the space-saving algorithm, and exported as JSON for an admin
//! endpoint (`portcullis top` merges several instances' tables). This file
//! owns the table, its entries and its JSON form.

use std::fmt;
use std::hash::BuildHasher as _;
use std::sync::Arc;

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use parking_lot::Mutex;
use portcullis_core::subject::encode_subject;

/// The most entries a [`TopDenied`] table holds, whatever capacity is asked
/// for: 10 000 (each entry holds a subject of at most 65 bytes, as the store
/// keys it, and a policy name).
pub const MAX_TOP_DENIED: usize = 10_000;

/// The `version` of [`TopDenied::to_json`]'s schema.
pub const TOP_DENIED_VERSION: u64 = 1;

/// The `format` of [`TopDenied::to_json`]'s schema.
pub const TOP_DENIED_FORMAT: &str = "portcullis.top_denied";

/// The subjects a layer denies most: give one to
/// [`RateLimitLayerBuilder::top_denied`](crate::RateLimitLayerBuilder::top_denied)
/// and serve [`to_json`](Self::to_json) on an admin endpoint of the
/// app's own (`portcullis top URL...` reads and merges them).
///
/// Each denial of a request by a policy counts one for (subject, policy),
/// including denials answered by the layer's deny cache and a shaped
/// request that waited too long; a dry run's would-be denials, requests
/// let through or refused because the store failed, and requests the
/// store could not check are not denials by a policy and are not counted.
///
/// **Bounded, whatever clients send.** The table holds at most `capacity`
/// entries (clamped to 1..=[`MAX_TOP_DENIED`]), decided by the
/// space-saving algorithm (Metwally, Agrawal and El Abbadi, 2005): a
/// subject not in a full table replaces the entry of the smallest count
/// `m`, and starts at `m + 1` with an `error` of `m`. So an entry's
/// `count` is at most `error` above its true count, never below it, and
/// every subject denied more than `denials / capacity` times is in the
/// table. A client sending a new subject per request churns the table's
/// smallest entries but cannot grow it, and cannot push out a subject
/// denied more often than the table's smallest count. Subjects are kept
/// as the store keys them ([`encode_subject`]: plain keys as they are,
/// anything else as `#` and its SHA-256), never as a client sent them,
/// so an entry is at most 65 bytes. Nothing is logged per denial.
///
/// Each denial takes a lock for a hash lookup and O(log capacity) moves;
/// an admitted request never touches the table.
///
/// ```
/// // Also add: cargo add tower --features util && cargo add serde_json
/// use axum::http;
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{Header, RateLimitLayer, TopDenied};
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let top = TopDenied::new(100);
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_minute(1).name("per-minute").build()?)
///     .key(Header::new(http::HeaderName::from_static("x-user")))
///     .top_denied(top.clone())
///     .build()?;
/// let service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// }));
/// for _ in 0..3 {
///     let request = http::Request::get("/").header("x-user", "alice").body(())?;
///     service.clone().oneshot(request).await?;
/// }
/// let top_now = top.snapshot();
/// assert_eq!(top_now[0].subject(), "alice");
/// assert_eq!(top_now[0].policy(), "per-minute");
/// assert_eq!(top_now[0].count(), 2);
/// // What an admin endpoint returns:
/// let json: serde_json::Value = serde_json::from_str(&top.to_json())?;
/// assert_eq!(json["version"], 1);
/// assert_eq!(json["entries"][0]["count"], 2);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TopDenied {
    inner: Arc<Shared>,
}

struct Shared {
    /// Subjects hashed always, as a store with `hash_subjects` keys them.
    hash_always: bool,
    table: Mutex<Table>,
}

/// One (subject, policy) of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopDeniedEntry {
    subject: String,
    policy: String,
    count: u64,
    error: u64,
}

impl TopDeniedEntry {
    /// The subject, as the store keys it (plain, or `#` and a SHA-256).
    #[must_use]
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The name of the policy that denied.
    #[must_use]
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// Denials counted: at least the true count, at most `error` above it.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The most `count` may overstate the true count (the smallest count
    /// in the table when this entry took its place; 0 when it was always
    /// in the table).
    #[must_use]
    pub fn error(&self) -> u64 {
        self.error
    }
}

struct Slot {
    subject: Box<str>,
    policy: Box<str>,
    hash: u64,
    count: u64,
    error: u64,
    /// Where this slot is in the heap.
    at: usize,
}

/// The space-saving table: slots, a min-heap of slot ids by count, and a
/// hash index of slot ids by (subject, policy).
struct Table {
    capacity: usize,
    slots: Vec<Slot>,
    heap: Vec<usize>,
    index: HashTable<usize>,
    hasher: RandomState,
    denials: u64,
}

impl TopDenied {
    /// A table of at most `capacity` (subject, policy) entries, clamped to
    /// 1..=[`MAX_TOP_DENIED`]. Its memory is allocated as entries come.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Shared {
                hash_always: false,
                table: Mutex::new(Table {
                    capacity: capacity.clamp(1, MAX_TOP_DENIED),
                    slots: Vec::new(),
                    heap: Vec::new(),
                    index: HashTable::new(),
                    hasher: RandomState::default(),
                    denials: 0,
                }),
            }),
        }
    }

    /// Keys every subject as a store with `hash_subjects(true)` does (`#`
    /// and its SHA-256), so the table's subjects are the store's; set it as
    /// the store is set. Call before sharing the table: a clone made
    /// before keeps the old setting.
    #[must_use]
    pub fn hash_subjects(self, always: bool) -> Self {
        let capacity = self.capacity();
        let mut fresh = Self::new(capacity);
        if let Some(shared) = Arc::get_mut(&mut fresh.inner) {
            shared.hash_always = always;
        }
        fresh
    }

    /// The most entries the table holds.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.inner.table.lock().capacity
    }

    /// Counts one denial of the layer's key `key` by policy `policy`.
    pub(crate) fn record(&self, key: &str, policy: &str) {
        let subject = encode_subject(key, self.inner.hash_always);
        self.inner.table.lock().record(&subject, policy);
    }

    /// The entries, most denied first (ties: the smaller error first, then
    /// by subject and policy).
    #[must_use]
    pub fn snapshot(&self) -> Vec<TopDeniedEntry> {
        let table = self.inner.table.lock();
        let mut entries: Vec<TopDeniedEntry> = table
            .slots
            .iter()
            .map(|slot| TopDeniedEntry {
                subject: slot.subject.to_string(),
                policy: slot.policy.to_string(),
                count: slot.count,
                error: slot.error,
            })
            .collect();
        drop(table);
        entries.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.error.cmp(&b.error))
                .then_with(|| a.subject.cmp(&b.subject))
                .then_with(|| a.policy.cmp(&b.policy))
        });
        entries
    }

    /// Denials counted since the table was made or reset (all of them,
    /// in the table or not).
    #[must_use]
    pub fn denials(&self) -> u64 {
        self.inner.table.lock().denials
    }

    /// The table as JSON, for an admin endpoint:
    ///
    /// ```json
    /// {
    ///   "format": "portcullis.top_denied",
    ///   "version": 1,
    ///   "capacity": 100,
    ///   "denials": 1234,
    ///   "entries": [
    ///     { "subject": "203.0.113.7", "policy": "per-minute", "count": 812, "error": 0 }
    ///   ]
    /// }
    /// ```
    ///
    /// `format` and `version` ([`TOP_DENIED_FORMAT`],
    /// [`TOP_DENIED_VERSION`]) name the schema; a reader refuses another.
    /// `capacity` is the table's, `denials` every denial counted since
    /// the last reset, `entries` the whole table as
    /// [`snapshot`](Self::snapshot) orders it (`count` and `error` as
    /// [`TopDeniedEntry`] defines them). A later version may add fields.
    #[must_use]
    pub fn to_json(&self) -> String {
        let entries: Vec<serde_json::Value> = self
            .snapshot()
            .into_iter()
            .map(|entry| {
                serde_json::json!({
                    "subject": entry.subject,
                    "policy": entry.policy,
                    "count": entry.count,
                    "error": entry.error,
                })
            })
            .collect();
        serde_json::json!({
            "format": TOP_DENIED_FORMAT,
            "version": TOP_DENIED_VERSION,
            "capacity": self.capacity(),
            "denials": self.denials(),
            "entries": entries,
        })
        .to_string()
    }

    /// Empties the table and its count of denials.
    pub fn reset(&self) {
        let mut table = self.inner.table.lock();
        table.slots = Vec::new();
        table.heap = Vec::new();
        table.index = HashTable::new();
        table.denials = 0;
    }
}

impl fmt::Debug for TopDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.inner.table.lock();
        f.debug_struct("TopDenied")
            .field("capacity", &table.capacity)
            .field("entries", &table.slots.len())
            .field("denials", &table.denials)
            .field("hash_subjects", &self.inner.hash_always)
            .finish()
    }
}

impl Table {
    fn hash(&self, subject: &str, policy: &str) -> u64 {
        self.hasher.hash_one((subject, policy))
    }

    fn record(&mut self, subject: &str, policy: &str) {
        self.denials = self.denials.saturating_add(1);
        let hash = self.hash(subject, policy);
        let slots = &self.slots;
        let found = self
            .index
            .find(hash, |&id| {
                *slots[id].subject == *subject && *slots[id].policy == *policy
            })
            .copied();
        if let Some(id) = found {
            self.slots[id].count = self.slots[id].count.saturating_add(1);
            let at = self.slots[id].at;
            self.sift_down(at);
            return;
        }
        if self.slots.len() < self.capacity {
            let id = self.slots.len();
            self.slots.push(Slot {
                subject: subject.into(),
                policy: policy.into(),
                hash,
                count: 1,
                error: 0,
                at: self.heap.len(),
            });
            self.heap.push(id);
            let slots = &self.slots;
            self.index.insert_unique(hash, id, |&id| slots[id].hash);
            let at = self.slots[id].at;
            self.sift_up(at);
            return;
        }
        // Full: the entry of the smallest count gives its place.
        let id = self.heap[0];
        let old = self.slots[id].hash;
        if let Ok(entry) = self.index.find_entry(old, |&other| other == id) {
            entry.remove();
        }
        let slot = &mut self.slots[id];
        slot.subject = subject.into();
        slot.policy = policy.into();
        slot.hash = hash;
        slot.error = slot.count;
        slot.count = slot.count.saturating_add(1);
        let slots = &self.slots;
        self.index.insert_unique(hash, id, |&id| slots[id].hash);
        self.sift_down(0);
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        let (x, y) = (self.heap[a], self.heap[b]);
        self.slots[x].at = a;
        self.slots[y].at = b;
    }

    fn count_at(&self, at: usize) -> u64 {
        self.slots[self.heap[at]].count
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count_at(parent) <= self.count_at(at) {
                return;
            }
            self.swap(parent, at);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        let len = self.heap.len();
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut least = at;
            if left < len && self.count_at(left) < self.count_at(least) {
                least = left;
            }
            if right < len && self.count_at(right) < self.count_at(least) {
                least = right;
            }
            if least == at {
                return;
            }
            self.swap(at, least);
            at = least;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(top: &TopDenied) -> Vec<(String, String, u64, u64)> {
        top.snapshot()
            .into_iter()
            .map(|e| (e.subject, e.policy, e.count, e.error))
            .collect()
    }

    #[test]
    fn counts_per_subject_and_policy_most_first() {
        let top = TopDenied::new(10);
        for _ in 0..3 {
            top.record("alice", "minute");
        }
        top.record("alice", "day");
        top.record("bob", "minute");
        top.record("bob", "minute");
        assert_eq!(
            counts(&top),
            [
                ("alice".into(), "minute".into(), 3, 0),
                ("bob".into(), "minute".into(), 2, 0),
                ("alice".into(), "day".into(), 1, 0),
            ]
        );
        assert_eq!(top.denials(), 6);
        top.reset();
        assert!(top.snapshot().is_empty());
        assert_eq!(top.denials(), 0);
    }

    /// Far more distinct subjects than capacity: the table stays at its
    /// capacity, a heavy subject stays in it with an exact count, and
    /// every count bounds the true one from above within its error.
    #[test]
    fn a_flood_of_new_subjects_never_grows_the_table_or_evicts_the_heavy_one() {
        let top = TopDenied::new(50);
        let mut truth = std::collections::HashMap::new();
        for i in 0..100_000_u64 {
            let subject = if i % 10 == 0 {
                "heavy".to_owned()
            } else {
                format!("spoofed-{i}")
            };
            top.record(&subject, "minute");
            *truth.entry(subject).or_insert(0_u64) += 1;
            if i % 10_000 == 0 {
                assert!(top.snapshot().len() <= 50);
            }
        }
        let entries = top.snapshot();
        assert_eq!(entries.len(), 50);
        assert_eq!(entries[0].subject(), "heavy");
        assert_eq!(entries[0].count(), 10_000);
        for entry in &entries {
            let true_count = truth[entry.subject()];
            assert!(entry.count() >= true_count, "{entry:?}");
            assert!(entry.count() - entry.error() <= true_count, "{entry:?}");
        }
        let total: u64 = entries.iter().map(TopDeniedEntry::count).sum();
        assert_eq!(total, 100_000, "space-saving keeps the sum of counts");
    }

    #[test]
    fn subjects_are_kept_as_the_store_keys_them() {
        let top = TopDenied::new(4);
        let long = "x".repeat(10_000);
        top.record(&long, "minute");
        top.record("user-1", "minute");
        let entries = top.snapshot();
        assert!(entries.iter().any(|e| e.subject() == "user-1"));
        assert!(entries
            .iter()
            .any(|e| e.subject() == encode_subject(&long, false) && e.subject().len() == 65));
        let hashing = TopDenied::new(4).hash_subjects(true);
        hashing.record("user-1", "minute");
        assert_eq!(
            hashing.snapshot()[0].subject(),
            encode_subject("user-1", true)
        );
    }

    #[test]
    fn capacity_is_clamped_and_the_json_names_its_schema() {
        assert_eq!(TopDenied::new(0).capacity(), 1);
        assert_eq!(TopDenied::new(usize::MAX).capacity(), MAX_TOP_DENIED);
        let top = TopDenied::new(1);
        top.record("a", "p");
        top.record("b", "p");
        // b took a's place: counted 2, of which 1 may be a's.
        assert_eq!(counts(&top), [("b".into(), "p".into(), 2, 1)]);
        let json: serde_json::Value = serde_json::from_str(&top.to_json()).unwrap();
        assert_eq!(json["format"], TOP_DENIED_FORMAT);
        assert_eq!(json["version"], TOP_DENIED_VERSION);
        assert_eq!(json["capacity"], 1);
        assert_eq!(json["denials"], 2);
        assert_eq!(
            json["entries"],
            serde_json::json!([{ "subject": "b", "policy": "p", "count": 2, "error": 1 }])
        );
    }
}
