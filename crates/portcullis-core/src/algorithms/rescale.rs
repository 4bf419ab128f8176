//! Reading a bucket state written under another rate or capacity: the
//! permits it holds are carried over, so a plan change under the same policy
//! name takes effect at once (ALGORITHMS.md, "Changing a policy").
//!
//! A GCRA time, a leaky-bucket queue time, a token-bucket level and a leaky
//! meter's water are all counted in units of the policy that wrote them
//! (`1 / scale` µs, a permit being `increment` units). Read through a policy
//! with other units they would mean another number of permits: after 6 of 6
//! at 6 per hour, 10 per hour would read the hour owed as 10 permits, and
//! give nothing. [`rescale`] converts the state to the permits it holds at
//! `now` (drained or refilled at the rate it was written with until then)
//! and writes them in the new units, rounding against the subject, so 6 of
//! 6 at 6 per hour reads as 6 of 10 at 10 per hour. The windows and the log
//! keep counts and need nothing.

use super::{GcraState, LeakyMeterState, LeakyQueueState, State, TokenBucketState};
use crate::Policy;

/// What a bucket state's numbers mean: the units of the policy that wrote
/// it. Stores keep it beside the state ([`Shape::of`] the writing policy)
/// and pass it to [`rescale`] when the policy reading the state has
/// another.
///
/// ```
/// use portcullis::algorithms::Shape;
/// use portcullis::Policy;
///
/// let hourly = Policy::per_hour(6).build()?;
/// let pro = Policy::per_hour(10).build()?;
/// assert_ne!(Shape::of(&hourly), Shape::of(&pro));
/// assert_eq!(Shape::of(&hourly).capacity, 6);
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Time is counted in units of `1 / scale` µs.
    pub scale: u64,
    /// A permit is `increment` units.
    pub increment: u64,
    /// The bucket holds `capacity` permits.
    pub capacity: u64,
}

impl Shape {
    /// The units `policy` writes its states in.
    #[must_use]
    pub const fn of(policy: &Policy) -> Self {
        let (scale, increment) = policy.emission_interval();
        Self {
            scale,
            increment,
            capacity: policy.capacity(),
        }
    }
}

/// `state`, written by a policy of shape `from`, in the units of `policy`
/// at `now_us`; `None` when nothing changes (the same shape, a window or log
/// state, or a state of another algorithm, which
/// [`check`](super::check) treats as no state).
///
/// A state further ahead than its own policy could leave (a clock that
/// jumped, a corrupt value) is returned unchanged, for the check to clamp.
///
/// ```
/// use portcullis::algorithms::{self, rescale, Shape};
/// use portcullis::Policy;
///
/// let now = 1_700_000_000_000_000;
/// let six = Policy::per_hour(6).name("plan").build()?;
/// let ten = Policy::per_hour(10).name("plan").build()?;
/// let mut state = None;
/// for _ in 0..6 {
///     state = algorithms::check(&six, state.as_ref(), now, 1).new_state;
/// }
/// let used = state.unwrap();
/// // Read at 10 per hour, the 6 permits used leave 4.
/// let moved = rescale(&used, Shape::of(&six), &ten, now).unwrap();
/// let peek = algorithms::check(&ten, Some(&moved), now, 0);
/// assert_eq!(peek.decision.remaining(), 4);
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[must_use]
pub fn rescale(state: &State, from: Shape, policy: &Policy, now_us: u64) -> Option<State> {
    let to = Shape::of(policy);
    if from == to || from.scale == 0 || from.increment == 0 {
        return None;
    }
    match state {
        State::Gcra(GcraState { tat_us, tat_rem }) => {
            time_owed(*tat_us, *tat_rem, from, to, now_us)
                .map(|(tat_us, tat_rem)| State::Gcra(GcraState { tat_us, tat_rem }))
        }
        State::LeakyQueue(LeakyQueueState { free_us, free_rem }) => {
            time_owed(*free_us, *free_rem, from, to, now_us)
                .map(|(free_us, free_rem)| State::LeakyQueue(LeakyQueueState { free_us, free_rem }))
        }
        State::TokenBucket(s) => Some(State::TokenBucket(token_bucket(s, from, to, now_us))),
        State::LeakyMeter(s) => Some(State::LeakyMeter(leaky_meter(s, from, to, now_us))),
        State::FixedWindow(_) | State::SlidingWindow(_) | State::SlidingLog(_) => None,
    }
}

/// `x` converted from permits of `from.increment` units to permits of
/// `to.increment` units, rounded up.
fn convert(x: u128, from: Shape, to: Shape) -> u128 {
    (x * u128::from(to.increment)).div_ceil(u128::from(from.increment))
}

/// The time `us + rem / from.scale` (GCRA's TAT, the queue's free time):
/// the time it lies ahead of now is owed permits, carried into `to`'s
/// units. A time in the past is no debt: its remainder is dropped (`None`
/// when it has none). `None` also when it lies beyond what `from` could
/// leave.
fn time_owed(us: u64, rem: u64, from: Shape, to: Shape, now_us: u64) -> Option<(u64, u64)> {
    if us < now_us {
        // No debt. Its remainder is in `from`'s units: read as it is, a
        // remainder at or past `to.scale` would be carried into whole
        // microseconds, possibly past now.
        return (rem != 0).then_some((us, 0));
    }
    // Beyond `from`'s full reset and its clock tolerance, the state is
    // corrupt or a clock jumped: the check clamps it (and the product below
    // stays far inside `u128`).
    let full = u128::from(from.capacity) * u128::from(from.increment);
    let full_reset = full.div_ceil(u128::from(from.scale));
    let ahead = u128::from(us - now_us);
    if ahead > full_reset + super::gcra::clock_tolerance(full_reset) {
        return None;
    }
    let span = ahead * u128::from(from.scale) + u128::from(rem);
    // At most the new capacity: a cut never holds a subject back longer
    // than the new policy's full reset.
    let full_to = u128::from(to.capacity) * u128::from(to.increment);
    let span = convert(span, from, to).min(full_to);
    let scale = u128::from(to.scale);
    let whole = super::saturate(span / scale);
    let rem = super::saturate(span % scale);
    Some((now_us.saturating_add(whole), rem))
}

/// A token bucket's level: refilled at `from`'s rate until now, then the
/// tokens taken (not those left) carried into `to`'s units.
fn token_bucket(s: &TokenBucketState, from: Shape, to: Shape, now_us: u64) -> TokenBucketState {
    let full = u128::from(from.capacity) * u128::from(from.increment);
    let mut level = u128::from(s.level).min(full);
    let mut last = s.last_us;
    if now_us > last {
        let refill = u128::from(now_us - last) * u128::from(from.scale);
        level = (level + refill).min(full);
        last = now_us;
    }
    let taken = convert(full - level, from, to);
    let full_to = u128::from(to.capacity) * u128::from(to.increment);
    TokenBucketState {
        level: super::saturate(full_to.saturating_sub(taken)),
        last_us: last,
    }
}

/// A leaky meter's water: drained at `from`'s rate until now, then carried
/// into `to`'s units.
fn leaky_meter(s: &LeakyMeterState, from: Shape, to: Shape, now_us: u64) -> LeakyMeterState {
    let mut level = u128::from(s.level);
    let mut last = s.last_us;
    if now_us > last {
        let drained = u128::from(now_us - last) * u128::from(from.scale);
        level = level.saturating_sub(drained);
        last = now_us;
    }
    let full_to = u128::from(to.capacity) * u128::from(to.increment);
    LeakyMeterState {
        level: super::saturate(convert(level, from, to).min(full_to)),
        last_us: last,
    }
}

/// [`check`](super::check) of a state written by a policy of shape
/// `written`: rescaled first when `policy`'s shape differs, and the
/// rescaled state written back on a charge whatever the verdict (as a
/// repair is), so the subject's next check reads it in the new units.
///
/// ```
/// use portcullis::algorithms::{self, check_written, Shape};
/// use portcullis::Policy;
///
/// let now = 1_700_000_000_000_000;
/// let six = Policy::per_hour(6).name("plan").build()?;
/// let ten = Policy::per_hour(10).name("plan").build()?;
/// let mut state = None;
/// for _ in 0..6 {
///     state = algorithms::check(&six, state.as_ref(), now, 1).new_state;
/// }
/// let step = check_written(&ten, state.as_ref(), Shape::of(&six), now, 1);
/// assert!(step.decision.is_allowed());
/// assert_eq!(step.decision.remaining(), 3);
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[must_use]
pub fn check_written(
    policy: &Policy,
    state: Option<&State>,
    written: Shape,
    now_us: u64,
    cost: u64,
) -> super::Step {
    let rescaled = state.and_then(|state| rescale(state, written, policy, now_us));
    match rescaled {
        None => super::check(policy, state, now_us, cost),
        Some(rescaled) => {
            let mut step = super::check(policy, Some(&rescaled), now_us, cost);
            if cost > 0 && step.new_state.is_none() {
                step.new_state = Some(rescaled);
            }
            step
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithms::check;
    use crate::{Algorithm, LeakyMode};

    const T0: u64 = 1_700_000_000_000_000;

    fn policy(algorithm: Algorithm, limit: u64, period: Duration) -> Policy {
        Policy::per(limit, period)
            .algorithm(algorithm)
            .name("plan")
            .build()
            .unwrap()
    }

    fn used(policy: &Policy, n: u64) -> Option<State> {
        let mut state = None;
        for _ in 0..n {
            let step = check(policy, state.as_ref(), T0, 1);
            assert!(step.decision.is_allowed());
            state = step.new_state;
        }
        state
    }

    const BUCKETS: [Algorithm; 4] = [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket(LeakyMode::Meter),
        Algorithm::LeakyBucket(LeakyMode::Queue),
    ];

    #[test]
    fn a_raise_gives_the_difference_and_a_cut_keeps_the_count_inside() {
        let hour = Duration::from_secs(3_600);
        for algorithm in BUCKETS {
            let six = policy(algorithm, 6, hour);
            let ten = policy(algorithm, 10, hour);
            let three = policy(algorithm, 3, hour);
            let state = used(&six, 6).unwrap();
            let raised = rescale(&state, Shape::of(&six), &ten, T0).unwrap();
            let peek = check(&ten, Some(&raised), T0, 0).decision;
            assert_eq!(peek.remaining(), 4, "{algorithm:?}");
            // Without the rescale GCRA, the queue and the token bucket read
            // the old units as nothing left (the meter's water, counted in
            // permits of the same period, happens to read right).
            if algorithm != Algorithm::LeakyBucket(LeakyMode::Meter) {
                assert_eq!(check(&ten, Some(&state), T0, 0).decision.remaining(), 0);
            }
            let cut = rescale(&state, Shape::of(&six), &three, T0).unwrap();
            let peek = check(&three, Some(&cut), T0, 0).decision;
            assert_eq!(peek.remaining(), 0, "{algorithm:?}");
            assert!(!check(&three, Some(&cut), T0, 1).decision.is_allowed());
            // Two used of six: one left of three, and the time counts.
            let two = used(&six, 2).unwrap();
            let cut = rescale(&two, Shape::of(&six), &three, T0).unwrap();
            assert_eq!(check(&three, Some(&cut), T0, 0).decision.remaining(), 1);
        }
    }

    #[test]
    fn time_passed_drains_at_the_old_rate_until_the_change() {
        // 6 used at 6/h, 30 minutes later 3 have come back: at 10/h, 3
        // are still used and 7 are left.
        let hour = Duration::from_secs(3_600);
        for algorithm in BUCKETS {
            let six = policy(algorithm, 6, hour);
            let ten = policy(algorithm, 10, hour);
            let state = used(&six, 6).unwrap();
            let later = T0 + 1_800_000_000;
            let moved = rescale(&state, Shape::of(&six), &ten, later).unwrap();
            let peek = check(&ten, Some(&moved), later, 0).decision;
            assert_eq!(peek.remaining(), 7, "{algorithm:?}");
        }
    }

    #[test]
    fn fractional_intervals_round_against_the_subject() {
        // 3 per second (333 333⅓ µs) to 7 per second, 2 used: 5 left,
        // never 6.
        let second = Duration::from_secs(1);
        for algorithm in BUCKETS {
            let three = policy(algorithm, 3, second);
            let seven = policy(algorithm, 7, second);
            let state = used(&three, 2).unwrap();
            let moved = rescale(&state, Shape::of(&three), &seven, T0).unwrap();
            assert_eq!(check(&seven, Some(&moved), T0, 0).decision.remaining(), 5);
        }
    }

    #[test]
    fn the_same_shape_windows_and_far_states_are_left_alone() {
        let hour = Duration::from_secs(3_600);
        let six = policy(Algorithm::Gcra, 6, hour);
        let ten = policy(Algorithm::Gcra, 10, hour);
        let state = used(&six, 6).unwrap();
        assert_eq!(rescale(&state, Shape::of(&six), &six, T0), None);
        let far = State::Gcra(GcraState {
            tat_us: T0 + 10 * 3_600_000_000,
            tat_rem: 0,
        });
        assert_eq!(rescale(&far, Shape::of(&six), &ten, T0), None);
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ] {
            let a = policy(algorithm, 6, hour);
            let b = policy(algorithm, 10, hour);
            let state = used(&a, 6).unwrap();
            assert_eq!(rescale(&state, Shape::of(&a), &b, T0), None);
            assert_eq!(check(&b, Some(&state), T0, 0).decision.remaining(), 4);
        }
    }

    #[test]
    fn a_past_time_is_no_debt_whatever_its_remainder() {
        // 7 per ms leaves a free time of T0 + 142 + 6/7 µs; a microsecond
        // after it, read at 1 per ms, the six sevenths must not become 6 µs.
        let ms = Duration::from_millis(1);
        for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket(LeakyMode::Queue)] {
            let fast = policy(algorithm, 7, ms);
            let slow = policy(algorithm, 1, ms);
            let state = used(&fast, 1).unwrap();
            let later = T0 + 143;
            let moved = rescale(&state, Shape::of(&fast), &slow, later);
            assert!(moved.is_some(), "{algorithm:?}: the remainder is dropped");
            let step = check(&slow, moved.as_ref(), later, 1);
            assert!(step.decision.is_allowed(), "{algorithm:?}: {step:?}");
            assert_eq!(step.decision.delay(), Duration::ZERO, "{algorithm:?}");
            // Without a remainder there is nothing to change.
            let whole = State::Gcra(GcraState {
                tat_us: T0,
                tat_rem: 0,
            });
            assert_eq!(rescale(&whole, Shape::of(&fast), &slow, later), None);
        }
    }

    #[test]
    fn a_denied_charge_writes_the_rescaled_state_back() {
        let hour = Duration::from_secs(3_600);
        let six = policy(Algorithm::Gcra, 6, hour);
        let three = policy(Algorithm::Gcra, 3, hour);
        let state = used(&six, 6);
        let step = check_written(&three, state.as_ref(), Shape::of(&six), T0, 1);
        assert!(!step.decision.is_allowed());
        let written = step.new_state.expect("the rescaled state is written back");
        assert_eq!(rescale(&written, Shape::of(&three), &three, T0), None);
        assert_eq!(check(&three, Some(&written), T0, 0).decision.remaining(), 0);
    }
}
