//! Token bucket.
//!
//! **What it does.** A bucket holds up to `burst` tokens and is refilled at
//! `limit` tokens per `period`, continuously. A request of cost `c` takes `c`
//! tokens if the bucket has them and is rejected otherwise. After an idle
//! spell up to `burst` requests pass at once; under steady load the rate is
//! `limit` per `period`.
//!
//! **State.** [`TokenBucketState`]: the level in units of `1 / period` of a
//! token (of `1 / increment` past 2^52: [`emission_interval`](super::emission_interval)) —
//! so the refill is exactly `limit` units per microsecond and a
//! fraction of a token is never lost, however often the bucket is read — and
//! the time it was computed. Denials write nothing.
//!
//! **When to pick it.** When you think in tokens refilled over time, or need
//! to store the level explicitly. Its admissions are the same as GCRA's with
//! the same limit, period and burst; GCRA keeps one number instead of two.
//!
//! The arithmetic follows `ALGORITHMS.md` ("Token bucket") exactly.

use super::gcra::clock_tolerance;
use super::{ceil_div, micros, saturate, step, State, Step, TokenBucketState};
use crate::{Decision, Policy};

pub(super) fn check(
    policy: &Policy,
    state: Option<&TokenBucketState>,
    now_us: u64,
    cost: u64,
) -> Step {
    let capacity = policy.capacity();
    // A token is `increment` units; the refill is `scale` units per µs
    // (`limit` and `period` when the policy is exact).
    let (scale, increment) = policy.emission_interval();
    let (scale, increment) = (u128::from(scale), u128::from(increment));
    let full = u128::from(capacity) * increment;
    let now = u128::from(now_us);
    let (level, last) = state.map_or((full, now), |s| {
        (u128::from(s.level), u128::from(s.last_us))
    });
    // A level above `full` is left by a policy whose burst shrank.
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
    // > 0 only when the clock went back: the refill resumes at `last`.
    let mut lag = last - now;
    // Back to full in `lag + (full − level) / scale`: more than an empty
    // bucket now needs, beyond the clock tolerance, is more than this
    // policy can leave (a clock that jumped back, a corrupt value). Clamped
    // to an empty bucket now, and written back.
    let full_reset = ceil_div(full, scale);
    let mut repair = None;
    if lag + ceil_div(full - level, scale) > full_reset + clock_tolerance(full_reset) {
        (level, last, lag) = (0, now, 0);
        repair = Some(State::TokenBucket(TokenBucketState {
            level: 0,
            last_us: now_us,
        }));
    }
    let remaining_old = saturate(level / increment);
    let reset_old = micros(lag + ceil_div(full - level, scale));

    let need = u128::from(cost.max(1)) * increment;
    if level < need {
        let retry_after = micros(lag + ceil_div(need - level, scale));
        let denied = Decision::denied(capacity, remaining_old, retry_after, reset_old);
        return step(denied, repair, now_us);
    }
    if cost == 0 {
        return step(
            Decision::allowed(capacity, remaining_old, reset_old),
            repair,
            now_us,
        );
    }
    let level = level - need;
    let remaining = saturate(level / increment);
    let reset_after_us = saturate(lag + ceil_div(full - level, scale));
    let new_state = State::TokenBucket(TokenBucketState {
        // `level <= full <= 2^52`.
        level: saturate(level),
        // `last` is the stored time or `now_us`, both `u64`.
        last_us: saturate(last),
    });
    step(
        Decision::allowed_us(capacity, remaining, reset_after_us),
        Some(new_state),
        now_us,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Algorithm;

    const T0: u64 = 1_700_000_000_000_000;

    fn bucket(limit: u64, period: Duration, burst: u64) -> Policy {
        Policy::per(limit, period)
            .algorithm(Algorithm::TokenBucket)
            .burst(burst)
            .build()
            .unwrap()
    }

    #[test]
    fn burst_refill_and_exact_retry() {
        // 4 per second (one token every 250 ms), burst 2.
        let policy = bucket(4, Duration::from_secs(1), 2);
        let mut state = None;
        let mut run = |now: u64, cost: u64| {
            let step = check(&policy, state.as_ref(), now, cost);
            if let Some(State::TokenBucket(next)) = step.new_state {
                state = Some(next);
            }
            step
        };
        let first = run(T0, 2);
        assert!(first.decision.is_allowed());
        assert_eq!(first.decision.remaining(), 0);
        assert_eq!(first.decision.reset_after(), Duration::from_millis(500));
        assert_eq!(first.expires_at_us, T0 + 500_000);
        let denied = run(T0 + 100_000, 1);
        assert!(!denied.decision.is_allowed());
        assert_eq!(
            denied.decision.retry_after(),
            Some(Duration::from_millis(150))
        );
        assert_eq!(denied.new_state, None);
        assert!(!run(T0 + 249_999, 1).decision.is_allowed());
        assert!(run(T0 + 250_000, 1).decision.is_allowed());
    }

    #[test]
    fn shrunk_burst_is_clamped() {
        let policy = bucket(1, Duration::from_secs(1), 2);
        let stale = TokenBucketState {
            level: 50_000_000,
            last_us: T0,
        };
        let d = check(&policy, Some(&stale), T0, 0).decision;
        assert_eq!(d.remaining(), 2);
        let step = check(&policy, Some(&stale), T0, 2);
        assert!(step.decision.is_allowed());
        assert_eq!(step.decision.remaining(), 0);
        assert!(!check(&policy, Some(&stale), T0, 3).decision.is_allowed());
    }
}
