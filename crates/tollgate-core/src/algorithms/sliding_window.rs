//! Sliding window counter.
//!
//! **What it does.** Keeps the counts of the current aligned window and the
//! one before it, and estimates the number of permits in the window of one
//! `period` ending now as `previous × (part of the previous window still
//! inside the sliding window) + current`. A request is admitted when the
//! estimate, with its cost added, is at most `limit`. The weighting is exact
//! (integers scaled by the period), so the estimate never exceeds the limit
//! at an admission.
//!
//! The estimate assumes the previous window's permits were spread evenly; a
//! previous window whose traffic came at its very end is under-weighted, so
//! the true count in a sliding period can exceed the limit (it never exceeds
//! twice the limit, and stays close to the limit under steady traffic). Use
//! the sliding log for an exact count.
//!
//! **State.** [`SlidingWindowState`]: the current window's start and two
//! counters. Denials write nothing; the state expires two periods after the
//! last admission's window start at most.
//!
//! **When to pick it.** Window semantics ("N per minute") without the fixed
//! window's burst at the boundary, at the cost of two counters, for any
//! limit.
//!
//! The arithmetic follows `ALGORITHMS.md` ("Sliding window counter")
//! exactly. `retry_after` is honest: the same request, alone, is admitted
//! exactly `retry_after` later and not a microsecond earlier.

use std::time::Duration;

use super::{micros, saturate, step, SlidingWindowState, State, Step};
use crate::{Decision, Policy};

pub(super) fn check(
    policy: &Policy,
    state: Option<&SlidingWindowState>,
    now_us: u64,
    cost: u64,
) -> Step {
    let limit_u64 = policy.limit();
    let limit = u128::from(limit_u64);
    let period = u128::from(policy.period_micros());
    let mut now = u128::from(now_us);
    let mut window_start = now - now % period;
    // > 0 only when the clock went back to before the stored window.
    let mut lag = 0;
    let (previous, current) = match state {
        Some(s) => {
            let s_start = u128::from(s.window_start_us);
            if s_start == window_start || (s_start > window_start && s_start <= now) {
                // The same window; or a window start between this window's
                // start and now, which only a policy whose period changed
                // leaves behind: its counts are recent, so they all count.
                (u128::from(s.previous), u128::from(s.current))
            } else if s_start + period == window_start {
                (u128::from(s.current), 0)
            } else if s_start > now {
                lag = s_start - now;
                window_start = s_start;
                now = s_start;
                (u128::from(s.previous), u128::from(s.current))
            } else {
                (0, 0)
            }
        }
        None => (0, 0),
    };
    let elapsed = now - window_start;
    let weight = period - elapsed;
    // The estimate scaled by the period: previous·weight + current·period.
    let used = previous * weight + current * period;
    let full = limit * period;
    let remaining_old = saturate(full.saturating_sub(used) / period);
    let reset = |current: u128| {
        let until_full = if current > 0 {
            2 * period - elapsed
        } else if previous > 0 {
            period - elapsed
        } else {
            return Duration::ZERO;
        };
        micros(lag + until_full)
    };

    let cost_eval = u128::from(cost.max(1));
    if used + cost_eval * period > full {
        let retry_after = if current + cost_eval <= limit {
            // Wait in this window until the previous window's weight has
            // dropped enough: previous·(period − e) ≤ room. Denied means
            // previous·weight > room ≥ 0, so previous > 0, and
            // room div previous < weight ≤ period.
            let room = (limit - current - cost_eval) * period;
            let earliest = period - room / previous.max(1);
            earliest.saturating_sub(elapsed)
        } else {
            // Not before the next window, where the current count becomes
            // the previous one: current·(period − e) ≤ (limit − cost)·period.
            // current + cost > limit ≥ cost, so current > 0.
            let room = (limit - cost_eval) * period;
            let earliest = period - (room / current.max(1)).min(period);
            (period - elapsed) + earliest
        };
        let denied = Decision::denied(
            limit_u64,
            remaining_old,
            micros(lag + retry_after),
            reset(current),
        );
        return step(denied, None, now_us);
    }
    if cost == 0 {
        let peek = Decision::allowed(limit_u64, remaining_old, reset(current));
        return step(peek, None, now_us);
    }
    let current = current + cost_eval;
    let remaining = saturate((full - used - cost_eval * period) / period);
    let new_state = State::SlidingWindow(SlidingWindowState {
        // The window start is `now_us` rounded down or the stored start.
        window_start_us: saturate(window_start),
        // Both counts are stored ones or at most `limit` after admission.
        previous: saturate(previous),
        current: saturate(current),
    });
    step(
        Decision::allowed(limit_u64, remaining, reset(current)),
        Some(new_state),
        now_us,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    const SECOND: u64 = 1_000_000;
    /// A 10-second boundary.
    const W0: u64 = 1_700_000_000_000_000;

    fn policy(limit: u64, period: Duration) -> Policy {
        Policy::per(limit, period)
            .algorithm(Algorithm::SlidingWindow)
            .build()
            .unwrap()
    }

    #[test]
    fn previous_window_is_weighted_by_its_overlap() {
        // 10 per 10 s. 8 admitted in the first window.
        let policy = policy(10, Duration::from_secs(10));
        let first = check(&policy, None, W0 + 5 * SECOND, 8);
        assert!(first.decision.is_allowed());
        assert_eq!(first.decision.remaining(), 2);
        let Some(State::SlidingWindow(state)) = first.new_state else {
            panic!("admitted")
        };
        // 2.5 s into the next window the previous 8 weigh 8·7.5/10 = 6, so
        // 4 remain; 5 is too many.
        let at = W0 + 12_500_000;
        let peek = check(&policy, Some(&state), at, 0).decision;
        assert_eq!(peek.remaining(), 4);
        let denied = check(&policy, Some(&state), at, 5).decision;
        assert!(!denied.is_allowed());
        // 8·(10 − e)/10 + 5 ≤ 10 ⇔ e ≥ 3.75 s: retry after 1.25 s.
        assert_eq!(denied.retry_after(), Some(Duration::from_millis(1_250)));
        assert!(!check(&policy, Some(&state), at + 1_249_999, 5)
            .decision
            .is_allowed());
        let later = check(&policy, Some(&state), at + 1_250_000, 5).decision;
        assert!(later.is_allowed());
        assert_eq!(later.remaining(), 0);
        // Full again at the end of the window after this one.
        assert_eq!(later.reset_after(), Duration::from_micros(16_250_000));
    }

    #[test]
    fn retry_when_the_current_window_alone_is_full() {
        let policy = policy(4, Duration::from_secs(10));
        let step = check(&policy, None, W0 + SECOND, 3);
        let Some(State::SlidingWindow(state)) = step.new_state else {
            panic!("admitted")
        };
        // 3 + 2 > 4 in this window: in the next one 3·(10 − e)/10 + 2 ≤ 4
        // needs e ≥ 10/3 s, so 3 333 334 µs into it; 9 s until it starts.
        let denied = check(&policy, Some(&state), W0 + SECOND, 2).decision;
        assert_eq!(
            denied.retry_after(),
            Some(Duration::from_micros(9_000_000 + 3_333_334))
        );
    }

    #[test]
    fn clock_going_back_measures_from_real_now() {
        let policy = policy(1, Duration::from_secs(10));
        let state = SlidingWindowState {
            window_start_us: W0 + 10 * SECOND,
            previous: 0,
            current: 1,
        };
        let step = check(&policy, Some(&state), W0 + 5 * SECOND, 1);
        assert!(!step.decision.is_allowed());
        // Treated as W0 + 10 s (5 s lag); there the next chance is the
        // window after, W0 + 20 s, when the 1 weighs (10 − e)/10 ≤ 0:
        // e = 10 s, so W0 + 30 s.
        assert_eq!(step.decision.retry_after(), Some(Duration::from_secs(25)));
        assert_eq!(step.expires_at_us, W0 + 30 * SECOND);
    }
}
