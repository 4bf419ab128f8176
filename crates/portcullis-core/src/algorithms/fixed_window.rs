//! Fixed window.
//!
//! **What it does.** Time is cut into windows of one `period`, aligned to
//! multiples of the period since the Unix epoch (a per-day window runs from
//! midnight UTC to midnight UTC). Each window admits up to `limit` permits;
//! the count starts again from zero exactly when the window ends, however
//! busy the key is — unlike the `INCR` + `EXPIRE` recipe whose expiry is
//! pushed back by every hit.
//!
//! Across a window boundary up to twice the limit can pass within one
//! period (the end of one window and the start of the next); the sliding
//! window and sliding log algorithms avoid that.
//!
//! **State.** [`FixedWindowState`]: the window's start and its count. Denials
//! write nothing; the state expires at the window's end.
//!
//! **When to pick it.** For quotas people read as "N per calendar
//! minute/hour/day" that reset at a known time, which is also what a client
//! can be told in a `RateLimit` header.
//!
//! The arithmetic follows `ALGORITHMS.md` ("Fixed window") exactly.

use std::time::Duration;

use super::{micros, saturate, step, FixedWindowState, State, Step};
use crate::{Decision, Policy};

pub(super) fn check(
    policy: &Policy,
    state: Option<&FixedWindowState>,
    now_us: u64,
    cost: u64,
) -> Step {
    let limit = policy.limit();
    let period = policy.period_micros();
    let now = u128::from(now_us);
    let mut window_start = now_us - now_us % period;
    let mut count = 0;
    let mut repair = None;
    if let Some(s) = state {
        let ahead = s.window_start_us.saturating_sub(now_us);
        if u128::from(ahead) > super::gcra::clock_tolerance(u128::from(period)) {
            // A window that starts later than clocks that disagree explain
            // (a clock that jumped back, a corrupt value) would hold the
            // subject beyond this policy's reset: clamped to the current
            // window, at most full, and written back.
            count = s.count.min(limit);
            repair = Some(State::FixedWindow(FixedWindowState {
                window_start_us: window_start,
                count,
            }));
        } else if s.window_start_us >= window_start {
            // The same window, or a later start (left by a policy whose
            // period changed, or by a clock a little ahead of this one): it
            // stays in force until its end.
            window_start = s.window_start_us;
            count = s.count;
            if count > limit {
                // More than this policy admits in a window (a limit that
                // shrank): clamped to the limit, and written back so that
                // the key's expiry is this window's end.
                count = limit;
                repair = Some(State::FixedWindow(FixedWindowState {
                    window_start_us: window_start,
                    count,
                }));
            }
        }
    }
    let end = u128::from(window_start) + u128::from(period);
    let until_end = micros(end - now);
    let reset = |count: u64| {
        if count == 0 {
            Duration::ZERO
        } else {
            until_end
        }
    };
    let remaining_old = limit.saturating_sub(count);

    let wanted = u128::from(count) + u128::from(cost.max(1));
    if wanted > u128::from(limit) {
        let denied = Decision::denied(limit, remaining_old, until_end, reset(count));
        return step(denied, repair, now_us);
    }
    if cost == 0 {
        return step(
            Decision::allowed(limit, remaining_old, reset(count)),
            repair,
            now_us,
        );
    }
    // `wanted <= limit`, a `u64`.
    let count = saturate(wanted);
    let new_state = State::FixedWindow(FixedWindowState {
        window_start_us: window_start,
        count,
    });
    step(
        Decision::allowed(limit, limit - count, reset(count)),
        Some(new_state),
        now_us,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    const MINUTE: u64 = 60_000_000;
    /// A minute boundary: 1 700 000 040 s is a multiple of 60.
    const W0: u64 = 1_700_000_040_000_000;

    fn per_minute(limit: u64) -> Policy {
        Policy::per_minute(limit)
            .algorithm(Algorithm::FixedWindow)
            .build()
            .unwrap()
    }

    #[test]
    fn resets_exactly_at_the_aligned_window_end() {
        assert_eq!(W0 % MINUTE, 0);
        let policy = per_minute(2);
        let mut state = None;
        let mut run = |now: u64| {
            let step = check(&policy, state.as_ref(), now, 1);
            if let Some(State::FixedWindow(next)) = step.new_state {
                state = Some(next);
            }
            step
        };
        let first = run(W0 + 10_000_000);
        assert!(first.decision.is_allowed());
        assert_eq!(first.decision.reset_after(), Duration::from_secs(50));
        assert_eq!(first.expires_at_us, W0 + MINUTE);
        assert!(run(W0 + 59_000_000).decision.is_allowed());
        let denied = run(W0 + MINUTE - 1);
        assert!(!denied.decision.is_allowed());
        assert_eq!(
            denied.decision.retry_after(),
            Some(Duration::from_micros(1))
        );
        let next = run(W0 + MINUTE);
        assert!(next.decision.is_allowed());
        assert_eq!(next.decision.remaining(), 1);
        assert_eq!(next.decision.reset_after(), Duration::from_secs(60));
    }

    #[test]
    fn a_later_window_holds_within_the_clock_tolerance_and_is_clamped_beyond() {
        let policy = per_minute(1);
        // A clock 30 s behind the one that opened the next window (within
        // the tolerance of a period): that window stays in force, its count
        // above the limit clamped and written back.
        let state = FixedWindowState {
            window_start_us: W0 + MINUTE,
            count: 5,
        };
        let step = check(&policy, Some(&state), W0 + 30_000_000, 1);
        assert!(!step.decision.is_allowed());
        assert_eq!(step.decision.retry_after(), Some(Duration::from_secs(90)));
        assert_eq!(step.expires_at_us, W0 + 2 * MINUTE);
        assert_eq!(
            step.new_state,
            Some(State::FixedWindow(FixedWindowState {
                window_start_us: W0 + MINUTE,
                count: 1,
            }))
        );
        // A window 2.5 minutes ahead is more than clocks that disagree
        // explain: it would hold the subject 3.5 minutes, beyond this
        // policy's reset of at most one. Clamped to the current window.
        let state = FixedWindowState {
            window_start_us: W0 + 3 * MINUTE,
            count: 5,
        };
        let step = check(&policy, Some(&state), W0 + 30_000_000, 1);
        assert!(!step.decision.is_allowed());
        assert_eq!(step.decision.retry_after(), Some(Duration::from_secs(30)));
        assert_eq!(step.expires_at_us, W0 + MINUTE);
        assert_eq!(
            step.new_state,
            Some(State::FixedWindow(FixedWindowState {
                window_start_us: W0,
                count: 1,
            }))
        );
    }

    #[test]
    fn end_of_time_does_not_overflow() {
        let policy = per_minute(1);
        let step = check(&policy, None, u64::MAX, 1);
        assert!(step.decision.is_allowed());
        assert_eq!(step.expires_at_us, u64::MAX);
    }
}
