//! The plan resolver's cache: entries in 16 shards, each a hash table
//! under a mutex, bounded (capacity, lookups in flight) and evicting
//! unknown and failed subjects first, then the least recently used; the
//! lookups it runs as Tokio tasks, whose panics are caught and whose
//! cancellation frees their subject.

use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use foldhash::fast::FixedState;
use hashbrown::HashTable;
use parking_lot::Mutex;
use portcullis_core::PolicySource;
use tokio::sync::watch;
use tokio::time::Instant;

use super::compiled::{apply, Compiled};
use super::plan::{
    BoxError, Cached, Lookup, LookupFn, LookupFuture, LookupKey, Picked, Plan, ResolverFailure,
};
use crate::key::RequestHead;
use crate::rate_limit::tier::Tier;

/// The cache's shards, each a hash table under its own mutex.
pub(super) const SHARDS: usize = 16;

pub(super) struct ResolverInner {
    pub(super) lookup: Box<LookupFn>,
    pub(super) lookup_key: Option<Box<dyn LookupKey>>,
    pub(super) ttl: Duration,
    pub(super) unknown_ttl: Duration,
    pub(super) error_ttl: Duration,
    pub(super) timeout: Duration,
    pub(super) on_failure: ResolverFailure,
    pub(super) per_shard: usize,
    pub(super) max_lookups: usize,
    /// Lookups running now (at most `max_lookups`).
    pub(super) in_flight: AtomicUsize,
    /// Identifies each lookup, so that a late answer or a cancelled lookup
    /// touches only the entry it made.
    pub(super) next_lookup: AtomicU64,
    pub(super) shards: Box<[Mutex<Shard>]>,
    pub(super) hasher: FixedState,
    /// Failures, logged at most once per second.
    pub(super) failures: crate::breaker::UndecidedLog,
    /// Requests answered by the defaults because of the bounds.
    pub(super) skipped: crate::breaker::UndecidedLog,
}

/// The tier a cached answer gave under one version of the limits, so that
/// a hit needs no second lookup; `missing` names the tier the plan wanted
/// when the limits lack it.
pub(super) struct Resolved {
    version: u64,
    tier: Arc<Tier>,
    missing: Option<Arc<str>>,
}

pub(super) enum Entry {
    Ready {
        value: Cached,
        expires: Instant,
        resolved: Option<Resolved>,
    },
    Loading {
        id: u64,
        receiver: watch::Receiver<Option<Cached>>,
    },
}

pub(super) struct Slot {
    pub(super) key: Box<str>,
    pub(super) entry: Entry,
    /// The shard's clock when the entry was last used.
    pub(super) used: u64,
}

#[derive(Default)]
pub(super) struct Shard {
    pub(super) table: HashTable<Slot>,
    /// Counts uses, for the least-recently-used order.
    pub(super) clock: u64,
}

impl ResolverInner {
    pub(super) fn shard(&self, hash: u64) -> &Mutex<Shard> {
        // The hash only spreads keys over shards; truncating it is fine.
        #[allow(clippy::cast_possible_truncation)]
        let index = (hash as usize) % SHARDS;
        &self.shards[index]
    }

    /// Removes `key`'s entry; whether it had one.
    pub(super) fn remove(&self, key: &str) -> bool {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash).lock();
        match shard.table.find_entry(hash, |slot| &*slot.key == key) {
            Ok(slot) => {
                slot.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Takes one of the lookups in flight, if the bound allows.
    fn reserve_lookup(&self) -> bool {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_lookups).then_some(n + 1)
            })
            .is_ok()
    }

    /// The tier for `key` (the key of `request`) from its cached plan
    /// under `compiled`, or a lookup to wait for (started here unless one
    /// is in flight), or the defaults when the bounds allow no lookup.
    pub(super) fn pick(
        self: &Arc<Self>,
        request: &RequestHead<'_>,
        key: &str,
        compiled: &Compiled,
    ) -> Picked {
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        shard.clock += 1;
        let now_used = shard.clock;
        let mut stale = None;
        if let Some(slot) = shard.table.find_mut(hash, |slot| &*slot.key == key) {
            match &mut slot.entry {
                Entry::Ready {
                    value,
                    expires,
                    resolved,
                } => {
                    if Instant::now() < *expires {
                        slot.used = now_used;
                        return self.hit(compiled, value, resolved);
                    }
                    stale = Some(value.clone());
                }
                Entry::Loading { receiver, .. } => {
                    slot.used = now_used;
                    return Picked::Later(wait(receiver.clone()));
                }
            }
        }
        let Some(lookup_key) = self.lookup_key_of(request, key) else {
            return apply(compiled, self.on_failure, &Cached::Defaults).0;
        };
        if !self.reserve_lookup() {
            drop(guard);
            return self.skip(compiled, stale.as_ref());
        }
        if stale.is_none() && !self.make_room(shard) {
            drop(guard);
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return self.skip(compiled, None);
        }
        let id = self.next_lookup.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = watch::channel(None);
        let loading = Entry::Loading {
            id,
            receiver: receiver.clone(),
        };
        match shard.table.find_mut(hash, |slot| &*slot.key == key) {
            Some(slot) => {
                slot.entry = loading;
                slot.used = now_used;
            }
            None => {
                shard.table.insert_unique(
                    hash,
                    Slot {
                        key: key.into(),
                        entry: loading,
                        used: now_used,
                    },
                    |slot| self.hasher.hash_one(&*slot.key),
                );
            }
        }
        drop(guard);
        let flight = Flight {
            inner: Arc::clone(self),
            key: key.into(),
            id,
            answered: false,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(flight.run(lookup_key, sender));
            }
            Err(_) => {
                tracing::error!("the rate limit's plan resolver needs a Tokio runtime; the subject's lookup failed");
                let mut flight = flight;
                flight.answer(Cached::Failed);
            }
        }
        Picked::Later(wait(receiver))
    }

    /// A fresh cached answer.
    fn hit(&self, compiled: &Compiled, value: &Cached, resolved: &mut Option<Resolved>) -> Picked {
        if let Some(done) = resolved.as_ref().filter(|r| r.version == compiled.version) {
            if let Some(tier) = &done.missing {
                compiled.count_missing(tier);
            }
            return Picked::Live(Arc::clone(&done.tier));
        }
        let (picked, missing) = apply(compiled, self.on_failure, value);
        if let Picked::Live(tier) = &picked {
            *resolved = Some(Resolved {
                version: compiled.version,
                tier: Arc::clone(tier),
                missing,
            });
        }
        picked
    }

    fn lookup_key_of(&self, request: &RequestHead<'_>, key: &str) -> Option<String> {
        match &self.lookup_key {
            Some(lookup_key) => lookup_key.lookup_key(request, key),
            None => Some(key.to_owned()),
        }
    }

    /// The answer when the bounds allow no lookup: the plan as it was, if
    /// one expired, else the defaults.
    fn skip(&self, compiled: &Compiled, stale: Option<&Cached>) -> Picked {
        #[cfg(feature = "metrics")]
        metrics::counter!("portcullis_resolver_skipped_total").increment(1);
        if let Some(count) = self.skipped.record() {
            tracing::warn!(
                count,
                max_lookups = self.max_lookups,
                "rate limit plan lookups at their bound: {count} requests of uncached subjects were checked under the defaults (or their expired plan) without a lookup since the last such warning"
            );
        }
        apply(
            compiled,
            self.on_failure,
            stale.unwrap_or(&Cached::Defaults),
        )
        .0
    }

    /// Frees room for one entry in a shard: expired entries go, then, if
    /// it is still full, an eighth of it (unknown and failed subjects
    /// first, then the least recently used). Lookups in flight stay;
    /// `false` when they fill the shard.
    pub(super) fn make_room(&self, shard: &mut Shard) -> bool {
        if shard.table.len() < self.per_shard {
            return true;
        }
        let now = Instant::now();
        shard.table.retain(|slot| match &slot.entry {
            Entry::Ready { expires, .. } => *expires > now,
            Entry::Loading { .. } => true,
        });
        if shard.table.len() < self.per_shard {
            return true;
        }
        // Rank the ready entries: negative ones first, then by last use.
        let mut ranks: Vec<(bool, u64)> = shard
            .table
            .iter()
            .filter_map(|slot| match &slot.entry {
                Entry::Ready { value, .. } => Some((!value.is_negative(), slot.used)),
                Entry::Loading { .. } => None,
            })
            .collect();
        if ranks.is_empty() {
            return false;
        }
        let batch = (self.per_shard / 8).clamp(1, ranks.len());
        let (_, &mut threshold, _) = ranks.select_nth_unstable(batch - 1);
        // `used` values are distinct within a shard, so exactly `batch`
        // entries rank at or below the threshold.
        shard.table.retain(|slot| match &slot.entry {
            Entry::Ready { value, .. } => (!value.is_negative(), slot.used) > threshold,
            Entry::Loading { .. } => true,
        });
        true
    }

    /// Caches lookup `id`'s answer, if its entry is still there (not
    /// invalidated, not evicted).
    fn finish(&self, key: &str, id: u64, value: Cached) {
        let ttl = match &value {
            Cached::Defaults => self.unknown_ttl,
            Cached::Failed => self.error_ttl,
            Cached::Tier(_) | Cached::Own(_) => self.ttl,
        };
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash).lock();
        let Ok(mut slot) = shard.table.find_entry(hash, |slot| {
            &*slot.key == key && matches!(slot.entry, Entry::Loading { id: mine, .. } if mine == id)
        }) else {
            return;
        };
        if ttl.is_zero() {
            slot.remove();
        } else {
            slot.get_mut().entry = Entry::Ready {
                value,
                expires: Instant::now() + ttl,
                resolved: None,
            };
        }
    }

    /// Counts and logs (at most once per second) a failed lookup.
    fn failed(&self, key: &str, reason: &'static str, error: &dyn fmt::Display) {
        #[cfg(feature = "metrics")]
        metrics::counter!("portcullis_resolver_failures_total", "reason" => reason).increment(1);
        tracing::debug!(key, reason, %error, "plan lookup failed");
        if let Some(count) = self.failures.record() {
            tracing::warn!(
                reason,
                %error,
                count,
                on_failure = ?self.on_failure,
                "rate limit plan lookups failing: {count} since the last such warning"
            );
        }
    }

    /// Runs one lookup for `key` (the layer's key; `lookup_key` is what
    /// the lookup is given and never logged).
    async fn look_up(&self, key: &str, lookup_key: String) -> Cached {
        let lookup = CatchPanic((self.lookup)(lookup_key));
        let outcome = tokio::time::timeout(self.timeout, lookup).await;
        let (value, failure) = match outcome {
            Ok(Ok(Ok(None) | Ok(Some(Plan::Default)))) => (Cached::Defaults, None),
            Ok(Ok(Ok(Some(Plan::Tier(tier))))) => (Cached::Tier(tier.into()), None),
            Ok(Ok(Ok(Some(Plan::Policies(policies))))) => {
                match Tier::new_live(key, policies, PolicySource::Resolver, 0) {
                    Ok(tier) => (Cached::Own(Arc::new(tier)), None),
                    Err(error) => (Cached::Failed, Some(("invalid", error.to_string()))),
                }
            }
            Ok(Ok(Err(error))) => (Cached::Failed, Some(("error", error.to_string()))),
            Ok(Err(Panicked)) => (
                Cached::Failed,
                Some(("panic", "the lookup panicked".to_owned())),
            ),
            Err(_) => (
                Cached::Failed,
                Some(("timeout", format!("no answer within {:?}", self.timeout))),
            ),
        };
        #[cfg(feature = "metrics")]
        {
            let outcome = match &value {
                Cached::Defaults => "unknown",
                Cached::Failed => "failed",
                _ => "found",
            };
            metrics::counter!("portcullis_resolver_lookups_total", "outcome" => outcome)
                .increment(1);
        }
        if let Some((reason, error)) = failure {
            self.failed(key, reason, &error);
        }
        value
    }
}

/// One lookup in flight: holds its place in the bound on lookups, and if
/// dropped before it answered (its task cancelled: the runtime shut down)
/// frees its subject's entry.
struct Flight {
    inner: Arc<ResolverInner>,
    key: Box<str>,
    id: u64,
    answered: bool,
}

impl Flight {
    async fn run(mut self, lookup_key: String, sender: watch::Sender<Option<Cached>>) {
        let value = self.inner.look_up(&self.key, lookup_key).await;
        self.answer(value.clone());
        let _ = sender.send(Some(value));
    }

    fn answer(&mut self, value: Cached) {
        self.inner.finish(&self.key, self.id, value);
        self.answered = true;
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.inner.in_flight.fetch_sub(1, Ordering::AcqRel);
        if !self.answered {
            let hash = self.inner.hasher.hash_one(&*self.key);
            let mut shard = self.inner.shard(hash).lock();
            if let Ok(slot) = shard.table.find_entry(hash, |slot| {
                *slot.key == *self.key
                    && matches!(slot.entry, Entry::Loading { id, .. } if id == self.id)
            }) {
                slot.remove();
            }
            drop(shard);
            self.inner.failed(
                &self.key,
                "cancelled",
                &"the lookup was cancelled before it answered",
            );
        }
    }
}

/// A lookup's panic, caught.
struct Panicked;

/// Catches a panic of the lookup, so that it is answered as a failure.
struct CatchPanic(LookupFuture);

impl Future for CatchPanic {
    type Output = Result<Result<Option<Plan>, BoxError>, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(answer)) => Poll::Ready(Ok(answer)),
            Err(_) => Poll::Ready(Err(Panicked)),
        }
    }
}

fn wait(mut receiver: watch::Receiver<Option<Cached>>) -> Lookup {
    Box::pin(async move {
        match receiver.wait_for(Option::is_some).await {
            Ok(value) => value.clone().unwrap_or(Cached::Failed),
            // The lookup ended without an answer (cancelled).
            Err(_) => Cached::Failed,
        }
    })
}
