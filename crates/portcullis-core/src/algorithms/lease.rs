//! The lease algorithm of a [`ConcurrencyPolicy`]: acquire, renew and
//! release on one subject's live leases, as pure functions of (policy,
//! state, now). `lua/lease.lua` in portcullis-redis is its twin
//! (ALGORITHMS.md, "Leases").
//!
//! A lease is live while `now < expires_at`; a lease whose expiry is at or
//! before `now` is gone, exactly as if released (Redis:
//! `ZREMRANGEBYSCORE key -inf now`).

use crate::{ConcurrencyPolicy, Lease, LeaseDecision, LeaseId};

/// One subject's leases for one policy: `(id, expires_at_us)`, in no
/// particular order, at most `max_in_flight` of them live (more only after
/// the policy's `max_in_flight` shrank: the surplus drains as leases end).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseState {
    /// The leases held, live or not yet pruned.
    pub leases: Vec<(LeaseId, u64)>,
}

impl LeaseState {
    /// Drops the leases expired at `now_us`.
    pub fn prune(&mut self, now_us: u64) {
        self.leases.retain(|&(_, expires)| expires > now_us);
    }

    /// The latest expiry of the leases held (0 when none): when the state
    /// may be forgotten.
    #[must_use]
    pub fn expires_at_us(&self) -> u64 {
        self.leases.iter().map(|&(_, e)| e).max().unwrap_or(0)
    }

    /// Whether no lease is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

/// Acquires a permit with id `id` at `now_us`: prunes expired leases, then
/// grants a lease expiring at `now_us + lease_ttl` when fewer than
/// `max_in_flight` are live, else denies with the time until the earliest
/// live lease expires (the latest a permit comes back unless renewed).
///
/// An `id` already held (which [`LeaseId::generate`] never produces) is
/// renewed rather than counted twice.
#[must_use]
pub fn acquire(
    policy: &ConcurrencyPolicy,
    state: &mut LeaseState,
    now_us: u64,
    id: LeaseId,
) -> LeaseDecision {
    state.prune(now_us);
    let max = policy.limit();
    let expires = now_us.saturating_add(policy.lease_ttl_micros());
    if let Some(held) = state.leases.iter_mut().find(|(held, _)| *held == id) {
        held.1 = held.1.max(expires);
        return LeaseDecision::granted(Lease::new(id, held.1), state.leases.len() as u64, max);
    }
    let live = state.leases.len() as u64;
    if live < max {
        state.leases.push((id, expires));
        return LeaseDecision::granted(Lease::new(id, expires), live + 1, max);
    }
    let earliest = state.leases.iter().map(|&(_, e)| e).min().unwrap_or(now_us);
    LeaseDecision::denied(live, max, earliest.saturating_sub(now_us))
}

/// Extends the live lease `id` to `now_us + lease_ttl` (never shortens it)
/// and returns its new expiry; `None` when it is not held (expired or
/// released): a lease is never resurrected.
pub fn renew(
    policy: &ConcurrencyPolicy,
    state: &mut LeaseState,
    now_us: u64,
    id: LeaseId,
) -> Option<u64> {
    state.prune(now_us);
    let held = state.leases.iter_mut().find(|(held, _)| *held == id)?;
    held.1 = held.1.max(now_us.saturating_add(policy.lease_ttl_micros()));
    Some(held.1)
}

/// Releases the lease `id`: `true` when it was live, `false` when it had
/// expired or was not held. Prunes expired leases too.
pub fn release(state: &mut LeaseState, now_us: u64, id: LeaseId) -> bool {
    state.prune(now_us);
    let before = state.leases.len();
    state.leases.retain(|(held, _)| *held != id);
    state.leases.len() != before
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn policy(max: u64, ttl_ms: u64) -> ConcurrencyPolicy {
        ConcurrencyPolicy::max_in_flight(max)
            .lease_ttl(Duration::from_millis(ttl_ms))
            .build()
            .unwrap()
    }

    const T0: u64 = 1_700_000_000_000_000;

    #[test]
    fn admits_up_to_max_then_denies_with_the_earliest_expiry() {
        let p = policy(2, 1_000);
        let mut s = LeaseState::default();
        let a = acquire(&p, &mut s, T0, LeaseId::from_u128(1));
        assert_eq!(a.in_flight(), 1);
        assert_eq!(a.lease().unwrap().expires_at_micros(), T0 + 1_000_000);
        let b = acquire(&p, &mut s, T0 + 100_000, LeaseId::from_u128(2));
        assert_eq!(b.in_flight(), 2);
        assert_eq!(b.remaining(), 0);
        let c = acquire(&p, &mut s, T0 + 200_000, LeaseId::from_u128(3));
        assert!(!c.is_granted());
        assert_eq!(c.retry_after(), Some(Duration::from_millis(800)));
        // At the first lease's expiry it is gone.
        let d = acquire(&p, &mut s, T0 + 1_000_000, LeaseId::from_u128(4));
        assert!(d.is_granted());
        assert_eq!(d.in_flight(), 2);
    }

    #[test]
    fn renew_extends_only_a_live_lease_and_release_frees_it() {
        let p = policy(1, 1_000);
        let mut s = LeaseState::default();
        let id = LeaseId::from_u128(7);
        assert!(acquire(&p, &mut s, T0, id).is_granted());
        assert_eq!(renew(&p, &mut s, T0 + 900_000, id), Some(T0 + 1_900_000));
        assert!(!acquire(&p, &mut s, T0 + 1_500_000, LeaseId::from_u128(8)).is_granted());
        assert_eq!(renew(&p, &mut s, T0 + 1_000, LeaseId::from_u128(9)), None);
        assert!(release(&mut s, T0 + 1_600_000, id));
        assert!(!release(&mut s, T0 + 1_600_000, id));
        assert!(s.is_empty());
        // An expired lease is not renewed back to life.
        let id = LeaseId::from_u128(10);
        assert!(acquire(&p, &mut s, T0 + 2_000_000, id).is_granted());
        assert_eq!(renew(&p, &mut s, T0 + 3_000_000, id), None);
        assert!(!release(&mut s, T0 + 3_000_000, id));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire,
        Renew(usize),
        Release(usize),
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Acquire),
            1 => (0usize..8).prop_map(Op::Renew),
            2 => (0usize..8).prop_map(Op::Release),
            2 => (0u64..1_500_000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// Against a model that remembers every lease ever granted: never
        /// more than max live; a denial only when max are live, with the
        /// earliest expiry; renew/release only touch live leases.
        #[test]
        fn never_more_than_max_live(max in 1u64..5, ops in proptest::collection::vec(op(), 1..80)) {
            let p = policy(max, 1_000);
            let mut s = LeaseState::default();
            let mut now = T0;
            let mut granted: Vec<(LeaseId, u64)> = Vec::new();
            let mut released: Vec<LeaseId> = Vec::new();
            for (n, op) in ops.into_iter().enumerate() {
                let live: Vec<(LeaseId, u64)> = granted
                    .iter()
                    .copied()
                    .filter(|(id, e)| *e > now && !released.contains(id))
                    .collect();
                match op {
                    Op::Acquire => {
                        let id = LeaseId::from_u128(n as u128 + 1);
                        let d = acquire(&p, &mut s, now, id);
                        if (live.len() as u64) < max {
                            prop_assert!(d.is_granted());
                            prop_assert_eq!(d.in_flight(), live.len() as u64 + 1);
                            granted.push((id, now + 1_000_000));
                        } else {
                            prop_assert!(!d.is_granted());
                            let earliest = live.iter().map(|l| l.1).min().unwrap();
                            prop_assert_eq!(d.retry_after(), Some(Duration::from_micros(earliest - now)));
                        }
                    }
                    Op::Renew(i) => {
                        let Some(&(id, _)) = granted.get(i) else { continue };
                        let was_live = live.iter().any(|l| l.0 == id);
                        let r = renew(&p, &mut s, now, id);
                        prop_assert_eq!(r.is_some(), was_live);
                        if let Some(e) = r {
                            prop_assert_eq!(e, now + 1_000_000);
                            for g in &mut granted { if g.0 == id { g.1 = e; } }
                        }
                    }
                    Op::Release(i) => {
                        let Some(&(id, _)) = granted.get(i) else { continue };
                        let was_live = live.iter().any(|l| l.0 == id);
                        prop_assert_eq!(release(&mut s, now, id), was_live);
                        released.push(id);
                    }
                    Op::Wait(us) => now += us,
                }
                let mut pruned = s.clone();
                pruned.prune(now);
                prop_assert!(pruned.leases.len() as u64 <= max);
            }
        }
    }
}
