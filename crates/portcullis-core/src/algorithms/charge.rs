//! Charging after the fact ("post-charging"): a cost known only once a
//! request has run (the tokens an LLM response used, a failed login) is
//! charged whatever the state, even past the limit, as a *debt* that is paid
//! back by waiting. GCRA and the token bucket support it
//! ([`supports_charge`]); the other algorithms do not.
//!
//! **The debt bound.** A charge never takes a state more than one full
//! capacity beyond empty: with `F` the policy's full reset (`capacity ×
//! period / limit`, the time an empty state needs to be full again), after
//! any charge the subject is back to full capacity within `2·F` and a
//! cost-1 request is admitted again within `F` plus one emission interval
//! (`period / limit`). A state already further ahead than that (clocks that
//! disagree, within the clock tolerance of "Changing a policy") is left as
//! it is, never moved further. States are also kept before 2^53 µs since
//! the epoch (the year 2255), where Lua stops counting exactly.
//!
//! The arithmetic follows `ALGORITHMS.md` ("Charging after the response")
//! exactly; `charge.lua` in portcullis-redis is its twin.

use super::gcra::clock_tolerance;
use super::{ceil_div, check, saturate, GcraState, State, Step, TokenBucketState};
use crate::{Algorithm, Policy};

/// The last microsecond a post-charged state may reach: 2^53 − 1.
const HORIZON_US: u64 = (1 << 53) - 1;

/// Whether `algorithm` supports [`charge`]: GCRA and the token bucket.
///
/// ```
/// use portcullis::{algorithms, Algorithm};
///
/// assert!(algorithms::supports_charge(Algorithm::Gcra));
/// assert!(algorithms::supports_charge(Algorithm::TokenBucket));
/// assert!(!algorithms::supports_charge(Algorithm::FixedWindow));
/// ```
#[must_use]
pub const fn supports_charge(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket)
}

/// Charges `cost` permits to `state` at `now_us` after the fact: never
/// denied, the state may go past empty into a debt of at most one full
/// capacity.
///
/// **The debt bound.** With `F` the policy's full reset (`capacity ×
/// period / limit`), right after any charge the subject is back to full
/// capacity within `2·F` (`reset_after`, and the state's expiry) and a
/// cost-1 request is admitted again within `F` plus one emission interval
/// (`period / limit`): 5 per 15 minutes locks a subject out for at most 18
/// minutes, whatever the cost. A state already further ahead (clocks that
/// disagree, within the tolerance of ALGORITHMS.md, "Changing a policy")
/// is left as it is. Charged times stay below 2^53 µs since the epoch (the
/// year 2255).
///
/// The step's decision is
/// the state *after* the charge as a peek reports it (is a cost-1 request
/// admitted now? how many remain? when is it full again?), and `new_state`
/// is what to write (`None` when nothing changes: a cost of 0, or a state
/// already at the debt bound).
///
/// A state of another algorithm counts as absent, and a state further
/// ahead than the policy can leave is clamped first, as [`check`] does.
/// Returns `None` for algorithms [`supports_charge`] refuses.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{algorithms, Policy};
///
/// // 10 000 tokens per minute; a response reports 12 000.
/// let policy = Policy::per_minute(10_000).build()?;
/// let now = 1_700_000_000_000_000;
/// let step = algorithms::charge(&policy, None, now, 12_000).unwrap();
/// assert!(!step.decision.is_allowed());
/// // 2 000 tokens of debt and one more token: 12.006 s.
/// assert_eq!(step.decision.retry_after(), Some(Duration::from_micros(12_006_000)));
/// let later = algorithms::check(&policy, step.new_state.as_ref(), now + 12_006_000, 1);
/// assert!(later.decision.is_allowed());
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[must_use]
pub fn charge(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Option<Step> {
    match policy.algorithm() {
        Algorithm::Gcra => {
            let state = match state {
                Some(State::Gcra(s)) => Some(s),
                _ => None,
            };
            Some(charge_gcra(policy, state, now_us, cost))
        }
        Algorithm::TokenBucket => {
            let state = match state {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            Some(charge_token_bucket(policy, state, now_us, cost))
        }
        _ => None,
    }
}

/// The step of a charge: `new_state` (if any) read back with a peek.
fn settle(policy: &Policy, new_state: Option<State>, old: Option<&State>, now_us: u64) -> Step {
    let peek = check(policy, new_state.as_ref().or(old), now_us, 0);
    Step {
        decision: peek.decision,
        expires_at_us: peek.expires_at_us,
        new_state: new_state.or(peek.new_state),
    }
}

fn charge_gcra(policy: &Policy, state: Option<&GcraState>, now_us: u64, cost: u64) -> Step {
    let (scale, increment) = policy.emission_interval();
    let (scale, increment) = (u128::from(scale), u128::from(increment));
    let capacity = u128::from(policy.capacity());
    let full = capacity * increment;
    let now = u128::from(now_us) * scale;
    let base = state.map_or(now, |s| {
        u128::from(s.tat_us) * scale + u128::from(s.tat_rem)
    });
    let mut span_old = base.max(now) - now;
    let full_reset = ceil_div(full, scale);
    let mut repaired = false;
    if span_old / scale > full_reset + clock_tolerance(full_reset) {
        span_old = full;
        repaired = true;
    }
    let horizon = u128::from(HORIZON_US.saturating_sub(now_us)) * scale;
    let ceiling = (2 * full).min(horizon);
    // A cost above twice the capacity charges what twice the capacity does
    // (the ceiling), and keeps the product within 2^53 in Lua.
    let charge = u128::from(cost).min(2 * capacity) * increment;
    let span_new = if span_old >= ceiling {
        span_old
    } else {
        (span_old + charge).min(ceiling)
    };
    let old = state.map(|s| State::Gcra(*s));
    if span_new == span_old && !repaired {
        return settle(policy, None, old.as_ref(), now_us);
    }
    let time = now + span_new;
    let new_state = State::Gcra(GcraState {
        // `span_new <= horizon`, so the time fits 53 bits.
        tat_us: saturate(time / scale),
        tat_rem: saturate(time % scale),
    });
    settle(policy, Some(new_state), None, now_us)
}

fn charge_token_bucket(
    policy: &Policy,
    state: Option<&TokenBucketState>,
    now_us: u64,
    cost: u64,
) -> Step {
    let (scale, increment) = policy.emission_interval();
    let (scale, increment) = (u128::from(scale), u128::from(increment));
    let capacity = u128::from(policy.capacity());
    let full = capacity * increment;
    let now = u128::from(now_us);
    let (level, last) = state.map_or((full, now), |s| {
        (u128::from(s.level), u128::from(s.last_us))
    });
    let mut level = level.min(full);
    if now > last {
        let elapsed = now - last;
        if elapsed >= ceil_div(full - level, scale) {
            level = full;
        } else {
            level += elapsed * scale;
        }
    }
    let mut last = last.max(now);
    let full_reset = ceil_div(full, scale);
    let mut repaired = false;
    if (last - now) + ceil_div(full - level, scale) > full_reset + clock_tolerance(full_reset) {
        (level, last) = (0, now);
        repaired = true;
    }
    let need = u128::from(cost).min(2 * capacity) * increment;
    let (new_level, new_last) = if level >= need {
        (level - need, last)
    } else {
        // Past empty: the refill of the deficit is postponed (`last` moves
        // ahead, rounded up to a whole µs: under a µs of refill is lost,
        // never given), at most to one full reset from now.
        let limit = last
            .max(now + full_reset)
            .min(u128::from(HORIZON_US).max(last));
        let add = ceil_div(need - level, scale);
        (0, (last + add).min(limit))
    };
    let old = state.map(|s| State::TokenBucket(*s));
    let unchanged = state
        .is_some_and(|s| (u128::from(s.level), u128::from(s.last_us)) == (new_level, new_last));
    if (need == 0 || unchanged) && !repaired {
        return settle(policy, None, old.as_ref(), now_us);
    }
    let new_state = State::TokenBucket(TokenBucketState {
        level: saturate(new_level),
        last_us: saturate(new_last),
    });
    settle(policy, Some(new_state), None, now_us)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const T0: u64 = 1_700_000_000_000_000;

    fn policies(limit: u64, period: Duration, burst: u64) -> [Policy; 2] {
        [Algorithm::Gcra, Algorithm::TokenBucket].map(|algorithm| {
            Policy::per(limit, period)
                .algorithm(algorithm)
                .burst(burst)
                .build()
                .unwrap()
        })
    }

    /// Charges, then checks, carrying the state.
    struct Subject<'a> {
        policy: &'a Policy,
        state: Option<State>,
    }

    impl Subject<'_> {
        fn charge(&mut self, now: u64, cost: u64) -> Step {
            let step = charge(self.policy, self.state.as_ref(), now, cost).unwrap();
            if let Some(state) = &step.new_state {
                self.state = Some(state.clone());
            }
            step
        }

        fn check(&mut self, now: u64, cost: u64) -> Step {
            let step = check(self.policy, self.state.as_ref(), now, cost);
            if let Some(state) = &step.new_state {
                self.state = Some(state.clone());
            }
            step
        }
    }

    #[test]
    fn tokens_reported_after_the_fact_put_the_subject_in_debt() {
        // 10 000 tokens a minute (6 ms a token); responses report 3 000,
        // 4 000 and 5 000.
        for policy in &policies(10_000, Duration::from_secs(60), 10_000) {
            let mut subject = Subject {
                policy,
                state: None,
            };
            let mut now = T0;
            for used in [3_000, 4_000] {
                assert!(subject.check(now, 0).decision.is_allowed());
                assert!(subject.charge(now, used).decision.is_allowed());
                now += 1;
            }
            assert!(subject.check(now, 0).decision.is_allowed());
            let after = subject.charge(now, 5_000);
            assert!(!after.decision.is_allowed(), "{policy:?}");
            assert_eq!(after.decision.remaining(), 0);
            // 12 000 − 10 000 = 2 000 in debt, refilled since T0 for 2 µs
            // (0 tokens for the bucket, 2/6 000 of a token for GCRA), and
            // one token more: about 12.006 s.
            let retry = after.decision.retry_after().unwrap();
            assert!(
                retry > Duration::from_millis(12_005) && retry <= Duration::from_millis(12_006),
                "{policy:?}: {retry:?}"
            );
            let retry_us = u64::try_from(retry.as_micros()).unwrap();
            assert!(!subject.check(now + retry_us - 1, 0).decision.is_allowed());
            assert!(subject.check(now + retry_us, 1).decision.is_allowed());
        }
    }

    #[test]
    fn the_debt_is_capped_at_one_full_capacity_beyond_empty() {
        // 5 per 15 minutes: F = 15 min, an emission interval 3 min.
        for policy in &policies(5, Duration::from_secs(900), 5) {
            let mut subject = Subject {
                policy,
                state: None,
            };
            let step = subject.charge(T0, u64::MAX);
            assert_eq!(
                step.decision.reset_after(),
                Duration::from_secs(1_800),
                "{policy:?}"
            );
            assert_eq!(
                step.decision.retry_after(),
                Some(Duration::from_secs(1_080)),
                "{policy:?}"
            );
            assert_eq!(step.expires_at_us, T0 + 1_800_000_000);
            // Charging more changes nothing.
            let again = subject.charge(T0, 1_000);
            assert_eq!(again.new_state, None, "{policy:?}");
            assert_eq!(again.decision, step.decision);
            // Paid back by waiting: F + one interval.
            assert!(!subject.check(T0 + 1_079_999_999, 1).decision.is_allowed());
            assert!(subject.check(T0 + 1_080_000_000, 1).decision.is_allowed());
        }
    }

    #[test]
    fn a_charge_within_the_capacity_is_an_admission() {
        for policy in &policies(4, Duration::from_secs(1), 4) {
            let charged = charge(policy, None, T0, 3).unwrap();
            let checked = check(policy, None, T0, 3);
            assert_eq!(charged.decision.remaining(), 1);
            assert_eq!(
                charged.decision.reset_after(),
                checked.decision.reset_after()
            );
            assert_eq!(charged.new_state, checked.new_state);
            assert!(charged.decision.is_allowed());
            let nothing = charge(policy, charged.new_state.as_ref(), T0, 0).unwrap();
            assert_eq!(nothing.new_state, None);
            assert_eq!(nothing.decision, charged.decision);
        }
    }

    #[test]
    fn other_algorithms_are_refused() {
        let policy = Policy::per_second(1)
            .algorithm(Algorithm::FixedWindow)
            .build()
            .unwrap();
        assert!(charge(&policy, None, T0, 1).is_none());
        assert!(!supports_charge(Algorithm::SlidingLog));
    }

    #[test]
    fn near_the_horizon_states_stay_exact() {
        let [gcra, bucket] = policies(1, Duration::from_secs(3_600), 1);
        for policy in [&gcra, &bucket] {
            let now = HORIZON_US - 1_000;
            let step = charge(policy, None, now, 5).unwrap();
            match step.new_state {
                Some(State::Gcra(s)) => assert!(s.tat_us <= HORIZON_US),
                Some(State::TokenBucket(s)) => assert!(s.last_us <= HORIZON_US),
                other => panic!("{other:?}"),
            }
        }
    }
}
