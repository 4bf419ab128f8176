//! The local deny cache: subjects the store denied, until their retry time.
//!
//! When the store denies cost `c` for a subject with retry-after `r`, no
//! request of cost `c` or more can be admitted for that subject before
//! `r` has passed: denials charge nothing, other requests only use up more
//! of the quota, and every algorithm needs at least as long for a larger
//! cost. Only an explicit reset can make the subject's state better sooner
//! (and [`RateLimitLayer::reset`](crate::RateLimitLayer::reset) clears the
//! cache). So answering those requests locally until then is exact. The
//! deadline is measured from when the check was *sent*, which is never
//! later than when the store evaluated it, so the cache never denies longer
//! than the store would.
//!
//! Time is the layer's [`LayerClock`]: tokio's clock by default (so a test
//! on paused tokio time moves it), or the clock given to
//! [`RateLimitLayerBuilder::clock`](crate::RateLimitLayerBuilder::clock),
//! which a test shares with its store to move both at once.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::{FixedState, RandomState};
use parking_lot::Mutex;
use portcullis_core::{Clock, Decision, Verdict};
use tokio::time::Instant;

/// The time the deny cache holds denials in, in µs.
#[derive(Debug, Clone)]
pub(crate) enum LayerClock {
    /// Tokio's clock, from when the layer was built.
    Tokio(Instant),
    /// A clock the user gave (in tests, the store's manual clock).
    Given(Arc<dyn Clock>),
}

impl LayerClock {
    pub(crate) fn now_us(&self) -> u64 {
        match self {
            Self::Tokio(base) => micros(base.elapsed()),
            Self::Given(clock) => clock.now_micros(),
        }
    }

    /// `sent` (tokio's clock) in this clock: exact for tokio's own; for a
    /// given clock, its now less the time since `sent`.
    fn at(&self, sent: Instant) -> u64 {
        match self {
            Self::Tokio(base) => micros(sent.saturating_duration_since(*base)),
            Self::Given(clock) => clock.now_micros().saturating_sub(micros(sent.elapsed())),
        }
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

const SHARDS: usize = 16;

#[derive(Debug)]
struct Entry {
    /// When the check that was denied was sent, in the cache's clock's µs.
    sent: u64,
    /// `sent + retry_after`.
    until: u64,
    /// The cost denied; smaller costs may still be admitted.
    min_cost: u64,
    verdict: Verdict,
    /// The tier object denied (a changed limit makes a new one).
    tier_id: u64,
}

type Shard = Mutex<HashMap<Box<str>, Entry, RandomState>>;

#[derive(Debug)]
pub(crate) struct DenyCache {
    /// `tiers × SHARDS` maps, tier-major.
    shards: Box<[Shard]>,
    per_shard: usize,
    len: AtomicUsize,
    hasher: FixedState,
    clock: LayerClock,
}

impl DenyCache {
    pub(crate) fn new(tiers: usize, max_entries: usize, clock: LayerClock) -> Self {
        let count = tiers.max(1) * SHARDS;
        Self {
            shards: (0..count).map(|_| Mutex::new(HashMap::default())).collect(),
            per_shard: (max_entries / count).max(1),
            len: AtomicUsize::new(0),
            hasher: FixedState::default(),
            clock,
        }
    }

    fn shard(&self, tier: usize, key: &str) -> Option<&Shard> {
        // The hash only spreads keys over shards; truncating it is fine.
        #[allow(clippy::cast_possible_truncation)]
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        self.shards.get(tier * SHARDS + index)
    }

    /// Whether no denial is held (then [`get`](Self::get) answers `None`
    /// and the caller need not read the clock).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// The denial still in force for `key` now for a request of `cost`,
    /// with its durations counted down to now.
    pub(crate) fn get(&self, tier: usize, tier_id: u64, key: &str, cost: u64) -> Option<Verdict> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = self.clock.now_us();
        let mut shard = self.shard(tier, key)?.lock();
        let entry = shard.get(key)?;
        if now >= entry.until || entry.tier_id != tier_id {
            shard.remove(key);
            self.len.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if cost < entry.min_cost {
            return None;
        }
        let elapsed = Duration::from_micros(now.saturating_sub(entry.sent));
        Some(count_down(&entry.verdict, elapsed))
    }

    /// Remembers a denial of `cost` for `key` from a check sent at `sent`
    /// (tokio's clock; moved into the cache's clock by the time since).
    pub(crate) fn insert(
        &self,
        tier: usize,
        tier_id: u64,
        key: &str,
        cost: u64,
        verdict: &Verdict,
        sent: Instant,
    ) {
        let Some(retry_after) = verdict.retry_after().filter(|r| !r.is_zero()) else {
            return;
        };
        let Some(shard) = self.shard(tier, key) else {
            return;
        };
        let sent = self.clock.at(sent);
        let until = sent.saturating_add(micros(retry_after));
        let mut shard = shard.lock();
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            let now = self.clock.now_us();
            let before = shard.len();
            shard.retain(|_, entry| entry.until > now);
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let entry = Entry {
            sent,
            until,
            min_cost: cost,
            verdict: verdict.clone(),
            tier_id,
        };
        if shard.insert(key.into(), entry).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets `key` in every tier.
    pub(crate) fn remove(&self, key: &str) {
        let tiers = self.shards.len() / SHARDS;
        for tier in 0..tiers {
            if let Some(shard) = self.shard(tier, key)
                && shard.lock().remove(key).is_some()
            {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

/// The verdict as the store would report it `elapsed` later, if nothing
/// else happened: retry-after and reset-after shortened.
fn count_down(verdict: &Verdict, elapsed: Duration) -> Verdict {
    verdict
        .decisions()
        .iter()
        .map(|d| {
            let reset_after = d.reset_after().saturating_sub(elapsed);
            match d.retry_after() {
                Some(retry) => Decision::denied(
                    d.limit(),
                    d.remaining(),
                    retry.saturating_sub(elapsed),
                    reset_after,
                ),
                None => Decision::allowed(d.limit(), d.remaining(), reset_after),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry_ms: u64) -> Verdict {
        Verdict::from_iter([
            Decision::allowed(100, 50, Duration::from_secs(10)),
            Decision::denied(
                5,
                0,
                Duration::from_millis(retry_ms),
                Duration::from_secs(5),
            ),
        ])
    }

    #[test]
    fn denies_until_the_retry_time_for_equal_or_larger_costs() {
        let clock = Arc::new(portcullis_core::ManualClock::new(1_000_000));
        let cache = DenyCache::new(2, 1000, LayerClock::Given(clock.clone()));
        cache.insert(0, 0, "alice", 2, &denied(1000), Instant::now());
        assert_eq!(cache.len(), 1);
        clock.advance(Duration::from_millis(400));
        let hit = cache.get(0, 0, "alice", 2).unwrap();
        // Up to the real microseconds between the insert and the clock
        // reading inside it, subtracted as the check's round trip.
        let retry = hit.retry_after().unwrap();
        assert!(retry <= Duration::from_millis(600) && retry > Duration::from_millis(500));
        assert!(!hit.is_allowed());
        assert!(cache.get(0, 0, "alice", 3).is_some());
        assert!(
            cache.get(0, 0, "alice", 1).is_none(),
            "a smaller cost may fit"
        );
        assert!(cache.get(1, 0, "alice", 2).is_none(), "other tier");
        assert!(cache.get(0, 0, "bob", 2).is_none());
        clock.advance(Duration::from_millis(600));
        assert!(cache.get(0, 0, "alice", 2).is_none());
        assert_eq!(cache.len(), 0, "expired entries are dropped");
    }

    #[test]
    fn bounded_and_removable() {
        let tokio = || LayerClock::Tokio(Instant::now());
        let cache = DenyCache::new(1, SHARDS * 2, tokio());
        let t0 = Instant::now();
        for i in 0..1000 {
            cache.insert(0, 0, &format!("k{i}"), 1, &denied(60_000), t0);
        }
        assert!(cache.len() <= SHARDS * 2);
        cache.insert(0, 0, "zero", 1, &denied(0), t0);
        assert!(cache.get(0, 0, "zero", 1).is_none());
        let cache = DenyCache::new(3, 100, tokio());
        cache.insert(2, 0, "x", 1, &denied(5000), t0);
        cache.remove("x");
        assert!(cache.get(2, 0, "x", 1).is_none());
        assert_eq!(cache.len(), 0);
    }
}
