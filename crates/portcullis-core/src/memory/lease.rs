//! The lease table of a [`MemoryStore`](crate::MemoryStore): leases of
//! [`ConcurrencyPolicy`]s in a table of their own ([`Leases`]), beside the
//! rate-limit shards, bounded by the store's `max_keys`.
//!
//! Each subject and policy holds a [`LeaseState`] (its live leases) in one
//! of [`LEASE_SHARDS`] mutex-guarded maps, picked by hash. A state with no
//! lease left is removed at once (release) or when seen expired (any call
//! on it, or a sweep). A shard is swept whole before it grows past twice
//! its size after its last sweep, so expired states cost O(1) amortized
//! per operation and never accumulate. The number of subjects holding
//! leases is capped by the store's `max_keys`: when full, a new subject
//! sweeps every shard and is refused with [`StoreError::Full`] if nothing
//! expired (never evicts: forgetting a lease would admit more than
//! `max_in_flight`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::key::HASHED_KEY_TAG;
use crate::algorithms::lease::{self, LeaseState};
use crate::subject::MAX_PLAIN_SUBJECT_LEN;
use crate::{ConcurrencyPolicy, LeaseDecision, LeaseId, StoreError};

/// Number of lease shards (a power of two).
const LEASE_SHARDS: usize = 64;
/// A shard is never swept for growth below this many states.
const MIN_SWEEP_LEN: usize = 64;
/// How long a refused new subject is told to wait when no lease can say.
const FULL_RETRY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct LeaseShard {
    states: HashMap<Box<[u8]>, LeaseState>,
    /// States held after the last sweep.
    swept_len: usize,
}

impl LeaseShard {
    /// Drops every state with no live lease; returns how many went and the
    /// earliest live expiry seen.
    fn sweep(&mut self, now_us: u64) -> (usize, Option<u64>) {
        let before = self.states.len();
        let mut earliest: Option<u64> = None;
        self.states.retain(|_, state| {
            state.prune(now_us);
            for &(_, e) in &state.leases {
                earliest = Some(earliest.map_or(e, |x| x.min(e)));
            }
            !state.is_empty()
        });
        self.swept_len = self.states.len();
        (before - self.states.len(), earliest)
    }
}

/// The lease table of a [`MemoryStore`](crate::MemoryStore).
pub(super) struct Leases {
    shards: Box<[Mutex<LeaseShard>]>,
    hasher: std::collections::hash_map::RandomState,
    max_keys: Option<usize>,
    /// States held over all shards.
    len: AtomicUsize,
}

impl Leases {
    /// (Subject, policy) pairs holding leases, expired ones not yet swept
    /// included.
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub(super) fn new(max_keys: Option<usize>) -> Self {
        Self {
            shards: (0..LEASE_SHARDS)
                .map(|_| Mutex::new(LeaseShard::default()))
                .collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            max_keys,
            len: AtomicUsize::new(0),
        }
    }

    /// `<policy name> 0x00 <subject key>`; the subject key is the subject,
    /// or a tag byte and its SHA-256 when longer than
    /// [`MAX_PLAIN_SUBJECT_LEN`].
    fn key(subject: &str, policy: &ConcurrencyPolicy) -> Box<[u8]> {
        let mut key = Vec::with_capacity(policy.name().len() + 1 + subject.len().min(33));
        key.extend_from_slice(policy.name().as_bytes());
        key.push(0);
        if subject.len() > MAX_PLAIN_SUBJECT_LEN {
            key.push(HASHED_KEY_TAG);
            key.extend_from_slice(&Sha256::digest(subject.as_bytes()));
        } else {
            key.extend_from_slice(subject.as_bytes());
        }
        key.into_boxed_slice()
    }

    fn shard(&self, key: &[u8]) -> MutexGuard<'_, LeaseShard> {
        use std::hash::BuildHasher;
        let index = self.hasher.hash_one(key) as usize & (LEASE_SHARDS - 1);
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn admit_new(&self) -> bool {
        match self.max_keys {
            None => {
                self.len.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(max) => self
                .len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |len| {
                    (len < max).then_some(len + 1)
                })
                .is_ok(),
        }
    }

    fn forget(&self, removed: usize) {
        if removed > 0 {
            self.len.fetch_sub(removed, Ordering::Relaxed);
        }
    }

    /// Sweeps every shard, one lock at a time; the earliest live expiry.
    fn sweep_all(&self, now_us: u64) -> Option<u64> {
        let mut earliest: Option<u64> = None;
        for shard in &*self.shards {
            let mut shard = shard
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (removed, first) = shard.sweep(now_us);
            self.forget(removed);
            if let Some(e) = first {
                earliest = Some(earliest.map_or(e, |x| x.min(e)));
            }
        }
        earliest
    }

    pub(super) fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        id: LeaseId,
        now_us: u64,
    ) -> Result<LeaseDecision, StoreError> {
        let key = Self::key(subject, policy);
        let mut earliest = None;
        for attempt in 0..2 {
            let mut shard = self.shard(&key);
            if let Some(state) = shard.states.get_mut(&key) {
                return Ok(lease::acquire(policy, state, now_us, id));
            }
            if shard.states.len() >= MIN_SWEEP_LEN.max(2 * shard.swept_len) {
                let (removed, _) = shard.sweep(now_us);
                self.forget(removed);
            }
            if self.admit_new() {
                let mut state = LeaseState::default();
                let decision = lease::acquire(policy, &mut state, now_us, id);
                shard.states.insert(key, state);
                return Ok(decision);
            }
            if attempt == 0 {
                drop(shard);
                earliest = self.sweep_all(now_us);
            }
        }
        let retry_after = earliest.map_or(FULL_RETRY, |e| {
            Duration::from_micros(e.saturating_sub(now_us).max(1))
        });
        Err(StoreError::Full {
            max_keys: self.max_keys.unwrap_or(usize::MAX),
            retry_after,
        })
    }

    pub(super) fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        id: LeaseId,
        now_us: u64,
    ) -> Option<u64> {
        let key = Self::key(subject, policy);
        let mut shard = self.shard(&key);
        let state = shard.states.get_mut(&key)?;
        let renewed = lease::renew(policy, state, now_us, id);
        if state.is_empty() {
            shard.states.remove(&key);
            self.forget(1);
        }
        renewed
    }

    pub(super) fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        id: LeaseId,
        now_us: u64,
    ) -> bool {
        let key = Self::key(subject, policy);
        let mut shard = self.shard(&key);
        let Some(state) = shard.states.get_mut(&key) else {
            return false;
        };
        let released = lease::release(state, now_us, id);
        if state.is_empty() {
            shard.states.remove(&key);
            self.forget(1);
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::executor::block_on;
    use proptest::prelude::*;

    use crate::algorithms::lease as model;
    use crate::{ConcurrencyPolicy, LeaseId, LeaseStore, ManualClock, MemoryStore, StoreError};

    const T0: u64 = 1_700_000_000_000_000;

    fn policy(max: u64) -> ConcurrencyPolicy {
        ConcurrencyPolicy::max_in_flight(max)
            .lease_ttl(Duration::from_secs(1))
            .name("c")
            .build()
            .unwrap()
    }

    #[test]
    fn release_now_releases_at_once_and_once() {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let p = policy(1);
        let lease = block_on(store.acquire("a", &p, LeaseId::generate()))
            .unwrap()
            .lease()
            .unwrap();
        assert!(!block_on(store.acquire("a", &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        assert!(matches!(
            store.release_now("a", &p, lease.id()),
            Some(Ok(true))
        ));
        assert!(
            matches!(store.release_now("a", &p, lease.id()), Some(Ok(false))),
            "already released"
        );
        assert!(block_on(store.acquire("a", &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
    }

    #[test]
    fn leases_expire_on_the_clock_and_subjects_are_independent() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let p = policy(2);
        let a = block_on(store.acquire("a", &p, LeaseId::generate()))
            .unwrap()
            .lease()
            .unwrap();
        assert!(block_on(store.acquire("a", &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        let denied = block_on(store.acquire("a", &p, LeaseId::generate())).unwrap();
        assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
        assert!(block_on(store.acquire("b", &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        clock.advance(Duration::from_millis(600));
        assert_eq!(
            block_on(store.renew("a", &p, a.id())).unwrap(),
            Some(T0 + 1_600_000)
        );
        clock.advance(Duration::from_millis(400));
        // The second lease of "a" expired; the renewed one holds.
        let d = block_on(store.acquire("a", &p, LeaseId::generate())).unwrap();
        assert!(d.is_granted());
        assert_eq!(d.in_flight(), 2);
        assert!(block_on(store.release("a", &p, a.id())).unwrap());
        assert!(!block_on(store.release("a", &p, a.id())).unwrap());
        clock.advance(Duration::from_secs(2));
        assert!(block_on(store.renew("a", &p, a.id())).unwrap().is_none());
    }

    #[test]
    fn the_table_is_bounded_and_refuses_rather_than_evicts() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(100)
            .build();
        let p = policy(1);
        for i in 0..100 {
            assert!(
                block_on(store.acquire(&format!("s{i}"), &p, LeaseId::generate()))
                    .unwrap()
                    .is_granted()
            );
        }
        assert_eq!(store.lease_subjects(), 100);
        let full = block_on(store.acquire("new", &p, LeaseId::generate())).unwrap_err();
        assert!(
            matches!(full, StoreError::Full { retry_after, .. } if retry_after == Duration::from_secs(1))
        );
        // Held subjects are still limited exactly.
        assert!(!block_on(store.acquire("s0", &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        clock.advance(Duration::from_secs(1));
        assert!(block_on(store.acquire("new", &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        assert_eq!(store.lease_subjects(), 1);
    }

    #[test]
    fn expired_states_are_swept_as_the_table_grows() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .unbounded()
            .build();
        let p = policy(1);
        for round in 0..20 {
            for i in 0..1_000 {
                block_on(store.acquire(&format!("r{round}-{i}"), &p, LeaseId::generate())).unwrap();
            }
            clock.advance(Duration::from_secs(2));
        }
        assert!(store.lease_subjects() < 5_000, "{}", store.lease_subjects());
    }

    #[test]
    fn long_subjects_are_hashed() {
        let store = MemoryStore::new();
        let p = policy(1);
        let long = "x".repeat(10_000);
        assert!(block_on(store.acquire(&long, &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        assert!(!block_on(store.acquire(&long, &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        let other = "y".repeat(10_000);
        assert!(block_on(store.acquire(&other, &p, LeaseId::generate()))
            .unwrap()
            .is_granted());
        assert_eq!(super::Leases::key(&long, &p).len(), "c".len() + 1 + 33);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u8),
        Renew(usize),
        Release(usize),
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..3).prop_map(Op::Acquire),
            1 => (0usize..10).prop_map(Op::Renew),
            2 => (0usize..10).prop_map(Op::Release),
            2 => (0u64..1_500_000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// The store answers as the pure algorithm does, per subject, on
        /// the manual clock.
        #[test]
        fn the_store_follows_the_algorithm(max in 1u64..4, ops in proptest::collection::vec(op(), 1..60)) {
            let clock = ManualClock::new(T0);
            let store = MemoryStore::with_clock(clock.clone());
            let p = policy(max);
            let mut states: [model::LeaseState; 3] = Default::default();
            let mut held: Vec<(u8, LeaseId)> = Vec::new();
            let mut now = T0;
            for op in ops {
                match op {
                    Op::Acquire(s) => {
                        let id = LeaseId::generate();
                        let got = block_on(store.acquire(&format!("s{s}"), &p, id)).unwrap();
                        let want = model::acquire(&p, &mut states[s as usize], now, id);
                        prop_assert_eq!(got, want);
                        if got.is_granted() { held.push((s, id)); }
                    }
                    Op::Renew(i) => {
                        let Some(&(s, id)) = held.get(i) else { continue };
                        let got = block_on(store.renew(&format!("s{s}"), &p, id)).unwrap();
                        prop_assert_eq!(got, model::renew(&p, &mut states[s as usize], now, id));
                    }
                    Op::Release(i) => {
                        let Some(&(s, id)) = held.get(i) else { continue };
                        let got = block_on(store.release(&format!("s{s}"), &p, id)).unwrap();
                        prop_assert_eq!(got, model::release(&mut states[s as usize], now, id));
                    }
                    Op::Wait(us) => {
                        now += us;
                        clock.advance(Duration::from_micros(us));
                    }
                }
            }
        }
    }
}
