//! [`Store::charge`](crate::Store::charge) for [`MemoryStore`]: every
//! policy of the subject charged after the fact with
//! [`algorithms::charge`](crate::algorithms::charge), in one critical
//! section under the shard's write lock ([`Shard::charge_many`](crate::memory::table::Shard)); the
//! GCRA hot path then reads the states it leaves like any other.

use super::MemoryStore;
use crate::memory::key::Key;
use crate::{validate_charge, Policy, StoreError, Verdict};

impl MemoryStore {
    /// [`Store::charge`](crate::Store::charge), answered at once.
    pub(super) fn charge_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        validate_charge(policies)?;
        let key = Key::new(subject);
        let key = key.as_bytes();
        let hash = self.inner.hash_key(key);
        let now = self.inner.clock.now_micros();
        self.on_shard(hash, now, |shard, inner| {
            shard.charge_many(inner, hash, key, policies, now, cost)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, ManualClock, MemoryStore, Policy, Store, StoreError};

    const T0: u64 = 1_700_000_000_000_000;

    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        futures::executor::block_on(future)
    }

    #[test]
    fn a_charge_is_seen_by_the_next_check_and_the_hot_path() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_clock(clock.clone());
        // Whole emission interval (6 ms): the GCRA hot path applies.
        let p = [Policy::per_minute(10_000).name("tokens").build().unwrap()];
        assert!(run(store.check("k", &p, 1)).unwrap().is_allowed());
        let after = run(store.charge("k", &p, 12_000)).unwrap();
        assert!(!after.is_allowed());
        assert!(!run(store.check("k", &p, 1)).unwrap().is_allowed());
        assert!(!run(store.peek("k", &p)).unwrap().is_allowed());
        let retry = after.retry_after().unwrap();
        // 1 + 12 000 charged: 2 001 tokens of debt and one more, 6 ms each.
        assert_eq!(retry, Duration::from_micros(12_012_000));
        clock.advance(retry - Duration::from_micros(1));
        assert!(!run(store.check("k", &p, 1)).unwrap().is_allowed());
        clock.advance(Duration::from_micros(1));
        assert!(run(store.check("k", &p, 1)).unwrap().is_allowed());
    }

    #[test]
    fn every_policy_is_charged_and_unsupported_ones_are_refused() {
        let store = MemoryStore::with_clock(ManualClock::new(T0));
        let p = [
            Policy::per_second(10).name("second").build().unwrap(),
            Policy::per_minute(100)
                .algorithm(Algorithm::TokenBucket)
                .name("minute")
                .build()
                .unwrap(),
        ];
        let after = run(store.charge("k", &p, 10)).unwrap();
        assert!(!after.is_allowed());
        assert_eq!(after.decisions()[0].remaining(), 0);
        assert_eq!(after.decisions()[1].remaining(), 90);
        let window = [Policy::per_second(1)
            .algorithm(Algorithm::SlidingLog)
            .build()
            .unwrap()];
        let err = run(store.charge("k", &window, 1)).unwrap_err();
        assert!(matches!(err, StoreError::Unsupported { .. }), "{err}");
        assert!(matches!(
            run(store.charge("k", &[], 1)),
            Err(StoreError::NoPolicies)
        ));
        assert_eq!(store.len(), 1);
        let none = MemoryStore::with_clock(ManualClock::new(T0));
        assert!(run(none.charge("k", &p, 0)).unwrap().is_allowed());
        assert_eq!(none.len(), 0, "a zero charge stores nothing");
    }
}
