//! Sliding log.
//!
//! **What it does.** Remembers the time of every admitted permit until it
//! leaves the window `(now − period, now]`, and admits a request when the
//! permits still in the window plus its cost are at most `limit`. The count
//! is exact: in no interval of one period are more than `limit` permits
//! admitted. Denied requests are not recorded (unlike the `ZADD`-first Redis
//! recipe), and permits admitted within the same microsecond are separate
//! entries (in Redis, members made unique by a per-key sequence), so they
//! never collide.
//!
//! **State.** [`SlidingLogState`]: one timestamp per admitted permit, oldest
//! first. Memory and time grow with the limit, which is why policies refuse
//! limits above [`SLIDING_LOG_MAX_LIMIT`](crate::SLIDING_LOG_MAX_LIMIT).
//! Denials write nothing.
//!
//! **When to pick it.** When the limit must hold exactly over every rolling
//! window — small limits such as "5 login attempts per 15 minutes". For large
//! limits use the sliding window counter or GCRA.
//!
//! The arithmetic follows `ALGORITHMS.md` ("Sliding log") exactly.

use std::collections::VecDeque;
use std::time::Duration;

use super::{micros, saturate, step, SlidingLogState, State, Step};
use crate::{Decision, Policy};

pub(super) fn check(
    policy: &Policy,
    state: Option<&SlidingLogState>,
    now_us: u64,
    cost: u64,
) -> Step {
    let limit = policy.limit();
    let period = u128::from(policy.period_micros());
    let now = u128::from(now_us);
    let empty = SlidingLogState::default();
    let stored = &state.unwrap_or(&empty).entries;
    let is_live = move |t: u64| u128::from(t) + period > now;
    // A log with entries later than clocks that disagree explain (a clock
    // that jumped back, a corrupt value) or more live entries than the
    // limit (a limit that shrank) holds more than this policy can leave:
    // clamped to its newest `limit` entries, none after now, and written
    // back.
    let (stored_live, stored_newest) = stored
        .iter()
        .copied()
        .filter(|&t| is_live(t))
        .fold((0_usize, None), |(n, newest), t| {
            (n + 1, newest.max(Some(t)))
        });
    let over_limit = u64::try_from(stored_live).map_or(true, |n| n > limit);
    let tolerance = super::gcra::clock_tolerance(period);
    let ahead = stored_newest.is_some_and(|t| u128::from(t.saturating_sub(now_us)) > tolerance);
    let clamped = (over_limit || ahead).then(|| {
        let live: VecDeque<u64> = stored
            .iter()
            .copied()
            .filter(|&t| is_live(t))
            .map(|t| t.min(now_us))
            .collect();
        let extra = live
            .len()
            .saturating_sub(usize::try_from(limit).unwrap_or(usize::MAX));
        live.into_iter().skip(extra).collect::<VecDeque<u64>>()
    });
    let entries = clamped.as_ref().unwrap_or(stored);
    // Entries with `t + period <= now` have left the window. (The log is
    // ascending, so they are the oldest; filtering rather than cutting the
    // front keeps a corrupted, unsorted log from counting stale entries.)
    let live = || entries.iter().copied().filter(move |&t| is_live(t));
    // One pass for the live count and the newest live entry.
    let (live_len, newest) = live().fold((0_usize, None), |(n, newest), t| {
        (n + 1, newest.max(Some(t)))
    });
    let repair = clamped
        .clone()
        .map(|entries| State::SlidingLog(SlidingLogState { entries }));
    let count = u64::try_from(live_len).unwrap_or(u64::MAX);
    let remaining_old = limit.saturating_sub(count);
    let reset_old = newest.map_or(Duration::ZERO, |t| {
        micros((u128::from(t) + period).saturating_sub(now))
    });

    let cost_eval = cost.max(1);
    // `count + cost_eval` cannot overflow in u128.
    let over = (u128::from(count) + u128::from(cost_eval)).saturating_sub(u128::from(limit));
    if over > 0 {
        // The `over`-th oldest live entry must leave the window first.
        // `over <= count` because `cost_eval <= limit`.
        let index = saturate(over - 1);
        let oldest_to_leave = usize::try_from(index)
            .ok()
            .and_then(|i| live().nth(i))
            .unwrap_or(now_us);
        let retry_after = micros((u128::from(oldest_to_leave) + period).saturating_sub(now));
        let denied = Decision::denied(limit, remaining_old, retry_after, reset_old);
        return step(denied, repair, now_us);
    }
    if cost == 0 {
        return step(
            Decision::allowed(limit, remaining_old, reset_old),
            repair,
            now_us,
        );
    }
    // Keep the log ascending even when the clock went back.
    let at = newest.map_or(now_us, |t| t.max(now_us));
    // `cost <= limit <= SLIDING_LOG_MAX_LIMIT`, checked by `check` and by the policy.
    let added = usize::try_from(cost).unwrap_or(0);
    let mut kept = VecDeque::with_capacity(live_len.saturating_add(added));
    kept.extend(live());
    kept.extend(std::iter::repeat_n(at, added));
    let count = count + cost;
    let reset_after_us = saturate(u128::from(at) + period - now);
    step(
        Decision::allowed_us(limit, limit - count, reset_after_us),
        Some(State::SlidingLog(SlidingLogState { entries: kept })),
        now_us,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    const T0: u64 = 1_700_000_000_000_000;
    const SECOND: u64 = 1_000_000;

    fn policy(limit: u64, period: Duration) -> Policy {
        Policy::per(limit, period)
            .algorithm(Algorithm::SlidingLog)
            .build()
            .unwrap()
    }

    fn admit(
        policy: &Policy,
        state: &mut Option<SlidingLogState>,
        now: u64,
        cost: u64,
    ) -> Decision {
        let step = check(policy, state.as_ref(), now, cost);
        if let Some(State::SlidingLog(next)) = step.new_state {
            *state = Some(next);
        }
        step.decision
    }

    #[test]
    fn same_microsecond_hits_are_separate_entries() {
        let policy = policy(3, Duration::from_secs(10));
        let mut state = None;
        for remaining in [2, 1, 0] {
            let d = admit(&policy, &mut state, T0, 1);
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), remaining);
        }
        assert_eq!(state.as_ref().unwrap().entries, [T0, T0, T0]);
        let d = admit(&policy, &mut state, T0 + 1, 1);
        assert!(!d.is_allowed());
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_micros(10 * SECOND - 1))
        );
        // All three leave together.
        let d = admit(&policy, &mut state, T0 + 10 * SECOND, 3);
        assert!(d.is_allowed());
        assert_eq!(state.as_ref().unwrap().entries, [T0 + 10 * SECOND; 3]);
    }

    #[test]
    fn rolling_window_is_exact() {
        let policy = policy(2, Duration::from_secs(10));
        let mut state = None;
        assert!(admit(&policy, &mut state, T0, 1).is_allowed());
        assert!(admit(&policy, &mut state, T0 + 6 * SECOND, 1).is_allowed());
        // At T0 + 9 s both are in the window; the first leaves at T0 + 10 s.
        let d = admit(&policy, &mut state, T0 + 9 * SECOND, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(d.reset_after(), Duration::from_secs(7));
        assert!(!admit(&policy, &mut state, T0 + 10 * SECOND - 1, 1).is_allowed());
        let d = admit(&policy, &mut state, T0 + 10 * SECOND, 1);
        assert!(d.is_allowed());
        assert_eq!(
            state.as_ref().unwrap().entries,
            [T0 + 6 * SECOND, T0 + 10 * SECOND]
        );
    }

    #[test]
    fn entry_at_time_zero_stays_inside_its_window() {
        let policy = policy(1, Duration::from_micros(10));
        let mut state = None;
        assert!(admit(&policy, &mut state, 0, 1).is_allowed());
        assert!(!admit(&policy, &mut state, 5, 1).is_allowed());
        assert!(!admit(&policy, &mut state, 9, 1).is_allowed());
        assert!(admit(&policy, &mut state, 10, 1).is_allowed());
    }
}
