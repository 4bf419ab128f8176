//! Refunds: permits given back to a state, the inverse of a charge, for a
//! reservation settled below its estimate (ALGORITHMS.md, "Reservations").
//! GCRA and the token bucket only, as `charge` (`super::charge`).
//!
//! A refund never gives more than was taken: the state moves back by the
//! refund, but never past full (a state that refilled meanwhile is not
//! given the refund twice), and a refund rounds against the subject (a
//! fraction of a microsecond of a token bucket's postponed refill is not
//! given back). `reserve.lua` in portcullis-redis is its twin.

use super::gcra::clock_tolerance;
use super::{ceil_div, check, saturate, GcraState, State, Step, TokenBucketState};
use crate::{Algorithm, Policy};

/// Gives `amount` permits back to `state` at `now_us`: the subject's state
/// as if `amount` fewer permits had been charged, never beyond full.
/// An amount above twice the capacity refunds what twice the capacity
/// does (the most a reservation and its overage can have taken).
///
/// The step's decision is the state after the refund as a peek reports
/// it; `new_state` is what to write (`None` when nothing changes: an
/// amount of 0, no state, or a state already full). Returns `None` for
/// algorithms [`supports_charge`](super::supports_charge) refuses.
///
/// ```
/// use portcullis::{algorithms, Policy};
///
/// // 1 000 tokens per minute; 800 reserved, 300 used: 500 come back.
/// let policy = Policy::per_minute(1_000).build()?;
/// let now = 1_700_000_000_000_000;
/// let reserved = algorithms::check(&policy, None, now, 800);
/// assert_eq!(reserved.decision.remaining(), 200);
/// let refunded = algorithms::refund(&policy, reserved.new_state.as_ref(), now, 500).unwrap();
/// assert_eq!(refunded.decision.remaining(), 700);
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[must_use]
pub fn refund(policy: &Policy, state: Option<&State>, now_us: u64, amount: u64) -> Option<Step> {
    match policy.algorithm() {
        Algorithm::Gcra => {
            let state = match state {
                Some(State::Gcra(s)) => Some(s),
                _ => None,
            };
            Some(refund_gcra(policy, state, now_us, amount))
        }
        Algorithm::TokenBucket => {
            let state = match state {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            Some(refund_token_bucket(policy, state, now_us, amount))
        }
        _ => None,
    }
}

/// The step of a refund: `new_state` (if any) read back with a peek.
fn peeked(policy: &Policy, new_state: Option<State>, old: Option<&State>, now_us: u64) -> Step {
    let peek = check(policy, new_state.as_ref().or(old), now_us, 0);
    Step {
        decision: peek.decision,
        expires_at_us: peek.expires_at_us,
        new_state: new_state.or(peek.new_state),
    }
}

fn refund_gcra(policy: &Policy, state: Option<&GcraState>, now_us: u64, amount: u64) -> Step {
    let old = state.map(|s| State::Gcra(*s));
    let Some(s) = state else {
        return peeked(policy, None, None, now_us);
    };
    let (scale, increment) = policy.emission_interval();
    let (scale, increment) = (u128::from(scale), u128::from(increment));
    let capacity = u128::from(policy.capacity());
    let full = capacity * increment;
    let now = u128::from(now_us) * scale;
    let base = u128::from(s.tat_us) * scale + u128::from(s.tat_rem);
    if base <= now || amount == 0 {
        return peeked(policy, None, old.as_ref(), now_us);
    }
    let mut span = base - now;
    let full_reset = ceil_div(full, scale);
    if span / scale > full_reset + clock_tolerance(full_reset) {
        // Further ahead than the policy can leave: clamped first, as a
        // check does.
        span = full;
    }
    let give = u128::from(amount).min(2 * capacity) * increment;
    let time = now + span.saturating_sub(give);
    let new_state = State::Gcra(GcraState {
        // At most the stored time, a `u64`.
        tat_us: saturate(time / scale),
        tat_rem: saturate(time % scale),
    });
    peeked(policy, Some(new_state), None, now_us)
}

fn refund_token_bucket(
    policy: &Policy,
    state: Option<&TokenBucketState>,
    now_us: u64,
    amount: u64,
) -> Step {
    let old = state.map(|s| State::TokenBucket(*s));
    let Some(s) = state else {
        return peeked(policy, None, None, now_us);
    };
    if amount == 0 {
        return peeked(policy, None, old.as_ref(), now_us);
    }
    let (scale, increment) = policy.emission_interval();
    let (scale, increment) = (u128::from(scale), u128::from(increment));
    let capacity = u128::from(policy.capacity());
    let full = capacity * increment;
    let now = u128::from(now_us);
    let (mut level, mut last) = (u128::from(s.level).min(full), u128::from(s.last_us));
    if now > last {
        let elapsed = now - last;
        if elapsed >= ceil_div(full - level, scale) {
            level = full;
        } else {
            level += elapsed * scale;
        }
        last = now;
    }
    let full_reset = ceil_div(full, scale);
    if (last - now) + ceil_div(full - level, scale) > full_reset + clock_tolerance(full_reset) {
        (level, last) = (0, now);
    }
    if level == full && last == now {
        return peeked(policy, None, old.as_ref(), now_us);
    }
    let give = u128::from(amount).min(2 * capacity) * increment;
    // The refill postponed past now (a debt, or a clock that went back),
    // in units.
    let owed = (last - now) * scale;
    if give <= owed {
        // Rounded down: under a microsecond of refill is not given back.
        last -= give / scale;
    } else {
        level = (level + (give - owed)).min(full);
        last = now;
    }
    let new_state = State::TokenBucket(TokenBucketState {
        level: saturate(level),
        last_us: saturate(last),
    });
    peeked(policy, Some(new_state), None, now_us)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithms::charge;

    const T0: u64 = 1_700_000_000_000_000;

    fn both(limit: u64, period: Duration) -> [Policy; 2] {
        [Algorithm::Gcra, Algorithm::TokenBucket].map(|algorithm| {
            Policy::per(limit, period)
                .algorithm(algorithm)
                .build()
                .unwrap()
        })
    }

    #[test]
    fn a_refund_undoes_the_unused_part_of_a_charge() {
        for policy in &both(1_000, Duration::from_secs(60)) {
            let reserved = check(policy, None, T0, 800);
            assert_eq!(reserved.decision.remaining(), 200);
            let step = refund(policy, reserved.new_state.as_ref(), T0, 500).unwrap();
            assert_eq!(step.decision.remaining(), 700, "{policy:?}");
            // The same state as charging 300 in the first place.
            let direct = check(policy, None, T0, 300);
            assert_eq!(step.new_state, direct.new_state, "{policy:?}");
        }
    }

    #[test]
    fn a_refund_never_goes_past_full() {
        for policy in &both(1_000, Duration::from_secs(60)) {
            let reserved = check(policy, None, T0, 100);
            // A minute later the state is full again by itself.
            let later = T0 + 60_000_000;
            let step = refund(policy, reserved.new_state.as_ref(), later, 100).unwrap();
            assert_eq!(step.decision.remaining(), 1_000);
            let step = refund(policy, reserved.new_state.as_ref(), T0, u64::MAX).unwrap();
            assert_eq!(step.decision.remaining(), 1_000, "{policy:?}");
            assert_eq!(step.decision.reset_after(), Duration::ZERO);
            assert!(refund(policy, None, T0, 5).unwrap().new_state.is_none());
        }
    }

    #[test]
    fn a_refund_pays_back_a_debt() {
        for policy in &both(10, Duration::from_secs(10)) {
            // 10 charged after the fact beyond a full bucket: 10 s of debt.
            let spent = check(policy, None, T0, 10);
            let debt = charge(policy, spent.new_state.as_ref(), T0, 10).unwrap();
            assert_eq!(
                debt.decision.retry_after(),
                Some(Duration::from_secs(11)),
                "{policy:?}"
            );
            let step = refund(policy, debt.new_state.as_ref(), T0, 4).unwrap();
            assert_eq!(step.decision.retry_after(), Some(Duration::from_secs(7)));
            let step = refund(policy, step.new_state.as_ref(), T0, 8).unwrap();
            assert_eq!(step.decision.remaining(), 2, "{policy:?}");
        }
    }

    #[test]
    fn other_algorithms_are_refused() {
        let policy = Policy::per_second(1)
            .algorithm(Algorithm::SlidingWindow)
            .build()
            .unwrap();
        assert!(refund(&policy, None, T0, 1).is_none());
    }
}
