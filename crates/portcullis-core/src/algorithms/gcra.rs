//! GCRA, the generic cell rate algorithm (the default algorithm).
//!
//! **What it does.** Requests are expected one every emission interval
//! `period / limit`. The state is the *theoretical arrival time* (TAT): when
//! the key would be back to full if nothing else arrived. A request of cost
//! `c` moves the TAT `c` emission intervals past `max(TAT, now)` and is
//! admitted when the TAT then lies at most `burst` emission intervals ahead of
//! now. The outcome is a smooth rate of `limit` per `period` that tolerates
//! `burst` permits at once after an idle spell — the same admissions a token
//! bucket makes, kept in a single number.
//!
//! **State.** One time, [`GcraState`]: whole microseconds plus a fraction in
//! units of `1 / limit`, so emission intervals that are not whole
//! microseconds (3 per second is 333 333⅓ µs) accumulate exactly and never
//! drift. (A policy past 2^52 counts in `1 / 2^k` µs instead, its interval
//! rounded up: [`emission_interval`](super::emission_interval).) Denials write nothing but a
//! repair (ALGORITHMS.md, "Changing a policy").
//!
//! **When to pick it.** By default: it is the cheapest algorithm (one integer
//! per key in Redis), its answers are exact, and [`throttle`] reproduces
//! redis-cell's `CL.THROTTLE` reply for code migrating off the module. Pick a
//! window algorithm instead when the limit must read as "N per calendar
//! window", and the leaky-bucket queue when requests should be delayed to a
//! steady pace rather than rejected.
//!
//! The arithmetic follows `ALGORITHMS.md` ("GCRA") exactly. A time `us +
//! rem / S` is handled here as the single integer `us·S + rem` in `u128`,
//! which is the same arithmetic as the pairs the Lua scripts use.

use std::fmt;
use std::time::Duration;

use super::{ceil_div, micros, saturate, step, GcraState, State, Step};
use crate::{Algorithm, Decision, Policy, PolicyError};

/// The five integers redis-cell's `CL.THROTTLE` replies with, in order.
///
/// Built by [`throttle`]; [`ThrottleReply::to_array`] gives the reply as
/// redis-cell sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThrottleReply {
    /// Whether the request was limited (redis-cell's first integer, 1 or 0).
    /// A peek (`quantity` 0) is never limited.
    pub limited: bool,
    /// The total limit of the key: `max_burst + 1`.
    pub limit: i64,
    /// Remaining cost-1 requests that would be admitted right now, after this
    /// one (before it, when limited or peeking).
    pub remaining: i64,
    /// When limited: seconds until the same request would be admitted,
    /// rounded up as redis-cell 0.5 rounds (the whole seconds, plus one when
    /// at least a millisecond remains). -1 when admitted, for a peek, and
    /// when `quantity` exceeds `max_burst + 1` (it can never be admitted).
    pub retry_after_secs: i64,
    /// Seconds until the key is back to its full limit, rounded as
    /// `retry_after_secs` is.
    pub reset_after_secs: i64,
}

impl ThrottleReply {
    /// The reply as redis-cell sends it:
    /// `[limited, limit, remaining, retry_after, reset_after]`, with
    /// `limited` as 1 or 0.
    ///
    /// ```
    /// use portcullis::algorithms::throttle;
    ///
    /// let (reply, _) = throttle(None, 0, 15, 30, 60, 1)?;
    /// assert_eq!(reply.to_array(), [0, 16, 15, -1, 2]);
    /// # Ok::<(), portcullis::algorithms::ThrottleError>(())
    /// ```
    #[must_use]
    pub const fn to_array(&self) -> [i64; 5] {
        [
            self.limited as i64,
            self.limit,
            self.remaining,
            self.retry_after_secs,
            self.reset_after_secs,
        ]
    }
}

/// Why [`throttle`] refused its arguments. redis-cell refuses the same
/// arguments with an error reply.
///
/// ```
/// use portcullis::algorithms::{throttle, ThrottleError};
///
/// let err = throttle(None, 0, 15, 0, 60, 1).unwrap_err();
/// assert_eq!(err, ThrottleError::ZeroCount);
/// assert!(err.to_string().contains("at least 1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ThrottleError {
    /// `count` was 0.
    ZeroCount,
    /// `period` was 0.
    ZeroPeriod,
    /// An argument, or a product of arguments, is too large to compute
    /// exactly.
    TooLarge {
        /// The argument to make smaller: `max_burst`, `count` or `period`.
        argument: &'static str,
        /// The bound that was crossed.
        detail: &'static str,
    },
    /// The arguments make a policy that cannot be built for another reason.
    Policy(PolicyError),
}

impl fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroCount => {
                f.write_str("throttle count is 0: give a count of at least 1 request per period")
            }
            Self::ZeroPeriod => {
                f.write_str("throttle period is 0: give a period of at least 1 second")
            }
            Self::TooLarge { argument, detail } => {
                write!(f, "throttle {argument} is too large: {detail}")
            }
            Self::Policy(_) => f.write_str(
                "throttle arguments do not make a valid policy (the cause says which and what to change)",
            ),
        }
    }
}

impl std::error::Error for ThrottleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Policy(err) => Some(err),
            _ => None,
        }
    }
}

impl ThrottleError {
    fn from_policy(err: PolicyError) -> Self {
        match err {
            PolicyError::ZeroLimit => Self::ZeroCount,
            PolicyError::ZeroPeriod => Self::ZeroPeriod,
            PolicyError::TooLarge { field: "period", .. } => Self::TooLarge {
                argument: "period",
                detail: "the period in microseconds must stay below 2^52 (about 142 years)",
            },
            PolicyError::TooLarge { field: "limit", .. } => Self::TooLarge {
                argument: "count",
                detail: "count per period cannot be computed exactly (ALGORITHMS.md, \"Magnitudes\"); use a smaller count",
            },
            PolicyError::TooLarge { field: "burst", .. } => Self::TooLarge {
                argument: "max_burst",
                detail: "(max_burst + 1) × period cannot be computed exactly (ALGORITHMS.md, \"Magnitudes\"); use a smaller max_burst",
            },
            other => Self::Policy(other),
        }
    }
}

/// redis-cell's `CL.THROTTLE key max_burst count period quantity`, computed
/// with portcullis's exact GCRA.
///
/// `state` is the key's stored state (`None` for a new or expired key) and
/// `now_us` the time in microseconds since the Unix epoch. The arguments
/// mean what they mean to redis-cell: `count` requests per `period` seconds,
/// with bursts of up to `max_burst + 1`, for a request of cost `quantity`
/// (0 peeks). Returns the reply and the state to store, `None` when nothing
/// changes (limited requests and peeks write nothing, except that a limited
/// request writes back a stored state clamped to this policy's worst case:
/// ALGORITHMS.md, "Changing a policy"); the state may be forgotten
/// `reset_after` after `now_us`.
///
/// Durations are rounded to seconds as redis-cell 0.5 rounds them: the
/// whole seconds, plus one when at least a millisecond remains, so a client
/// that waits the reply's `retry_after` is never early.
///
/// The example from redis-cell's README, `CL.THROTTLE user123 15 30 60 1`
/// on a new key (30 requests per 60 seconds, bursts of 16):
///
/// ```
/// use portcullis::algorithms::throttle;
///
/// let now = 1_700_000_000_000_000;
/// let (reply, state) = throttle(None, now, 15, 30, 60, 1)?;
/// assert_eq!(reply.to_array(), [0, 16, 15, -1, 2]);
/// let (second, _) = throttle(state.as_ref(), now, 15, 30, 60, 1)?;
/// assert_eq!(second.to_array(), [0, 16, 14, -1, 4]);
///
/// // 15 more at the same instant are admitted; the 17th is limited and may
/// // retry in 2 seconds (one emission interval); the key is full in 32.
/// let mut state = state;
/// for _ in 0..15 {
///     let (reply, next) = throttle(state.as_ref(), now, 15, 30, 60, 1)?;
///     assert!(!reply.limited);
///     state = next;
/// }
/// let (reply, unchanged) = throttle(state.as_ref(), now, 15, 30, 60, 1)?;
/// assert_eq!(reply.to_array(), [1, 16, 0, 2, 32]);
/// assert_eq!(unchanged, None);
/// # Ok::<(), portcullis::algorithms::ThrottleError>(())
/// ```
///
/// # Errors
///
/// [`ThrottleError`] when `count` or `period` is 0 or the arguments are too
/// large to compute exactly (see [`MAX_MAGNITUDE`](crate::MAX_MAGNITUDE)).
pub fn throttle(
    state: Option<&GcraState>,
    now_us: u64,
    max_burst: u64,
    count: u64,
    period_secs: u64,
    quantity: u64,
) -> Result<(ThrottleReply, Option<GcraState>), ThrottleError> {
    let policy = throttle_policy(max_burst, count, period_secs)?;
    // A quantity above the burst can never pass: it peeks for the figures
    // (as RedisStore::throttle does), and a peek writes nothing.
    let cost = if quantity > policy.capacity() {
        0
    } else {
        quantity
    };
    let Step {
        decision,
        new_state,
        ..
    } = check(&policy, state, now_us, cost);
    let new_state = match new_state {
        Some(State::Gcra(state)) if cost > 0 => Some(state),
        _ => None,
    };
    Ok((throttle_reply(&decision, &policy, quantity), new_state))
}

/// The policy name [`throttle`] (and every store's throttle) keeps its
/// state under.
pub const THROTTLE_POLICY_NAME: &str = "throttle";

/// The GCRA policy `CL.THROTTLE key max_burst count period` applies:
/// `count` per `period_secs` seconds with a burst of `max_burst + 1`, named
/// [`THROTTLE_POLICY_NAME`]. Stores that answer `throttle` themselves build
/// it here, so they refuse exactly the arguments [`throttle`] refuses.
///
/// ```
/// use portcullis::algorithms::throttle_policy;
///
/// let policy = throttle_policy(15, 30, 60)?;
/// assert_eq!((policy.capacity(), policy.limit()), (16, 30));
/// assert!(throttle_policy(15, 0, 60).is_err());
/// # Ok::<(), portcullis::algorithms::ThrottleError>(())
/// ```
///
/// # Errors
///
/// As [`throttle`].
pub fn throttle_policy(
    max_burst: u64,
    count: u64,
    period_secs: u64,
) -> Result<Policy, ThrottleError> {
    let burst = max_burst.checked_add(1).ok_or(ThrottleError::TooLarge {
        argument: "max_burst",
        detail: "max_burst + 1 must fit in 64 bits; use a smaller max_burst",
    })?;
    Policy::per(count, Duration::from_secs(period_secs))
        .algorithm(Algorithm::Gcra)
        .burst(burst)
        .name(THROTTLE_POLICY_NAME)
        .build()
        .map_err(ThrottleError::from_policy)
}

/// redis-cell's reply for a request of `quantity` that a store decided
/// with `decision` under `policy` (from [`throttle_policy`]). A quantity
/// above the burst can never be admitted: it is `limited` with a
/// `retry_after` of -1, whether the store checked it (denied for ever) or
/// only peeked.
#[must_use]
pub fn throttle_reply(decision: &Decision, policy: &Policy, quantity: u64) -> ThrottleReply {
    let never = quantity > policy.capacity();
    let limited = never || (quantity > 0 && !decision.is_allowed());
    let retry_after_secs = match decision.retry_after() {
        Some(retry) if limited && !never && retry != Duration::MAX => seconds(retry),
        _ => -1,
    };
    ThrottleReply {
        limited,
        limit: i64::try_from(policy.capacity()).unwrap_or(i64::MAX),
        remaining: i64::try_from(decision.remaining()).unwrap_or(i64::MAX),
        retry_after_secs,
        reset_after_secs: seconds(decision.reset_after()),
    }
}

/// Whole seconds as redis-cell 0.5 reports them: the whole seconds, plus
/// one when at least a whole millisecond remains (a remainder under a
/// millisecond is dropped).
fn seconds(duration: Duration) -> i64 {
    let secs = i64::try_from(duration.as_secs()).unwrap_or(i64::MAX);
    if duration.subsec_millis() >= 1 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

pub(super) fn check(policy: &Policy, state: Option<&GcraState>, now_us: u64, cost: u64) -> Step {
    let tat = state.map(|s| (s.tat_us, s.tat_rem));
    let (decision, new) = virtual_time(policy, tat, now_us, cost, false);
    let new_state = new.map(|(tat_us, tat_rem)| State::Gcra(GcraState { tat_us, tat_rem }));
    step(decision, new_state, now_us)
}

/// The arithmetic GCRA and the leaky-bucket queue share (ALGORITHMS.md,
/// "GCRA and leaky bucket queue"): `time` is the stored `(us, rem)` pair,
/// the result the decision and the pair to store, if any: the new time when
/// admitted with a cost, or the stored time clamped to the policy's worst
/// case when it lay further ahead (a repair, written even on a denial or a
/// peek). `queue` adds the queueing delay to admitting decisions.
pub(super) fn virtual_time(
    policy: &Policy,
    time: Option<(u64, u64)>,
    now_us: u64,
    cost: u64,
    queue: bool,
) -> (Decision, Option<(u64, u64)>) {
    let capacity = policy.capacity();
    // Time in units of `1 / scale` µs; a permit takes `increment` units
    // (`scale = limit`, `increment = period` when the policy is exact).
    let (scale, increment) = policy.emission_interval();
    let (scale, increment) = (u128::from(scale), u128::from(increment));
    let full = u128::from(capacity) * increment;
    // `us + rem / scale` µs is `us·scale + rem`. A stored `rem >= scale`
    // (left by a policy with another scale) is thereby carried.
    let now = u128::from(now_us) * scale;
    let base = time.map_or(now, |(us, rem)| u128::from(us) * scale + u128::from(rem));
    let mut span_old = base.max(now) - now;
    // A time further ahead than this policy can leave by more than clocks
    // that disagree explain (a policy that shrank, a clock that jumped
    // back, a corrupt value) is clamped to the policy's worst case, and the
    // clamped time is written back (ALGORITHMS.md, "Changing a policy").
    let full_reset = ceil_div(full, scale);
    let mut repair = None;
    if span_old / scale > full_reset + clock_tolerance(full_reset) {
        span_old = full;
        repair = split(now + full, scale);
    }
    // Until the key is back to full; for the queue also the delay of a
    // request admitted now (it waits for the queue ahead of it to drain).
    let reset_old = micros(ceil_div(span_old, scale));
    let delay_old = reset_old;
    let remaining_old = saturate(full.saturating_sub(span_old) / increment);
    let never = Decision::denied(capacity, remaining_old, Duration::MAX, reset_old);

    if cost > capacity {
        return (never, repair);
    }
    let charge = u128::from(cost.max(1)) * increment;
    if span_old + charge > full {
        // `span_old + charge − full`, formed so that Lua never sums past
        // 2^53 (span_old may exceed `full` by the clock tolerance).
        let retry_after = micros(ceil_div(span_old - (full - charge), scale));
        return (
            Decision::denied(capacity, remaining_old, retry_after, reset_old),
            repair,
        );
    }
    let span_new = span_old + charge;
    let with_delay = |decision: Decision| {
        if queue {
            decision.with_delay(delay_old)
        } else {
            decision
        }
    };
    if cost == 0 {
        let peek = Decision::allowed(capacity, remaining_old, reset_old);
        return (with_delay(peek), repair);
    }
    let Some(new) = split(now + span_new, scale) else {
        // Past the year 584 000: no later time can be stored, so no request
        // can be admitted.
        return (never, None);
    };
    let remaining = saturate((full - span_new) / increment);
    let reset_after = micros(ceil_div(span_new, scale));
    let decision = with_delay(Decision::allowed(capacity, remaining, reset_after));
    (decision, Some(new))
}

/// How far, in µs, a state may lie beyond the policy's worst case (whose
/// reset is `full_reset` µs) before it is clamped: as much again, and at
/// least a second. Within it the state is read as it is, so that clocks
/// that disagree a little (threads reading one clock in turn, instances
/// with their own clocks) never forgive a permit.
pub(super) fn clock_tolerance(full_reset: u128) -> u128 {
    full_reset.max(1_000_000)
}

/// `time` in units of `1 / scale` µs as the pair `(us, rem)`, unless `us`
/// passes `u64::MAX`.
fn split(time: u128, scale: u128) -> Option<(u64, u64)> {
    let us = u64::try_from(time / scale).ok()?;
    // `time % scale < scale <= 2^52`.
    Some((us, saturate(time % scale)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000_000;

    fn gcra(limit: u64, period: Duration, burst: u64) -> Policy {
        Policy::per(limit, period).burst(burst).build().unwrap()
    }

    fn run(policy: &Policy, state: &mut Option<GcraState>, now: u64, cost: u64) -> Decision {
        let step = check(policy, state.as_ref(), now, cost);
        if let Some(State::Gcra(new)) = step.new_state {
            *state = Some(new);
        }
        step.decision
    }

    #[test]
    fn burst_then_one_per_emission_interval() {
        // 2 per second (500 ms apart), burst 3.
        let policy = gcra(2, Duration::from_secs(1), 3);
        let mut state = None;
        for expected_remaining in [2, 1, 0] {
            let d = run(&policy, &mut state, T0, 1);
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), expected_remaining);
        }
        let d = run(&policy, &mut state, T0, 1);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        assert_eq!(d.reset_after(), Duration::from_millis(1_500));
        assert!(!run(&policy, &mut state, T0 + 499_999, 1).is_allowed());
        let d = run(&policy, &mut state, T0 + 500_000, 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after(), Duration::from_millis(1_500));
    }

    #[test]
    fn fractional_emission_interval_is_exact() {
        // 3 per second: 333 333⅓ µs apart. Three admissions at T0 (burst 3)
        // move the TAT by exactly one second; the thirds are kept in
        // `tat_rem`, not rounded away.
        let policy = gcra(3, Duration::from_secs(1), 3);
        let mut state = None;
        let expected = [(T0 + 333_333, 1), (T0 + 666_666, 2), (T0 + 1_000_000, 0)];
        for (tat_us, tat_rem) in expected {
            assert!(run(&policy, &mut state, T0, 1).is_allowed());
            assert_eq!(state, Some(GcraState { tat_us, tat_rem }));
        }
        let denied = run(&policy, &mut state, T0, 1);
        // The next is due when the TAT is 3 intervals ahead: T0 + 333 333⅓,
        // rounded up to whole microseconds.
        assert_eq!(denied.retry_after(), Some(Duration::from_micros(333_334)));
        assert!(!run(&policy, &mut state, T0 + 333_333, 1).is_allowed());
        assert!(run(&policy, &mut state, T0 + 333_334, 1).is_allowed());
        // The TAT is T0 + 4/3 s exactly, still relative to the first request.
        assert_eq!(
            state,
            Some(GcraState {
                tat_us: T0 + 1_333_333,
                tat_rem: 1
            })
        );
    }

    #[test]
    fn denial_and_peek_write_nothing() {
        let policy = gcra(1, Duration::from_secs(1), 1);
        let first = check(&policy, None, T0, 1);
        let state = first.new_state.clone().unwrap();
        let State::Gcra(gcra_state) = state else {
            panic!("GCRA writes a GCRA state")
        };
        assert_eq!(first.expires_at_us, T0 + 1_000_000);
        let denied = check(&policy, Some(&gcra_state), T0 + 10, 1);
        assert!(!denied.decision.is_allowed());
        assert_eq!(denied.new_state, None);
        assert_eq!(denied.expires_at_us, T0 + 1_000_000);
        let peek = check(&policy, Some(&gcra_state), T0 + 10, 0);
        assert!(!peek.decision.is_allowed());
        assert_eq!(
            peek.decision.retry_after(),
            Some(Duration::from_micros(999_990))
        );
        assert_eq!(peek.new_state, None);
    }

    #[test]
    fn cost_above_capacity_never_panics() {
        let policy = gcra(10, Duration::from_secs(1), 5);
        for now in [0, T0, u64::MAX] {
            let step = check(&policy, None, now, u64::MAX);
            assert!(!step.decision.is_allowed());
            assert_eq!(step.decision.retry_after(), Some(Duration::MAX));
            assert_eq!(step.decision.remaining(), 5);
            assert_eq!(step.new_state, None);
        }
    }

    #[test]
    fn end_of_time_denies_instead_of_overflowing() {
        let policy = gcra(1, Duration::from_secs(1), 1);
        let step = check(&policy, None, u64::MAX, 1);
        assert!(!step.decision.is_allowed());
        assert_eq!(step.new_state, None);
        let step = check(&policy, None, u64::MAX - 1_000_000, 1);
        assert!(step.decision.is_allowed());
        assert_eq!(step.expires_at_us, u64::MAX);
    }

    #[test]
    fn throttle_rejects_bad_arguments_with_advice() {
        assert_eq!(
            throttle(None, T0, 1, 0, 60, 1),
            Err(ThrottleError::ZeroCount)
        );
        assert_eq!(
            throttle(None, T0, 1, 10, 0, 1),
            Err(ThrottleError::ZeroPeriod)
        );
        let err = throttle(None, T0, u64::MAX, 10, 60, 1).unwrap_err();
        assert!(matches!(
            err,
            ThrottleError::TooLarge {
                argument: "max_burst",
                ..
            }
        ));
        let err = throttle(None, T0, 1 << 40, 10, 60, 1).unwrap_err();
        assert!(err.to_string().contains("max_burst"), "{err}");
        let err = throttle(None, T0, 1, (1 << 52) + 1, 60, 1).unwrap_err();
        assert!(err.to_string().contains("count"), "{err}");
        let err = throttle(None, T0, 1, 1, u64::MAX, 1).unwrap_err();
        assert!(err.to_string().contains("period"), "{err}");
    }
}
