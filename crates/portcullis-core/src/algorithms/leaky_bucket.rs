//! Leaky bucket, as a meter and as a queue.
//!
//! **What it does.** A bucket of `burst` permits leaks `limit` permits per
//! `period`. Each request pours its cost in.
//!
//! - As a **meter** ([`LeakyMode::Meter`](crate::LeakyMode::Meter)) a request
//!   that fits is admitted at once and one that would overflow the bucket is
//!   rejected. The admissions are the same as a token bucket's (water is the
//!   tokens already taken), with the state read the other way round.
//! - As a **queue** ([`LeakyMode::Queue`](crate::LeakyMode::Queue)) the
//!   bucket is a queue of requests served one every `period / limit`: a
//!   request that fits is admitted with a
//!   [`delay`](crate::Decision::delay), the time until its turn, and one that
//!   would overflow the queue (more than `burst` permits waiting) is
//!   rejected. With burst 3 at 1 per second, three requests at the same
//!   instant get delays of 0, 1 s and 2 s and a fourth is rejected.
//!
//! **State.** Meter: [`LeakyMeterState`], the water level in units of
//! `1 / period` of a permit (of `1 / increment` past 2^52:
//! [`emission_interval`](super::emission_interval); so draining `limit` units per microsecond
//! is exact) and when it was computed. Queue: [`LeakyQueueState`], the exact
//! time the queue is empty, the same number GCRA keeps. Denials write
//! nothing.
//!
//! **When to pick it.** The meter, when you think of capacity as a bucket
//! that fills up and drains. The queue, when callers should be slowed to a
//! steady pace instead of being rejected — an outbound client pacing its
//! calls to a partner API, a job runner — and can honour a delay.
//!
//! The arithmetic follows `ALGORITHMS.md` ("Leaky bucket meter" and "GCRA
//! and leaky bucket queue") exactly.

use super::{
    ceil_div, gcra, micros, saturate, step, LeakyMeterState, LeakyQueueState, State, Step,
};
use crate::{Decision, Policy};

pub(super) fn check_meter(
    policy: &Policy,
    state: Option<&LeakyMeterState>,
    now_us: u64,
    cost: u64,
) -> Step {
    let capacity = policy.capacity();
    // A permit is `increment` units of water; the drain is `scale` units
    // per µs (`limit` and `period` when the policy is exact).
    let (scale, increment) = policy.emission_interval();
    let (scale, increment) = (u128::from(scale), u128::from(increment));
    let full = u128::from(capacity) * increment;
    let now = u128::from(now_us);
    let (mut level, last) =
        state.map_or((0, now), |s| (u128::from(s.level), u128::from(s.last_us)));
    if now > last {
        let elapsed = now - last;
        if elapsed >= ceil_div(level, scale) {
            level = 0;
        } else {
            level -= elapsed * scale;
        }
    }
    let mut last = last.max(now);
    // > 0 only when the clock went back: the drain resumes at `last`.
    let mut lag = last - now;
    // More water than the bucket holds (a burst that shrank), or empty in
    // `lag + level / scale`, more than a full bucket now needs beyond the
    // clock tolerance (a clock that jumped back, a corrupt value), is more
    // than this policy can leave: clamped to a full bucket now, and written
    // back.
    let full_reset = ceil_div(full, scale);
    let mut repair = None;
    if level > full || lag + ceil_div(level, scale) > full_reset + gcra::clock_tolerance(full_reset)
    {
        (level, last, lag) = (full, now, 0);
        repair = Some(State::LeakyMeter(LeakyMeterState {
            level: saturate(full),
            last_us: now_us,
        }));
    }
    let remaining_old = saturate((full - level) / increment);
    let reset_old = micros(lag + ceil_div(level, scale));

    let need = u128::from(cost.max(1)) * increment;
    if level + need > full {
        let retry_after = micros(lag + ceil_div(level + need - full, scale));
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
    let level = level + need;
    let remaining = saturate((full - level) / increment);
    let reset_after_us = saturate(lag + ceil_div(level, scale));
    let new_state = State::LeakyMeter(LeakyMeterState {
        // `level <= full <= 2^52` by the admission test.
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

pub(super) fn check_queue(
    policy: &Policy,
    state: Option<&LeakyQueueState>,
    now_us: u64,
    cost: u64,
) -> Step {
    let free = state.map(|s| (s.free_us, s.free_rem));
    let (decision, new) = gcra::virtual_time(policy, free, now_us, cost, true);
    let new_state =
        new.map(|(free_us, free_rem)| State::LeakyQueue(LeakyQueueState { free_us, free_rem }));
    step(decision, new_state, now_us)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Algorithm, LeakyMode};

    const T0: u64 = 1_700_000_000_000_000;
    const SECOND: u64 = 1_000_000;

    fn policy(mode: LeakyMode, limit: u64, period: Duration, burst: u64) -> Policy {
        Policy::per(limit, period)
            .algorithm(Algorithm::LeakyBucket(mode))
            .burst(burst)
            .build()
            .unwrap()
    }

    #[test]
    fn queue_delays_then_rejects() {
        let policy = policy(LeakyMode::Queue, 1, Duration::from_secs(1), 3);
        let mut state = None;
        for (i, delay) in [0, 1, 2].into_iter().enumerate() {
            let step = check_queue(&policy, state.as_ref(), T0, 1);
            assert!(step.decision.is_allowed(), "request {i}");
            assert_eq!(step.decision.delay(), Duration::from_secs(delay));
            assert_eq!(step.decision.remaining(), 2 - i as u64);
            let Some(State::LeakyQueue(next)) = step.new_state else {
                panic!("an admitted request writes the queue state")
            };
            state = Some(next);
        }
        let step = check_queue(&policy, state.as_ref(), T0, 1);
        assert!(!step.decision.is_allowed());
        assert_eq!(step.decision.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(step.decision.delay(), Duration::ZERO);
        assert_eq!(step.new_state, None);
        // One second later one slot is free again and the wait is 2 s.
        let step = check_queue(&policy, state.as_ref(), T0 + SECOND, 1);
        assert!(step.decision.is_allowed());
        assert_eq!(step.decision.delay(), Duration::from_secs(2));
    }

    #[test]
    fn meter_fills_and_drains() {
        // Drains 2 per second (one every 500 ms), holds 4.
        let policy = policy(LeakyMode::Meter, 2, Duration::from_secs(1), 4);
        let mut state = None;
        let mut run = |now: u64, cost: u64| {
            let step = check_meter(&policy, state.as_ref(), now, cost);
            if let Some(State::LeakyMeter(next)) = step.new_state {
                state = Some(next);
            }
            step.decision
        };
        let d = run(T0, 3);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after(), Duration::from_millis(1_500));
        let d = run(T0, 2);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        assert_eq!(d.remaining(), 1);
        // 250 ms later half a permit has drained: still no room for 2.
        let d = run(T0 + 250_000, 2);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(250)));
        let d = run(T0 + 500_000, 2);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after(), Duration::from_secs(2));
        // Long idle: empty, not negative.
        let d = run(T0 + 3_600 * SECOND, 0);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 4);
        assert_eq!(d.reset_after(), Duration::ZERO);
    }

    #[test]
    fn meter_clock_going_back_measures_from_real_now() {
        let roomy = policy(LeakyMode::Meter, 1, Duration::from_secs(1), 2);
        let policy = policy(LeakyMode::Meter, 1, Duration::from_secs(1), 1);
        let first = check_meter(&policy, None, T0, 1);
        let Some(State::LeakyMeter(state)) = first.new_state else {
            panic!("admitted")
        };
        // The clock jumps 5 s back: draining from T0 on, the bucket would
        // hold the next request 6 s, more than this policy's full reset
        // (1 s). It is clamped to a full bucket now, and written back.
        let back = check_meter(&policy, Some(&state), T0 - 5 * SECOND, 1);
        assert!(!back.decision.is_allowed());
        assert_eq!(back.decision.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(back.expires_at_us, T0 - 4 * SECOND);
        assert_eq!(
            back.new_state,
            Some(State::LeakyMeter(LeakyMeterState {
                level: SECOND,
                last_us: T0 - 5 * SECOND,
            }))
        );
        // With room for two, a clock 0.5 s back stays within the reset:
        // the drain resumes at T0, measured from real now.
        let back = check_meter(&roomy, Some(&state), T0 - SECOND / 2, 1);
        assert!(back.decision.is_allowed());
        assert_eq!(back.decision.reset_after(), Duration::from_millis(2_500));
        assert_eq!(
            back.new_state,
            Some(State::LeakyMeter(LeakyMeterState {
                level: 2 * SECOND,
                last_us: T0,
            }))
        );
    }
}
