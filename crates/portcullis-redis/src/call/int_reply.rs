//! The fast functions' replies, one integer per policy where the general
//! check answers five: `<name>_gcra` (one policy; a lead in µs, or in
//! `1 / limit` µs when the interval is not a whole number of µs),
//! `<name>_gcra_multi` (several whole-µs policies, one lead each), the
//! one-policy fast functions of the other algorithms, a coalesced batch of
//! one of those (each check's integer as its fast function answers it)
//! and a local budget's grant (ALGORITHMS.md, "The Redis fast
//! path"). The decisions are derived here, with the core's own
//! arithmetic, from each integer.

use portcullis_core::algorithms::{
    self, FixedWindowState, GcraState, LeakyMeterState, LeakyQueueState, SlidingWindowState, State,
    TokenBucketState,
};
use portcullis_core::{Algorithm, Decision, LeakyMode, Policy, StoreError, Verdict};
use redis::Value;

use super::reply::{parse_verdict, protocol};

/// The verdict for gcra_multi's replies, one lead per policy: when every
/// policy admits, each decision is its charge; otherwise nothing was
/// charged, and a policy that would have admitted reports its peek.
pub(crate) fn multi_verdict(
    policies: &[Policy],
    leads: &[i64],
    cost: u64,
) -> Result<Verdict, StoreError> {
    let all = leads.iter().all(|lead| *lead >= 0);
    policies
        .iter()
        .zip(leads)
        .map(|(policy, &lead)| {
            let cost = if all || lead < 0 { cost } else { 0 };
            fast_decision(policy, lead, cost)
        })
        .collect()
}

/// The verdict for the fast function's reply (or one reply of a coalesced
/// batch of its policy, which answers the same for each check).
pub(crate) fn verdict(
    policy: &Policy,
    reply: i64,
    cost: u64,
) -> Result<portcullis_core::Verdict, StoreError> {
    if policy.algorithm() == Algorithm::SlidingLog {
        return log_admitted(policy, reply, cost);
    }
    fast_decision(policy, reply, cost).map(|d| std::iter::once(d).collect())
}

/// The verdict for the fast sliding log function's one integer: the live
/// entries before an admitted check. The general check's reply for it
/// (sliding_log.lua): admitted, `limit - live - cost` left, reset after
/// one period (the new entries are the newest, at now).
fn log_admitted(policy: &Policy, live: i64, cost: u64) -> Result<Verdict, StoreError> {
    let remaining = u64::try_from(live)
        .ok()
        .and_then(|live| policy.limit().checked_sub(live)?.checked_sub(cost));
    let figures = remaining
        .and_then(|remaining| i64::try_from(remaining).ok())
        .zip(i64::try_from(policy.period_micros()).ok());
    let Some((remaining, period)) = figures else {
        return Err(protocol(format!(
            "the fast sliding log function admitted a check with {live} entries live, \
             past this policy's limit; is the library from another portcullis-redis version?"
        )));
    };
    let reply = [1, remaining, -1, period, 0].map(Value::Int).to_vec();
    parse_verdict(Value::Array(reply), &[policy.capacity()])
}

/// The decision for the fast function's reply: the state's lead over now
/// before the call, `ahead` when admitted and `-1 - ahead` when denied.
fn fast_decision(policy: &Policy, reply: i64, cost: u64) -> Result<Decision, StoreError> {
    let (admitted, ahead) = if reply >= 0 {
        (true, reply.unsigned_abs())
    } else {
        // -1 - ahead; reply + 1 cannot overflow for a negative reply.
        (false, (reply + 1).unsigned_abs())
    };
    // The same step the script took, seen from a clock at `now`: only the
    // lead matters to GCRA and the leaky bucket queue, only the level
    // after the refill to a token bucket, only the count and the time into
    // the window to a fixed window, only the two counts and the time into
    // the window to a sliding window.
    let (state, now) = match policy.algorithm() {
        // The sliding log's one integer is read by log_admitted.
        Algorithm::SlidingLog => {
            return Err(protocol(format!(
                "a sliding log's fast reply ({reply}) read as another algorithm's"
            )));
        }
        Algorithm::TokenBucket => (
            State::TokenBucket(TokenBucketState {
                level: ahead,
                last_us: 0,
            }),
            0,
        ),
        Algorithm::LeakyBucket(LeakyMode::Meter) => (
            State::LeakyMeter(LeakyMeterState {
                level: ahead,
                last_us: 0,
            }),
            0,
        ),
        Algorithm::FixedWindow => {
            let period = policy.period_micros().max(1);
            (
                State::FixedWindow(FixedWindowState {
                    window_start_us: 0,
                    count: ahead / period,
                }),
                ahead % period,
            )
        }
        // The counts the check weighed and the time into the window:
        // (previous × (limit + 1) + current) × period + elapsed.
        Algorithm::SlidingWindow => {
            let period = policy.period_micros().max(1);
            let slots = policy.limit().saturating_add(1);
            let counts = ahead / period;
            (
                State::SlidingWindow(SlidingWindowState {
                    window_start_us: 0,
                    previous: counts / slots,
                    current: counts % slots,
                }),
                ahead % period,
            )
        }
        // The time until the queue is free, as GCRA's lead.
        Algorithm::LeakyBucket(LeakyMode::Queue) => (
            State::LeakyQueue(LeakyQueueState {
                free_us: ahead,
                free_rem: 0,
            }),
            0,
        ),
        // The lead in units of `1 / scale` µs when the interval is not a
        // whole number of microseconds (`gcra_fraction`; the function is
        // only called for exact policies, whose scale is the limit), else
        // in microseconds.
        _ => {
            let (scale, period) = algorithms::emission_interval(policy);
            let scale = scale.max(1);
            let state = if period % scale == 0 {
                GcraState {
                    tat_us: ahead,
                    tat_rem: 0,
                }
            } else {
                GcraState {
                    tat_us: ahead / scale,
                    tat_rem: ahead % scale,
                }
            };
            (State::Gcra(state), 0)
        }
    };
    let step = algorithms::check_fast(policy, Some(&state), now, cost);
    let decision = step.decision;
    // The function hands a state it would clamp (a repair, the only write
    // a denial makes) to the general check, so such a lead is never its
    // answer.
    let repaired = !decision.is_allowed() && step.new_state.is_some();
    if repaired {
        return Err(protocol(format!(
            "the fast function answered a state ({ahead}) beyond what the policy allows; \
             is the library from another portcullis-redis version?"
        )));
    }
    if decision.is_allowed() != admitted {
        return Err(protocol(format!(
            "the fast function answered {reply}, which {} for this policy; \
             is the library from another portcullis-redis version?",
            if admitted { "denies" } else { "admits" }
        )));
    }
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn policy() -> Policy {
        Policy::per_second(100)
            .burst(10)
            .name("api")
            .build()
            .unwrap()
    }

    #[test]
    fn replies_decode_to_the_core_decision() {
        // 100/s burst 10: an interval of 10 000 µs, a capacity of 100 000 µs.
        let admitted = fast_decision(&policy(), 30_000, 1).unwrap();
        assert!(admitted.is_allowed());
        assert_eq!(admitted.remaining(), 6);
        assert_eq!(admitted.reset_after(), Duration::from_micros(40_000));

        let denied = fast_decision(&policy(), -1 - 95_000, 1).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.retry_after(), Some(Duration::from_micros(5_000)));
        assert_eq!(denied.reset_after(), Duration::from_micros(95_000));
    }

    #[test]
    fn sliding_window_and_queue_replies_decode_to_the_core_decision() {
        // 5 per 300 ms: (previous × 6 + current) × 300 000 + elapsed.
        let window = Policy::per(5, Duration::from_millis(300))
            .algorithm(Algorithm::SlidingWindow)
            .build()
            .unwrap();
        // Previous 2, current 1, 100 ms into the window: a weight of
        // 2 × 200 000 µs, room for one more after this check.
        let admitted = fast_decision(&window, (2 * 6 + 1) * 300_000 + 100_000, 1).unwrap();
        assert!(admitted.is_allowed());
        assert_eq!(admitted.remaining(), 1);
        assert_eq!(admitted.reset_after(), Duration::from_micros(500_000));
        // Previous 5 at the window's start: denied until the weight of the
        // previous window is 4 permits' worth, 60 ms on.
        let denied = fast_decision(&window, -1 - 5 * 6 * 300_000, 1).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.remaining(), 0);
        assert_eq!(denied.retry_after(), Some(Duration::from_micros(60_000)));
        assert_eq!(denied.reset_after(), Duration::from_micros(300_000));
        // A leaky bucket queue (10/s, burst 4) free in 300 ms: admitted with
        // that delay, the queue then full.
        let queue = Policy::per_second(10)
            .burst(4)
            .algorithm(Algorithm::LeakyBucket(LeakyMode::Queue))
            .build()
            .unwrap();
        let queued = fast_decision(&queue, 300_000, 1).unwrap();
        assert!(queued.is_allowed());
        assert_eq!(queued.delay(), Duration::from_micros(300_000));
        assert_eq!(queued.remaining(), 0);
        assert_eq!(queued.reset_after(), Duration::from_micros(400_000));
        assert!(fast_decision(&queue, -1 - 300_000, 1).is_err());
    }

    #[test]
    fn a_sliding_log_admission_decodes_from_its_live_entries() {
        let log = Policy::per_second(100)
            .algorithm(Algorithm::SlidingLog)
            .build()
            .unwrap();
        let admitted = verdict(&log, 40, 2).unwrap();
        let decision = &admitted.decisions()[0];
        assert!(decision.is_allowed());
        assert_eq!(decision.remaining(), 58);
        assert_eq!(decision.retry_after(), None);
        assert_eq!(decision.reset_after(), Duration::from_secs(1));
        // More live entries than an admission leaves room for, or fewer
        // than none: protocol errors, never a panic.
        for live in [99, 100, -1, i64::MIN, i64::MAX] {
            assert!(matches!(
                verdict(&log, live, 2),
                Err(StoreError::Protocol { .. })
            ));
        }
    }

    #[test]
    fn a_reply_that_disagrees_is_a_protocol_error() {
        assert!(matches!(
            fast_decision(&policy(), 100_000, 1),
            Err(StoreError::Protocol { .. })
        ));
        assert!(matches!(
            fast_decision(&policy(), -1, 1),
            Err(StoreError::Protocol { .. })
        ));
        assert!(fast_decision(&policy(), i64::MIN, 1).is_err());
        assert!(fast_decision(&policy(), i64::MAX, 1).is_err());
    }
}
