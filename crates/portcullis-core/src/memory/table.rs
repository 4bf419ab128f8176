//! The table: the subject as looked up ([`Key`]), a shard (its lock, hash
//! table and bookkeeping) and the general path that checks and inserts
//! subjects under the shard's write lock. What an entry holds is in
//! `entry.rs`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use super::entry::Entry;
use super::fast::check_policy;
use super::{Inner, WhenFull, HASHED_KEY_TAG, MAX_INTERNED_NAMES};
use crate::algorithms::{Shape, Step};
use crate::subject::MAX_PLAIN_SUBJECT_LEN;
use crate::{Decision, Policy, StoreError, Verdict};

/// A subject as stored: its bytes when it is at most
/// [`MAX_PLAIN_SUBJECT_LEN`] long, or the byte `0xFF` and its SHA-256 digest
/// (raw, not hex: `0xFF` never occurs in UTF-8, so the two never collide).
/// Built on the stack: looking a subject up allocates nothing.
pub(super) enum Key<'a> {
    Raw(&'a [u8]),
    Hashed([u8; 33]),
}

impl<'a> Key<'a> {
    #[inline(always)]
    pub(super) fn new(subject: &'a str) -> Self {
        if subject.len() <= MAX_PLAIN_SUBJECT_LEN {
            Self::Raw(subject.as_bytes())
        } else {
            Self::Hashed(Self::hashed(subject))
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn hashed(subject: &str) -> [u8; 33] {
        let mut key = [0; 33];
        key[0] = HASHED_KEY_TAG;
        key[1..].copy_from_slice(&Sha256::digest(subject.as_bytes()));
        key
    }

    #[inline(always)]
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Raw(key) => key,
            Self::Hashed(key) => key,
        }
    }
}

/// A shard's lock: [`std::sync::RwLock`], whose readers retry a lost
/// compare-and-swap at once (parking_lot's back off first, which measured
/// slower with two threads charging one subject). Poisoning is ignored:
/// nothing that runs under the lock panics, and a shard is consistent
/// between any two statements that could.
pub(super) struct ShardLock(pub(super) RwLock<Shard>);

impl ShardLock {
    #[inline]
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Shard> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Shard> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

// `repr(C)`: `hot_tat` comes first, on the cache line of the lock word
// (the lock's few bytes precede the shard in its `RwLock`).
#[repr(C)]
pub(super) struct Shard {
    /// The packed TAT of the shard's hot slot ([`Body::Hot`](super::entry::Body::Hot)), if it has
    /// one; charged under the read lock by compare-and-swap.
    pub(super) hot_tat: AtomicU64,
    /// Fast-path charges of this shard (counted without a read-modify-write:
    /// two threads may count one), on the cache line the read lock writes
    /// anyway; every [`SWEEP_EVERY`](super::SWEEP_EVERY)-th sweeps the shard.
    pub(super) hot_ops: AtomicU32,
    /// The hash of the subject that holds the hot slot.
    pub(super) hot_hash: Option<u64>,
    pub(super) table: HashTable<Entry>,
    /// Operations since the last incremental sweep.
    pub(super) ops: u32,
    /// Next bucket the incremental sweep looks at.
    pub(super) cursor: usize,
    /// Next bucket an eviction looks at.
    pub(super) evict_cursor: usize,
    /// No entry expires before this (a lower bound, made exact by full
    /// sweeps and at the end of each incremental pass).
    pub(super) min_expires_at_us: u64,
    /// The least expiry seen by the current incremental pass (entries it
    /// scanned and kept, and every write since it began).
    pub(super) pass_min_us: u64,
    /// Policy names in use, shared by the slots: a new subject allocates
    /// its key, not its policies' names.
    pub(super) names: Names,
    /// Idempotency records of the shard's subjects (`options.rs`).
    pub(super) records: super::options::Records,
}

/// The policies a shard shares between its subjects: up to
/// [`MAX_INTERNED_NAMES`] (applications use a handful; past that, each slot
/// holds the `Arc` of the policy that wrote it), each a name with the
/// [`Shape`] its states are written in. A name changed to another rate or
/// capacity (a plan change under the same name) is a second entry, so a
/// compact state always says in which units it was written.
///
/// The first policy seen with a name and shape lends its own `Arc`, so
/// checks made with clones of that policy find their slot by a pointer
/// comparison.
#[derive(Default)]
pub(super) struct Names {
    names: Vec<Arc<str>>,
    shapes: Vec<Shape>,
}

impl Names {
    /// The shared name of `policy`'s name and shape.
    pub(super) fn intern(&mut self, policy: &Policy) -> Arc<str> {
        let name = policy.shared_name();
        let shape = Shape::of(policy);
        let found = self
            .names
            .iter()
            .zip(&self.shapes)
            .find(|(interned, interned_shape)| {
                **interned_shape == shape && same_name(interned, name)
            });
        if let Some((interned, _)) = found {
            return Arc::clone(interned);
        }
        if self.names.len() < MAX_INTERNED_NAMES {
            self.names.push(Arc::clone(name));
            self.shapes.push(shape);
        }
        Arc::clone(name)
    }

    /// The interned name at `index` and its shape.
    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> Option<(&Arc<str>, Shape)> {
        Some((self.names.get(index)?, *self.shapes.get(index)?))
    }

    /// Where `name` (this very `Arc`) is interned.
    pub(super) fn position(&self, name: &Arc<str>) -> Option<usize> {
        self.names
            .iter()
            .position(|interned| Arc::ptr_eq(interned, name))
    }

    /// Bytes held outside the shard.
    pub(super) fn heap_bytes(&self) -> usize {
        self.names.capacity() * std::mem::size_of::<Arc<str>>()
            + self.shapes.capacity() * std::mem::size_of::<Shape>()
    }
}

/// [`check_policy`] of a state as [`Entry::live`] read it: a state it
/// rescaled to `policy`'s units is written back on a charge whatever the
/// verdict, as a repair is (ALGORITHMS.md, "Changing a policy").
#[inline(always)]
pub(super) fn checked(
    policy: &Policy,
    live: Option<(std::borrow::Cow<'_, crate::algorithms::State>, bool)>,
    now: u64,
    cost: u64,
) -> Step {
    match live {
        None => check_policy(policy, None, now, cost),
        Some((state, false)) => check_policy(policy, Some(&state), now, cost),
        Some((state, true)) => {
            let mut step = check_policy(policy, Some(&state), now, cost);
            if cost > 0 && step.new_state.is_none() {
                step.new_state = Some(state.into_owned());
            }
            step
        }
    }
}

/// Whether two policy names are equal, comparing pointers first.
#[inline(always)]
pub(super) fn same_name(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            hot_tat: AtomicU64::new(0),
            hot_ops: AtomicU32::new(0),
            hot_hash: None,
            table: HashTable::new(),
            ops: 0,
            cursor: 0,
            evict_cursor: 0,
            min_expires_at_us: u64::MAX,
            pass_min_us: u64::MAX,
            names: Names::default(),
            records: super::options::Records::default(),
        }
    }

    /// The bucket of `key`'s entry.
    #[inline(always)]
    pub(super) fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        self.table
            .find_bucket_index(hash, |entry| entry.key.matches(key))
    }

    /// The common case, one policy: no intermediate list of steps, and the
    /// state is written in place.
    #[inline(always)]
    pub(super) fn check_one(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policy: &Policy,
        now: u64,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        // The time again, under the lock: no state written before is then
        // later than it (with a clock that never goes back), so a state
        // ahead of it beyond the clock tolerance is a policy change or a
        // clock set back, which the algorithm clamps, never a check that
        // read the clock before another's and locked after it.
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let Some(entry) = index.and_then(|index| self.table.get_bucket_mut(index)) else {
            let step = check_policy(policy, None, now, cost);
            if let (true, Some(state)) = (cost > 0, step.new_state) {
                let entry = Entry::new(&mut self.names, key, policy, state, step.expires_at_us);
                self.insert(inner, hash, entry, now)?;
            }
            self.tick(inner, now);
            return Ok(step.decision);
        };
        let live = entry.live(&self.names, policy, now, hot);
        let step = checked(policy, live, now, cost);
        if let (true, Some(state)) = (cost > 0, step.new_state) {
            entry.write(&mut self.names, policy, state, step.expires_at_us, hot);
            entry.refresh(&self.names, now);
            let expires_at_us = entry.expires_at_us(hot);
            self.note_expiry(expires_at_us);
        }
        self.tick(inner, now);
        Ok(step.decision)
    }

    /// Several policies: every one is computed first, and the new states
    /// are written only if all admit.
    #[inline(never)]
    pub(super) fn check_many(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policies: &[Policy],
        now: u64,
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        // The time again, under the lock (see `check_one`).
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let mut steps: SmallVec<[Step; 2]> = policies
            .iter()
            .map(|policy| {
                let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
                checked(policy, live, now, cost)
            })
            .collect();
        if cost > 0 && steps.iter().any(|step| !step.decision.is_allowed()) {
            // Nothing is charged, so the policies that would have admitted
            // report their state as it stays: as a peek does (which writes
            // only a repair).
            for (policy, step) in policies.iter().zip(steps.iter_mut()) {
                if step.decision.is_allowed() {
                    let live = entry.and_then(|entry| entry.live(names, policy, now, hot));
                    // A peek; a rescaled state is still written back, as
                    // a repair.
                    let repair = live
                        .as_ref()
                        .filter(|(_, rescaled)| *rescaled)
                        .map(|(state, _)| state.clone().into_owned());
                    *step = checked(policy, live, now, 0);
                    if step.new_state.is_none() {
                        step.new_state = repair;
                    }
                }
            }
        }
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        // New states of an admission, and repairs (ALGORITHMS.md, "Changing
        // a policy") whatever the verdict; a peek writes nothing.
        let write = cost > 0 && steps.iter().any(|step| step.new_state.is_some());
        if !write {
            self.tick(inner, now);
            return Ok(verdict);
        }
        self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        self.tick(inner, now);
        Ok(verdict)
    }

    /// Writes the new states of `steps` (each policy with its step) to the
    /// subject's entry at `index`, or to a new entry when there is none,
    /// and notes when it expires. Shared by checks and post-charges.
    pub(super) fn write_steps<'p>(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        index: Option<usize>,
        steps: impl Iterator<Item = (&'p Policy, Step)>,
        now: u64,
    ) -> Result<(), StoreError> {
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let apply = |entry: &mut Entry, names: &mut Names| {
            for (policy, step) in steps {
                if let Some(state) = step.new_state {
                    entry.write(names, policy, state, step.expires_at_us, hot);
                }
            }
            entry.refresh(names, now);
        };
        match index.and_then(|index| self.table.get_bucket_mut(index)) {
            Some(entry) => {
                apply(entry, &mut self.names);
                let expires_at_us = entry.expires_at_us(hot);
                self.note_expiry(expires_at_us);
            }
            None => {
                let mut entry = Entry::empty(key);
                apply(&mut entry, &mut self.names);
                self.insert(inner, hash, entry, now)?;
            }
        }
        Ok(())
    }

    #[inline(never)]
    pub(super) fn insert(
        &mut self,
        inner: &Inner,
        hash: u64,
        entry: Entry,
        now: u64,
    ) -> Result<(), StoreError> {
        if !inner.admit_new() {
            if self.min_expires_at_us <= now {
                let freed = self.purge(now);
                inner.forget(freed);
            }
            // Evicting in place keeps the count: one entry out, this one in.
            // Only from a shard that holds at least half its share of the
            // bound, so that a shard holding a few heavy subjects is not
            // where a flood evicts; other shards are left to `make_room`,
            // which evicts from the fullest.
            let share = inner.max_keys.unwrap_or(usize::MAX) / inner.shards.len() / 2;
            let room = inner.admit_new()
                || (inner.when_full == WhenFull::EvictNearestFull
                    && self.table.len() >= share.max(1)
                    && self.evict_one(now));
            if !room {
                return Err(StoreError::Full {
                    // `admit_new` refuses only when a cap is set.
                    max_keys: inner.max_keys.unwrap_or(usize::MAX),
                    // Filled in by `make_room`, which sees every shard.
                    retry_after: std::time::Duration::ZERO,
                });
            }
        }
        if self.table.len() == self.table.capacity() {
            // The insert would grow the table: sweep first. If that frees
            // little, grow now so the next full sweep is far away.
            let freed = self.purge(now);
            inner.forget(freed);
            let len = self.table.len();
            if len > 0 && len >= self.table.capacity() / 8 * 7 {
                self.table.reserve(len, inner.rehash());
                self.cursor = 0;
            }
        }
        // A new entry has no hot slot.
        self.note_expiry(entry.expires_at_us(0));
        let rehash = inner.rehash();
        self.table.insert_unique(hash, entry, &rehash);
        Ok(())
    }
}
