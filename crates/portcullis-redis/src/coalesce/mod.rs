//! Exact coalescing: checks of one subject and policies that arrive while
//! a call for them is in flight wait, and go to Redis together as one call
//! (batch.lua) that decides them one after another in arrival order, as if
//! each had been sent alone at the same instant. A check that finds no
//! call in flight goes at once, alone: nothing ever waits for a batch to
//! fill.
//!
//! [`Coalescer`] keeps, per subject and policies, the checks waiting for
//! the call in flight; the check that made the call holds a [`Lead`], and
//! when its call ends (or it is dropped) the waiting checks are sent by a
//! task on the runtime, in batches of at most [`MAX_BATCH`], until none
//! wait. A waiting check whose request was cancelled before its batch was
//! sent is left out of it: it is never charged. A call that fails
//! store-wide fails the checks that waited for it at once, unsent; a batch
//! that fails fails each of its checks with the same error, and is never
//! sent again.
//!
//! # How long a waiting check waits
//!
//! A check told it failed was not charged, unless the error says it may
//! have been. So a waiting check is either withdrawn before its batch is
//! taken, or, once taken, waits for that batch's answer:
//!
//! - Until its batch is taken it waits at most [`wait_bound`](wait::wait_bound):
//!   `2 × timeout × (1 + batches ahead)`, where the batches ahead are the
//!   call in flight when it joined and one per [`MAX_BATCH`] checks queued
//!   before it. Every Redis call is bounded by the store's timeout, and a
//!   batch usually makes one, two when the fast batch of one policy
//!   (`decide.rs`) hands over to the general one, so the bound is
//!   reached only when the server is
//!   slower than the timeout allows (or a server out of memory makes each
//!   call twice). Then the check withdraws ([`Waiting`]'s state, swapped
//!   atomically against the batch taking it), is never sent, and answers
//!   [`StoreError::Unavailable`] (nothing was charged).
//! - Once its batch is taken it waits for the batch's answer: a verdict,
//!   or the batch call's own error (a timeout of that call may have
//!   charged, and says so). That wait has no clock of its own: every call
//!   the batch makes is bounded by the timeout (two for the
//!   fast-to-general handover, and one per check, in turn, in the rare
//!   batch that finds Functions refused and falls back to scripts), so it
//!   ends.
//!
//! A caller that drops its check (its own deadline, a cancelled request)
//! before the batch is taken is never charged; after, it may be.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;
use portcullis_core::{StoreError, Verdict};
use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::call::{Caller, Target};

mod decide;
mod lane;
mod wait;

use decide::decide;

pub(crate) use lane::{Entry, Lane};

pub(crate) use wait::{wait, Waiting};
use wait::{TAKEN, WAITING};

/// The most checks one coalesced call decides; more wait for the next.
pub(crate) const MAX_BATCH: usize = 128;

/// Shards of the table of calls in flight (a power of two).
const SHARDS: usize = 16;

pub(super) type Reply = Result<Verdict, StoreError>;

/// One shard: the calls in flight, by subject and policies (a check's
/// [`Target`]; the call's own, shared), each with the checks waiting for
/// it. A table with the hashes given (hashbrown's `HashTable`): a check's
/// key is hashed once, when it joins, and its lead keeps the hash for the
/// batches after it (a map would hash the key again on each lookup,
/// insert and remove: six hashes of a target per check, about 1 300
/// instructions).
type Shard<K> = HashTable<Slot<K>>;

/// A call in flight and the checks waiting for it.
struct Slot<K> {
    hash: u64,
    key: K,
    waiting: Vec<Waiter>,
}

/// A check waiting for the call in flight for its subject and policies.
struct Waiter {
    cost: u64,
    reply: oneshot::Sender<Reply>,
    state: Arc<AtomicU8>,
}

/// The calls in flight, by subject and policies, with the checks waiting
/// for each. Keyed by the lead's `Arc<Target>`, so joining a call costs no
/// copy of its keys (and no allocation for the lead); hashed once per
/// check with foldhash, seeded per store (a subject chosen by a client
/// cannot aim at one shard without knowing the seed).
pub(crate) struct Coalescer<K = Arc<Target>> {
    shards: Box<[Mutex<Shard<K>>]>,
    hasher: foldhash::fast::RandomState,
}

impl<K> fmt::Debug for Coalescer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coalescer").finish_non_exhaustive()
    }
}

/// What a check does: make the call itself, or wait for a batch.
pub(crate) enum Join {
    /// No call is in flight: make it (and keep the [`Lead`] until it ends),
    /// with the key's hash for [`Lead::new`].
    Lead(u64),
    /// A call is in flight: this answer comes from a batch to come.
    Wait(Waiting),
}

impl<K: Hash + Eq + Clone> Coalescer<K> {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard<K>> {
        // Middle bits pick the shard: the table uses the low ones for the
        // bucket and the top seven for its tags. `SHARDS` is a power of two.
        let index = (hash >> 32) as usize & (SHARDS - 1);
        // A panic while holding the lock leaves a table that is still
        // consistent (every change is one insert, push or remove).
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the call in flight for `key`, or makes this check the one
    /// that calls.
    pub(crate) fn join(&self, key: &K, cost: u64) -> Join {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        if let Some(Slot { waiting, .. }) = shard.find_mut(hash, |slot| slot.key == *key) {
            let (reply, answer) = oneshot::channel();
            let state = Arc::new(AtomicU8::new(WAITING));
            // The call in flight, and a batch per MAX_BATCH queued before
            // this check (some may be withdrawn or cancelled by then: the
            // bound only grows longer than needed).
            let batches_ahead = 1 + waiting.len() / MAX_BATCH;
            waiting.push(Waiter {
                cost,
                reply,
                state: Arc::clone(&state),
            });
            return Join::Wait(Waiting::new(answer, state, batches_ahead));
        }
        shard.insert_unique(
            hash,
            Slot {
                hash,
                key: key.clone(),
                waiting: Vec::new(),
            },
            |slot| slot.hash,
        );
        Join::Lead(hash)
    }

    /// The call for `key` ended: the next batch (the call stays in flight,
    /// made by the caller), or `None` when no check waits (then nothing
    /// is in flight for `key` any more). Checks whose requests were
    /// cancelled, or that withdrew, are dropped here, uncharged; the ones
    /// taken are marked so, and can no longer withdraw. `hash` is the one
    /// [`Join::Lead`] gave.
    fn next(&self, key: &K, hash: u64) -> Option<Vec<Waiter>> {
        let mut shard = self.shard(hash);
        let Ok(mut slot) = shard.find_entry(hash, |slot| slot.key == *key) else {
            return None;
        };
        let waiting = &mut slot.get_mut().waiting;
        let mut batch = Vec::with_capacity(waiting.len().min(MAX_BATCH));
        let mut rest = Vec::new();
        for waiter in waiting.drain(..) {
            if waiter.reply.is_closed() {
                continue;
            }
            if batch.len() == MAX_BATCH {
                rest.push(waiter);
            } else if waiter
                .state
                .compare_exchange(WAITING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                batch.push(waiter);
            }
        }
        *waiting = rest;
        if batch.is_empty() {
            slot.remove();
            return None;
        }
        Some(batch)
    }
}

/// Held by the check that made the call for `key`: when it is dropped
/// (the call ended, or the request was cancelled), the checks that waited
/// meanwhile are sent.
pub(crate) struct Lead {
    caller: Arc<Caller>,
    coalescer: Arc<Coalescer>,
    /// The call's target: the key of the calls in flight, and what the
    /// batches after it send.
    target: Arc<Target>,
    /// Its hash in the coalescer's table.
    hash: u64,
    /// The store-wide error the call met, if it did: the checks that
    /// waited get it at once, unsent, rather than a second call that would
    /// wait out the same failure.
    failed: Option<StoreError>,
}

impl Lead {
    pub(crate) fn new(
        caller: Arc<Caller>,
        coalescer: Arc<Coalescer>,
        target: Arc<Target>,
        hash: u64,
    ) -> Self {
        Self {
            caller,
            coalescer,
            target,
            hash,
            failed: None,
        }
    }

    /// The call ended with `error`.
    pub(crate) fn failed(&mut self, error: &StoreError) {
        if error.is_store_wide() {
            self.failed = Some(StoreError::Unavailable {
                source: Box::new(Shared::unsent(error)),
            });
        }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        let coalescer = &self.coalescer;
        let Some(waiters) = coalescer.next(&self.target, self.hash) else {
            return;
        };
        let runtime = tokio::runtime::Handle::try_current();
        match (self.failed.take(), runtime) {
            (None, Ok(runtime)) => {
                runtime.spawn(send_batches(
                    Arc::clone(&self.caller),
                    Arc::clone(&self.coalescer),
                    Arc::clone(&self.target),
                    self.hash,
                    waiters,
                ));
            }
            (failed, _) => {
                // Nothing of theirs is sent, so nothing of theirs is
                // charged: the call failed store-wide, or (unreachable: the
                // call that just ended ran on a runtime) there is no
                // runtime to send them on. Each fails, and the subject is
                // free for the next check.
                let error = failed.unwrap_or_else(|| {
                    StoreError::unavailable("no tokio runtime to send the coalesced checks on")
                });
                let mut waiters = Some(waiters);
                while let Some(batch) = waiters
                    .take()
                    .or_else(|| coalescer.next(&self.target, self.hash))
                {
                    for waiter in batch {
                        let _ = waiter.reply.send(Err(share(&error)));
                    }
                }
            }
        }
    }
}

/// Sends the waiting checks of `target` batch after batch until none wait.
async fn send_batches(
    caller: Arc<Caller>,
    coalescer: Arc<Coalescer>,
    target: Arc<Target>,
    hash: u64,
    mut waiters: Vec<Waiter>,
) {
    loop {
        let costs: SmallVec<[u64; 16]> = waiters.iter().map(|w| w.cost).collect();
        match decide(&caller, &target, &costs).await {
            Ok(replies) => {
                for (waiter, reply) in waiters.drain(..).zip(replies) {
                    let _ = waiter.reply.send(reply);
                }
            }
            Err(error) => {
                for waiter in waiters.drain(..) {
                    let _ = waiter.reply.send(Err(share(&error)));
                }
            }
        }
        match coalescer.next(&target, hash) {
            Some(next) => waiters = next,
            None => return,
        }
    }
}

/// The same error for every check of a failed batch: the kind and figures
/// copied, a backend error shared (it stays the `source()`, printed once).
fn share(error: &StoreError) -> StoreError {
    match error {
        StoreError::Timeout { after } => StoreError::Timeout { after: *after },
        StoreError::OutOfMemory { retry_after } => StoreError::OutOfMemory {
            retry_after: *retry_after,
        },
        StoreError::Unavailable { source } => StoreError::Unavailable {
            source: Box::new(Shared::of(&**source)),
        },
        StoreError::OutcomeUnknown { source } => StoreError::OutcomeUnknown {
            source: Box::new(Shared::of(&**source)),
        },
        StoreError::Rejected { source } => StoreError::Rejected {
            source: Box::new(Shared::of(&**source)),
        },
        StoreError::Protocol { detail } => StoreError::Protocol {
            detail: detail.clone(),
        },
        other => StoreError::OutcomeUnknown {
            source: other.to_string().into(),
        },
    }
}

/// A backend error shown to several checks: its text and its causes.
struct Shared {
    text: String,
    source: Option<Box<Shared>>,
}

impl Shared {
    /// The cause of a check left unsent because the call in flight for its
    /// subject failed with `error`.
    fn unsent(error: &StoreError) -> Self {
        Self {
            text: "not sent: the call in flight before this check failed".to_owned(),
            source: Some(Box::new(Self::of(error))),
        }
    }

    fn of(error: &(dyn std::error::Error + 'static)) -> Self {
        Self {
            text: error.to_string(),
            source: error.source().map(|cause| Box::new(Self::of(cause))),
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Display for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|cause| cause as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<K: Hash + Eq + Clone> Coalescer<K> {
        /// [`Coalescer::next`] with the key hashed again (as its lead's
        /// hash would be).
        pub(super) fn next_of(&self, key: &K) -> Option<Vec<Waiter>> {
            self.next(key, self.hasher.hash_one(key))
        }
    }

    #[test]
    fn the_first_check_leads_and_the_others_wait_in_order() {
        let coalescer = Coalescer::<&str>::new();
        assert!(matches!(coalescer.join(&"k", 1), Join::Lead(_)));
        let waits: Vec<_> = (2..5)
            .map(|cost| match coalescer.join(&"k", cost) {
                Join::Wait(waiting) => waiting,
                Join::Lead(_) => panic!("a second leader while a call is in flight"),
            })
            .collect();
        // Another subject is not held up.
        assert!(matches!(coalescer.join(&"other", 1), Join::Lead(_)));
        let batch = coalescer.next_of(&"k").expect("three wait");
        assert_eq!(batch.iter().map(|w| w.cost).collect::<Vec<_>>(), [2, 3, 4]);
        drop(waits);
        // Still in flight (the batch), so a new check waits.
        assert!(matches!(coalescer.join(&"k", 9), Join::Wait(_)));
        // Its request was dropped: it is left out, and the key is free.
        assert!(coalescer.next_of(&"k").is_none());
        assert!(matches!(coalescer.join(&"k", 1), Join::Lead(_)));
    }

    fn waiting(join: Join) -> Waiting {
        match join {
            Join::Wait(waiting) => waiting,
            Join::Lead(_) => panic!("a second leader while a call is in flight"),
        }
    }

    #[test]
    fn a_check_queued_behind_full_batches_waits_for_each() {
        let coalescer = Coalescer::<&str>::new();
        assert!(matches!(coalescer.join(&"k", 1), Join::Lead(_)));
        let waits: Vec<_> = (0..MAX_BATCH * 2 + 1)
            .map(|_| waiting(coalescer.join(&"k", 1)))
            .collect();
        let ahead: Vec<usize> = waits.iter().map(Waiting::batches_ahead).collect();
        assert_eq!(ahead[0], 1, "the call in flight");
        assert_eq!(ahead[MAX_BATCH - 1], 1);
        assert_eq!(ahead[MAX_BATCH], 2, "and the first batch");
        assert_eq!(ahead[MAX_BATCH * 2], 3);
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_checks() {
        let coalescer = Coalescer::<&str>::new();
        assert!(matches!(coalescer.join(&"k", 1), Join::Lead(_)));
        let _waits: Vec<_> = (0..MAX_BATCH + 3)
            .map(|_| coalescer.join(&"k", 1))
            .collect();
        assert_eq!(coalescer.next_of(&"k").map(|b| b.len()), Some(MAX_BATCH));
        assert_eq!(coalescer.next_of(&"k").map(|b| b.len()), Some(3));
        assert!(coalescer.next_of(&"k").is_none());
    }

    #[test]
    fn a_shared_error_keeps_its_kind_and_its_cause_once() {
        let redis = redis::RedisError::from((redis::ErrorKind::Io, "connection reset"));
        let error = StoreError::OutcomeUnknown {
            source: Box::new(redis),
        };
        let shared = share(&error);
        assert!(matches!(shared, StoreError::OutcomeUnknown { .. }));
        assert_eq!(shared.to_string(), error.to_string());
        let cause = std::error::Error::source(&shared).expect("the cause is kept");
        assert!(cause.to_string().contains("connection reset"), "{cause}");
        assert_eq!(
            std::error::Error::source(&error).map(ToString::to_string),
            Some(cause.to_string())
        );
    }
}
