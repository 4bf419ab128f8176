//! The [`ReservationStore`] impl of [`MemoryStore`]: a reserve and a
//! settle are each one critical section under the subject's shard write
//! lock (`table/reserve.rs`), over the reservation table in
//! `memory/reservations.rs`.

use std::future::{ready, Future};

use super::MemoryStore;
use crate::memory::key::Key;
use crate::{
    validate_reserve, validate_settle, ReservationId, ReservationStore, Reserved, Settlement,
    StoreError, TokenBudget,
};

impl MemoryStore {
    /// Token reservations held in all shards (open or settled, live or
    /// expired but not yet swept): at most [`MemoryStore::max_keys`] in
    /// all (or 16 per shard when that is more), and at most 1 024 per
    /// subject and budget.
    ///
    /// ```
    /// use portcullis::{MemoryStore, Policy, ReservationId, ReservationStore, TokenBudget};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let budget = TokenBudget::tokens(Policy::per_minute(1_000).build()?).build()?;
    /// store.reserve("key-1", &budget, 100, ReservationId::generate()).await?;
    /// assert_eq!(store.reservations(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn reservations(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| shard.read().reservations.len())
            .sum()
    }

    fn reserve_now(
        &self,
        subject: &str,
        budget: &TokenBudget,
        estimate: u64,
        id: ReservationId,
    ) -> Result<Reserved, StoreError> {
        let estimate = validate_reserve(budget, estimate)?;
        let key = Key::new(subject);
        let key = key.as_bytes();
        let hash = self.inner.hash_key(key);
        let now = self.inner.clock.now_micros();
        self.on_shard(hash, now, |shard, inner| {
            shard.reserve(inner, hash, key, budget, estimate, id.as_u128(), now)
        })
    }

    fn settle_now(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
        used: u64,
    ) -> Result<Settlement, StoreError> {
        let used = validate_settle(budget, used)?;
        let key = Key::new(subject);
        let key = key.as_bytes();
        let hash = self.inner.hash_key(key);
        let now = self.inner.clock.now_micros();
        self.on_shard(hash, now, |shard, inner| {
            shard.settle(inner, hash, key, budget, id.as_u128(), used, now)
        })
    }

    fn renew_now(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
    ) -> Result<bool, StoreError> {
        let key = Key::new(subject);
        let key = key.as_bytes();
        let hash = self.inner.hash_key(key);
        let now = self.inner.clock.now_micros();
        self.on_shard(hash, now, |shard, inner| {
            Ok(shard.renew(inner, key, budget, id.as_u128(), now))
        })
    }
}

impl ReservationStore for MemoryStore {
    fn reserve(
        &self,
        subject: &str,
        budget: &TokenBudget,
        estimate: u64,
        id: ReservationId,
    ) -> impl Future<Output = Result<Reserved, StoreError>> + Send + 'static {
        ready(self.reserve_now(subject, budget, estimate, id))
    }

    fn settle(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
        used: u64,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send + 'static {
        ready(self.settle_now(subject, budget, id, used))
    }

    fn renew(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static {
        ready(self.renew_now(subject, budget, id))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{
        Algorithm, ManualClock, MemoryStore, Policy, Refusal, ReservationId, ReservationStore,
        SettleOutcome, Store, TokenBudget,
    };

    const T0: u64 = 1_700_000_000_000_000;

    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        futures::executor::block_on(future)
    }

    fn budget(algorithm: Algorithm) -> TokenBudget {
        TokenBudget::tokens(
            Policy::per_minute(1_000)
                .algorithm(algorithm)
                .name("tokens")
                .build()
                .unwrap(),
        )
        .requests(Policy::per_minute(5).name("requests").build().unwrap())
        .max_in_flight(3)
        .max_overage(200)
        .reservation_ttl(Duration::from_secs(10))
        .build()
        .unwrap()
    }

    #[test]
    fn reserve_refund_overage_and_replay() {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let store = MemoryStore::with_clock(ManualClock::new(T0));
            let budget = budget(algorithm);
            let a = ReservationId::generate();
            let r = run(store.reserve("k", &budget, 600, a)).unwrap();
            assert!(r.is_admitted());
            assert_eq!(r.in_flight(), 1);
            assert_eq!(r.verdict().decisions()[0].remaining(), 400);
            assert_eq!(r.verdict().decisions()[1].remaining(), 4);
            // A retried reserve charges nothing again.
            let again = run(store.reserve("k", &budget, 600, a)).unwrap();
            assert!(again.is_admitted() && again.is_replay());
            assert_eq!(again.verdict().decisions()[0].remaining(), 400);
            // 600 more do not fit: refused by the token policy, nothing
            // charged (the request count stays).
            let b = run(store.reserve("k", &budget, 600, ReservationId::generate())).unwrap();
            assert_eq!(b.refusal(), Some(Refusal::Policy { index: 0 }));
            assert!(b.retry_after().is_some());
            assert_eq!(b.verdict().decisions()[1].remaining(), 4);
            // Used 100: 500 refunded.
            let s = run(store.settle("k", &budget, a, 100)).unwrap();
            assert_eq!(s.outcome(), SettleOutcome::Settled);
            assert_eq!((s.refunded(), s.charged()), (500, 100));
            assert_eq!(s.verdict().decisions()[0].remaining(), 900);
            let s = run(store.settle("k", &budget, a, 100)).unwrap();
            assert_eq!(s.outcome(), SettleOutcome::Replayed);
            assert_eq!(s.verdict().decisions()[0].remaining(), 900);
            // Used 1 000 of 100: 200 of overage charged, 700 forgiven.
            let c = ReservationId::generate();
            assert!(run(store.reserve("k", &budget, 100, c))
                .unwrap()
                .is_admitted());
            let s = run(store.settle("k", &budget, c, 1_000)).unwrap();
            assert_eq!((s.overage(), s.charged(), s.forgiven()), (200, 300, 700));
            assert_eq!(s.verdict().decisions()[0].remaining(), 600);
            let peek = run(store.peek("k", &budget.policies()[..1])).unwrap();
            assert_eq!(peek.decisions()[0].remaining(), 600, "{algorithm:?}");
        }
    }

    #[test]
    fn places_in_flight_are_freed_by_settling_or_by_the_ttl() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        let budget = budget(Algorithm::Gcra);
        let ids: Vec<_> = (0..3).map(|_| ReservationId::generate()).collect();
        for id in &ids {
            assert!(run(store.reserve("k", &budget, 10, *id))
                .unwrap()
                .is_admitted());
        }
        let full = run(store.reserve("k", &budget, 10, ReservationId::generate())).unwrap();
        assert_eq!(full.refusal(), Some(Refusal::InFlight { max: 3 }));
        assert_eq!(full.retry_after(), Some(Duration::from_secs(10)));
        assert_eq!(full.in_flight(), 3);
        // Another subject is not affected.
        assert!(
            run(store.reserve("other", &budget, 10, ReservationId::generate()))
                .unwrap()
                .is_admitted()
        );
        run(store.settle("k", &budget, ids[0], 10)).unwrap();
        assert!(
            run(store.reserve("k", &budget, 10, ReservationId::generate()))
                .unwrap()
                .is_admitted()
        );
        // Never settled: the places come back after the TTL, the estimates
        // stay charged, and a late settle charges nothing.
        clock.advance(Duration::from_secs(10));
        let late = run(store.settle("k", &budget, ids[1], 500)).unwrap();
        assert_eq!(late.outcome(), SettleOutcome::Unknown);
        assert_eq!(late.charged(), 0);
        let r = run(store.reserve("k", &budget, 10, ReservationId::generate())).unwrap();
        assert!(r.is_admitted(), "{r:?}");
        assert_eq!(r.in_flight(), 1);
    }

    #[test]
    fn bad_budgets_and_estimates_are_refused() {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let budget = budget(Algorithm::Gcra);
        let err = run(store.reserve("k", &budget, 1_001, ReservationId::generate())).unwrap_err();
        assert!(
            matches!(err, crate::StoreError::CostTooHigh { .. }),
            "{err}"
        );
        let window = TokenBudget::tokens(
            Policy::per_minute(10)
                .algorithm(Algorithm::SlidingLog)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
        let err = run(store.reserve("k", &window, 1, ReservationId::generate())).unwrap_err();
        assert!(
            matches!(err, crate::StoreError::Unsupported { .. }),
            "{err}"
        );
        assert_eq!(store.reservations(), 0);
        assert_eq!(store.len(), 0);
    }
}
