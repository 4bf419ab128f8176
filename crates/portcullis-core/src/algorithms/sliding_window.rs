//! Sliding window counter.
//!
//! **What it does.** Keeps the counts of the current aligned window and the
//! one before it, and estimates the number of permits in the window of one
//! `period` ending now as `previous × (part of the previous window still
//! inside the sliding window) + current`. A request is admitted when the
//! estimate, with its cost added, is at most `limit`. The weighting is exact
//! (integers scaled by the period; past 2^52, in whole units of
//! [`weight_unit_micros`](super::weight_unit_micros) with the weight rounded up), so the
//! estimate never exceeds the limit at an admission.
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

use super::{gcra, micros, saturate, step, SlidingWindowState, State, Step};
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
    // The previous window's weight is counted in `unit` µs (1 when exact;
    // a power of ten dividing the period otherwise), rounded up.
    let unit = u128::from(policy.weight_unit_micros());
    let period_units = period / unit;
    let Window {
        window_start,
        elapsed,
        lag,
        previous,
        current,
        repair,
    } = window(state, limit_u64, period, u128::from(now_us));
    // The weight `period − elapsed` in units, rounded up.
    let elapsed_units = elapsed / unit;
    let weighted = previous * (period_units - elapsed_units);
    // Room for the previous window's weight when `current + c` are
    // counted: (limit − current − c)·period ≥ previous·weight.
    let room = |charged: u128| (limit.checked_sub(charged)).map(|free| free * period_units);
    let remaining_of = |charged: u128| {
        room(charged).map_or(0, |room| {
            saturate(room.saturating_sub(weighted) / period_units)
        })
    };
    let remaining_old = remaining_of(current);
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
    if room(current + cost_eval).is_none_or(|room| weighted > room) {
        let retry_after = Retry {
            limit,
            period,
            unit,
            elapsed,
            previous,
            current,
        }
        .after(cost_eval);
        let denied = Decision::denied(
            limit_u64,
            remaining_old,
            micros(lag + retry_after),
            reset(current),
        );
        return step(denied, repair, now_us);
    }
    if cost == 0 {
        let peek = Decision::allowed(limit_u64, remaining_old, reset(current));
        return step(peek, repair, now_us);
    }
    let current = current + cost_eval;
    let remaining = remaining_of(current);
    let new_state = State::SlidingWindow(SlidingWindowState {
        // The window start is `now_us` rounded down or the stored one.
        window_start_us: saturate(window_start),
        // Both counts are at most `limit`.
        previous: saturate(previous),
        current: saturate(current),
    });
    step(
        Decision::allowed(limit_u64, remaining, reset(current)),
        Some(new_state),
        now_us,
    )
}

/// The stored state as the window that contains now sees it.
struct Window {
    /// The start of the window the figures are for (now's, or the stored
    /// one when a clock a little behind the writer's reads it).
    window_start: u128,
    /// Time since `window_start`, µs.
    elapsed: u128,
    /// Above 0 only when a clock a little behind the one that wrote the state
    /// reads it: the stored window is used from its start, and the figures
    /// measured from the real now.
    lag: u128,
    /// The previous and current windows' counts, at most the limit.
    previous: u128,
    current: u128,
    /// The clamped state to write back, if the stored one was out of range.
    repair: Option<State>,
}

/// Reads `state` at `now` through the current policy (`limit`, `period`).
fn window(state: Option<&SlidingWindowState>, limit_u64: u64, period: u128, now: u128) -> Window {
    let limit = u128::from(limit_u64);
    let mut now = now;
    let mut window_start = now - now % period;
    let mut lag = 0;
    let mut repair = None;
    let (previous, current) = match state {
        Some(s) => {
            let s_start = u128::from(s.window_start_us);
            let (s_previous, s_current) = (
                u128::from(s.previous).min(limit),
                u128::from(s.current).min(limit),
            );
            let over = s.previous > limit_u64 || s.current > limit_u64;
            let (previous, current, clamped) = if s_start > now + gcra::clock_tolerance(2 * period)
            {
                // A window that starts later than clocks that disagree
                // explain (a clock that jumped back, a corrupt value) would
                // hold the subject beyond this policy's reset: clamped to
                // the current window.
                (s_previous, s_current, true)
            } else if s_start > now {
                lag = s_start - now;
                window_start = s_start;
                now = s_start;
                (s_previous, s_current, over)
            } else if s_start >= window_start {
                // The same window; or a window start between this window's
                // start and now, which only a policy whose period changed
                // leaves behind: its counts are recent, so they all count.
                (s_previous, s_current, over)
            } else if s_start + period == window_start {
                (s_current, 0, s.current > limit_u64)
            } else {
                (0, 0, false)
            };
            if clamped {
                // Counts above the limit (a limit that shrank) count as the
                // limit; the clamped state is written back.
                repair = Some(State::SlidingWindow(SlidingWindowState {
                    window_start_us: saturate(window_start),
                    previous: saturate(previous),
                    current: saturate(current),
                }));
            }
            (previous, current)
        }
        None => (0, 0),
    };
    Window {
        window_start,
        elapsed: now - window_start,
        lag,
        previous,
        current,
        repair,
    }
}

/// What a denied request's `retry_after` is computed from.
#[derive(Clone, Copy)]
struct Retry {
    limit: u128,
    period: u128,
    unit: u128,
    elapsed: u128,
    previous: u128,
    current: u128,
}

impl Retry {
    /// µs from the window's view of now until a request of `cost` alone is
    /// admitted, exactly.
    fn after(&self, cost: u128) -> u128 {
        let Self {
            limit,
            period,
            unit,
            elapsed,
            previous,
            current,
        } = *self;
        let period_units = period / unit;
        if current + cost <= limit {
            // Wait in this window until the previous window's weight has
            // dropped enough: previous·(units − e) ≤ room. Denied means
            // previous·weight > room ≥ 0, so previous > 0, and
            // room div previous < weight ≤ units.
            let room = (limit - current - cost) * period_units;
            let earliest = period_units - room / previous.max(1);
            (earliest * unit).saturating_sub(elapsed)
        } else {
            // Not before the next window, where the current count becomes
            // the previous one: current·(units − e) ≤ (limit − cost)·units.
            // current + cost > limit ≥ cost, so current > 0.
            let room = (limit - cost) * period_units;
            let earliest = period_units - (room / current.max(1)).min(period_units);
            (period - elapsed) + earliest * unit
        }
    }
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
    fn a_later_window_holds_within_the_clock_tolerance_and_is_clamped_beyond() {
        let policy = policy(1, Duration::from_secs(10));
        // 5 s ahead, within the tolerance (two periods): read from its
        // start, measured from real now, its counts clamped to the limit.
        let state = SlidingWindowState {
            window_start_us: W0 + 10 * SECOND,
            previous: 7,
            current: 1,
        };
        let step = check(&policy, Some(&state), W0 + 5 * SECOND, 1);
        assert!(!step.decision.is_allowed());
        // Treated as W0 + 10 s (5 s lag); there the next chance is the
        // window after, W0 + 20 s, when the 1 weighs (10 − e)/10 ≤ 0:
        // e = 10 s, so W0 + 30 s.
        assert_eq!(step.decision.retry_after(), Some(Duration::from_secs(25)));
        assert_eq!(step.expires_at_us, W0 + 30 * SECOND);
        assert_eq!(
            step.new_state,
            Some(State::SlidingWindow(SlidingWindowState {
                window_start_us: W0 + 10 * SECOND,
                previous: 1,
                current: 1,
            }))
        );
        // 25 s ahead: clamped to the current window.
        let state = SlidingWindowState {
            window_start_us: W0 + 30 * SECOND,
            previous: 7,
            current: 1,
        };
        let step = check(&policy, Some(&state), W0 + 5 * SECOND, 1);
        assert_eq!(step.decision.retry_after(), Some(Duration::from_secs(15)));
        assert_eq!(step.expires_at_us, W0 + 20 * SECOND);
        assert_eq!(
            step.new_state,
            Some(State::SlidingWindow(SlidingWindowState {
                window_start_us: W0,
                previous: 1,
                current: 1,
            }))
        );
    }
}
