//! `MemoryStore`'s post-charge ([`Store::charge`](crate::Store::charge)): every policy of the
//! subject charged after the fact with [`algorithms::charge`], in one
//! critical section under the shard's write lock (the general path; the
//! GCRA hot path then reads the states it leaves like any other).

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::table::{Key, Shard};
use super::{Inner, MemoryStore};
use crate::algorithms::{self, Step};
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

impl Shard {
    /// Charges every policy (a charge is never denied), writes what
    /// changed, and answers the states after the charge as peeks.
    fn charge_many(
        &mut self,
        inner: &Inner,
        hash: u64,
        key: &[u8],
        policies: &[Policy],
        now: u64,
        cost: u64,
    ) -> Result<Verdict, StoreError> {
        // The time again, under the lock (as `check_many`).
        let now = now.max(inner.clock.now_micros());
        self.demote_if_hot(hash);
        let hot = self.hot_tat.load(Ordering::Relaxed);
        let index = self.find(hash, key);
        let entry = index.and_then(|index| self.table.get_bucket(index));
        let names = &self.names;
        let steps: SmallVec<[Step; 2]> = policies
            .iter()
            .map(|policy| {
                let state = entry.and_then(|entry| entry.live_state(names, policy, now, hot));
                // `validate_charge` refused the algorithms without a
                // charge; were one to come through, it is only peeked.
                algorithms::charge(policy, state.as_deref(), now, cost)
                    .unwrap_or_else(|| algorithms::check(policy, state.as_deref(), now, 0))
            })
            .collect();
        let verdict: Verdict = steps.iter().map(|step| step.decision).collect();
        if !steps.iter().any(|step| step.new_state.is_some()) {
            self.tick(inner, now);
            return Ok(verdict);
        }
        self.write_steps(inner, hash, key, index, policies.iter().zip(steps), now)?;
        self.tick(inner, now);
        Ok(verdict)
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
