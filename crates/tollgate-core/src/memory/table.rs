//! The table: stored keys, entries and their per-policy slots, a shard
//! (its lock, hash table and bookkeeping) and the general path that checks
//! and inserts subjects under the shard's write lock.

use super::*;

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

/// One subject.
pub(super) struct Entry {
    /// Inline up to 24 bytes (most user ids, IP addresses, e-mail
    /// addresses): a lookup compares it without leaving the entry.
    pub(super) key: SmallVec<[u8; 24]>,
    /// One per policy that charged the subject and has not expired (save
    /// for policies no longer used, until the next write drops them).
    pub(super) slots: SmallVec<[Slot; 1]>,
}

/// One policy's state for one subject.
pub(super) struct Slot {
    /// Shared with the shard's other slots of the same policy.
    pub(super) policy: Arc<str>,
    pub(super) state: SlotState,
}

/// A slot's state, and when it expires.
pub(super) enum SlotState {
    /// A GCRA state without a fraction of a microsecond (every state of a
    /// policy whose emission interval is a whole number of microseconds):
    /// its TAT, which is also when it expires. The hot path charges it under
    /// the shard's read lock, by compare-and-swap.
    Tat(AtomicU64),
    /// A `Tat` state kept in its shard's [`Shard::hot_tat`] instead, on the
    /// cache line of the shard's lock word: a subject charged by several
    /// threads at once is moved there, so that each charge contends for one
    /// cache line rather than two. At most one slot per shard, always the
    /// only slot of its entry.
    Hot,
    /// Any other state.
    Other { state: State, expires_at_us: u64 },
}

impl SlotState {
    pub(super) fn new(state: State, expires_at_us: u64) -> Self {
        match state {
            State::Gcra(GcraState { tat_us, tat_rem: 0 }) if tat_us == expires_at_us => {
                Self::Tat(AtomicU64::new(tat_us))
            }
            state => Self::Other {
                state,
                expires_at_us,
            },
        }
    }
}

impl Slot {
    /// When the state expires; `hot` is the shard's [`Shard::hot_tat`].
    #[inline]
    pub(super) fn expires_at_us(&self, hot: u64) -> u64 {
        match &self.state {
            SlotState::Tat(tat) => tat.load(Ordering::Acquire),
            SlotState::Hot => hot,
            SlotState::Other { expires_at_us, .. } => *expires_at_us,
        }
    }

    /// The state, unless it expired (an expired state is no state).
    #[inline]
    pub(super) fn live_state(&self, now: u64, hot: u64) -> Option<Cow<'_, State>> {
        let tat_us = match &self.state {
            SlotState::Tat(tat) => tat.load(Ordering::Acquire),
            SlotState::Hot => hot,
            SlotState::Other {
                state,
                expires_at_us,
            } => return (*expires_at_us > now).then_some(Cow::Borrowed(state)),
        };
        (tat_us > now).then_some(Cow::Owned(State::Gcra(GcraState { tat_us, tat_rem: 0 })))
    }

    /// Whether this is its shard's hot slot.
    pub(super) fn is_hot(&self) -> bool {
        matches!(self.state, SlotState::Hot)
    }
}

impl Entry {
    /// A new subject's entry, without slots yet.
    pub(super) fn new(key: &[u8]) -> Self {
        Self {
            key: SmallVec::from_slice(key),
            slots: SmallVec::new(),
        }
    }

    /// The latest expiry of the slots: from then on the entry is absent.
    /// `hot` is the shard's [`Shard::hot_tat`].
    #[inline]
    pub(super) fn expires_at_us(&self, hot: u64) -> u64 {
        match &*self.slots {
            [slot] => slot.expires_at_us(hot),
            slots => slots
                .iter()
                .map(|slot| slot.expires_at_us(hot))
                .max()
                .unwrap_or(0),
        }
    }

    /// Whether the entry holds its shard's hot slot.
    pub(super) fn is_hot(&self) -> bool {
        self.slots.iter().any(Slot::is_hot)
    }

    /// The position of `policy`'s slot.
    #[inline]
    pub(super) fn slot(&self, policy: &Arc<str>) -> Option<usize> {
        self.slots
            .iter()
            .position(|slot| same_name(&slot.policy, policy))
    }

    /// The state `policy` left, unless it expired.
    #[inline]
    pub(super) fn live_state(
        &self,
        policy: &Arc<str>,
        now: u64,
        hot: u64,
    ) -> Option<Cow<'_, State>> {
        self.slots[self.slot(policy)?].live_state(now, hot)
    }

    /// Stores `state` as `policy`'s, in the slot at `position` if known.
    #[inline(always)]
    pub(super) fn write(
        &mut self,
        names: &mut Vec<Arc<str>>,
        position: Option<usize>,
        policy: &Arc<str>,
        state: State,
        expires_at_us: u64,
    ) {
        match position.and_then(|position| self.slots.get_mut(position)) {
            Some(slot) => slot.state = SlotState::new(state, expires_at_us),
            None => self.add_slot(names, policy, state, expires_at_us),
        }
    }

    #[inline(never)]
    pub(super) fn add_slot(
        &mut self,
        names: &mut Vec<Arc<str>>,
        policy: &Arc<str>,
        state: State,
        expires_at_us: u64,
    ) {
        self.slots.push(Slot {
            policy: intern(names, policy),
            state: SlotState::new(state, expires_at_us),
        });
    }

    /// After writes: drops the slots that expired (policies no longer used
    /// with this subject).
    #[inline]
    pub(super) fn refresh(&mut self, now: u64, hot: u64) {
        if self.slots.len() > 1 {
            self.slots.retain(|slot| slot.expires_at_us(hot) > now);
        }
    }
}

// `repr(C)`: `hot_tat` comes first, on the cache line of the lock word
// (the lock's few bytes precede the shard in its `RwLock`).
#[repr(C)]
pub(super) struct Shard {
    /// The TAT of the shard's hot slot ([`SlotState::Hot`]), if it has
    /// one; charged under the read lock by compare-and-swap.
    pub(super) hot_tat: AtomicU64,
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
    pub(super) names: Vec<Arc<str>>,
}

/// The shared copy of a policy name, interning up to [`MAX_INTERNED_NAMES`]
/// names per shard (applications use a handful; past that, each slot holds
/// the `Arc` of the policy that wrote it).
///
/// The first policy seen with a name lends its own `Arc`, so checks made
/// with clones of that policy find their slot by a pointer comparison.
pub(super) fn intern(names: &mut Vec<Arc<str>>, name: &Arc<str>) -> Arc<str> {
    if let Some(interned) = names.iter().find(|interned| same_name(interned, name)) {
        return Arc::clone(interned);
    }
    if names.len() < MAX_INTERNED_NAMES {
        names.push(Arc::clone(name));
    }
    Arc::clone(name)
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
            hot_hash: None,
            table: HashTable::new(),
            ops: 0,
            cursor: 0,
            evict_cursor: 0,
            min_expires_at_us: u64::MAX,
            pass_min_us: u64::MAX,
            names: Vec::new(),
        }
    }

    /// The bucket of `key`'s entry.
    #[inline(always)]
    pub(super) fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        self.table
            .find_bucket_index(hash, |entry| entry.key.as_slice() == key)
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
        let name = policy.shared_name();
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
                let mut entry = Entry::new(key);
                entry.write(&mut self.names, None, name, state, step.expires_at_us);
                entry.refresh(now, hot);
                self.insert(inner, hash, entry, now)?;
            }
            self.tick(inner, now);
            return Ok(step.decision);
        };
        let position = entry.slot(name);
        let state = position.and_then(|position| entry.slots[position].live_state(now, hot));
        let step = check_policy(policy, state.as_deref(), now, cost);
        if let (true, Some(state)) = (cost > 0, step.new_state) {
            entry.write(&mut self.names, position, name, state, step.expires_at_us);
            entry.refresh(now, hot);
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
        let mut steps: SmallVec<[Step; 2]> = policies
            .iter()
            .map(|policy| {
                let state =
                    entry.and_then(|entry| entry.live_state(policy.shared_name(), now, hot));
                check_policy(policy, state.as_deref(), now, cost)
            })
            .collect();
        if cost > 0 && steps.iter().any(|step| !step.decision.is_allowed()) {
            // Nothing is charged, so the policies that would have admitted
            // report their state as it stays: as a peek does (which writes
            // only a repair).
            for (policy, step) in policies.iter().zip(steps.iter_mut()) {
                if step.decision.is_allowed() {
                    let state =
                        entry.and_then(|entry| entry.live_state(policy.shared_name(), now, hot));
                    *step = check_policy(policy, state.as_deref(), now, 0);
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
        let apply = |entry: &mut Entry, names: &mut Vec<Arc<str>>| {
            for (policy, step) in policies.iter().zip(steps) {
                if let Some(state) = step.new_state {
                    let name = policy.shared_name();
                    let position = entry.slot(name);
                    entry.write(names, position, name, state, step.expires_at_us);
                }
            }
            entry.refresh(now, hot);
        };
        match index.and_then(|index| self.table.get_bucket_mut(index)) {
            Some(entry) => {
                apply(entry, &mut self.names);
                let expires_at_us = entry.expires_at_us(hot);
                self.note_expiry(expires_at_us);
            }
            None => {
                let mut entry = Entry::new(key);
                apply(&mut entry, &mut self.names);
                self.insert(inner, hash, entry, now)?;
            }
        }
        self.tick(inner, now);
        Ok(verdict)
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
