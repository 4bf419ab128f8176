//! The algorithms, each a pure function of (policy, state, now, cost).
//!
//! All arithmetic is on integers: times in microseconds since the Unix epoch,
//! fractions kept as exact numerators. [`check`] never reads a clock and never
//! does I/O; the memory store and the Redis scripts implement the same
//! function, and tests hold them equal.

use std::collections::VecDeque;

use crate::{Algorithm, Decision, LeakyMode, Policy};

mod charge;
pub(crate) mod classes;
mod fixed_window;
mod gcra;
mod gcra_u64;
mod leaky_bucket;
pub mod lease;
mod refund;
mod rescale;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use charge::{charge, supports_charge};
pub use gcra::{
    throttle, throttle_policy, throttle_reply, ThrottleError, ThrottleReply, THROTTLE_POLICY_NAME,
};
pub use refund::refund;
pub use rescale::{check_written, rescale, Shape};

/// GCRA state: the theoretical arrival time `tat_us + tat_rem / limit`
/// microseconds since the epoch, with `0 <= tat_rem < limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// Whole microseconds of the theoretical arrival time.
    pub tat_us: u64,
    /// Fraction of a microsecond, in units of `1 / limit`.
    pub tat_rem: u64,
}

/// Token-bucket state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Tokens in the bucket, in units of `1 / period_us` of a token.
    pub level: u64,
    /// When `level` was computed, in microseconds since the epoch.
    pub last_us: u64,
}

/// Leaky-bucket (meter) state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeakyMeterState {
    /// Water in the bucket, in units of `1 / period_us` of a permit.
    pub level: u64,
    /// When `level` was computed, in microseconds since the epoch.
    pub last_us: u64,
}

/// Leaky-bucket (queue) state: when the queue will be empty,
/// `free_us + free_rem / limit` microseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeakyQueueState {
    /// Whole microseconds.
    pub free_us: u64,
    /// Fraction of a microsecond, in units of `1 / limit`.
    pub free_rem: u64,
}

/// Fixed-window state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// Start of the window the count belongs to (a multiple of the period).
    pub window_start_us: u64,
    /// Permits admitted in that window.
    pub count: u64,
}

/// Sliding-window-counter state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowState {
    /// Start of the current window (a multiple of the period).
    pub window_start_us: u64,
    /// Permits admitted in the window before it.
    pub previous: u64,
    /// Permits admitted in the current window.
    pub current: u64,
}

/// Sliding-log state: one timestamp per admitted permit, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SlidingLogState {
    /// Admission times in microseconds since the epoch, ascending; equal
    /// times repeat (each entry is one permit).
    pub entries: VecDeque<u64>,
}

/// The state one policy keeps for one subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// See [`GcraState`].
    Gcra(GcraState),
    /// See [`TokenBucketState`].
    TokenBucket(TokenBucketState),
    /// See [`LeakyMeterState`].
    LeakyMeter(LeakyMeterState),
    /// See [`LeakyQueueState`].
    LeakyQueue(LeakyQueueState),
    /// See [`FixedWindowState`].
    FixedWindow(FixedWindowState),
    /// See [`SlidingWindowState`].
    SlidingWindow(SlidingWindowState),
    /// See [`SlidingLogState`].
    SlidingLog(SlidingLogState),
}

/// What [`check`] decided and what the state becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Step {
    /// The decision.
    pub decision: Decision,
    /// The state to write, or `None` when nothing changes. An admission
    /// with a cost writes its new state; a denial or a peek writes nothing,
    /// except a *repair*: a stored state further ahead than the policy can
    /// leave (a policy that shrank under the same name, a clock that went
    /// back, a corrupt value) is clamped to the policy's worst case and
    /// that clamped state is returned here, to be written whatever the
    /// decision (ALGORITHMS.md, "Changing a policy").
    pub new_state: Option<State>,
    /// When the state (new or unchanged) is back to full capacity, in
    /// microseconds since the epoch; from then on it may be forgotten. Redis
    /// uses it as the key's expiry time.
    pub expires_at_us: u64,
}

/// How the bucket algorithms (GCRA, token bucket, leaky bucket) of
/// `policy` count time: `(scale, increment)`, one permit taking
/// `increment / scale` µs. When [`Policy::is_exact`] this is `(limit,
/// period)`; otherwise the interval is rounded up (ALGORITHMS.md,
/// "Magnitudes"), lowering the rate by less than one part in `increment`.
/// Window algorithms return `(limit, period)`.
///
/// ```
/// use portcullis::{algorithms, Policy};
///
/// let policy = Policy::per_second(3).build()?;
/// assert_eq!(algorithms::emission_interval(&policy), (3, 1_000_000));
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[must_use]
pub fn emission_interval(policy: &Policy) -> (u64, u64) {
    policy.emission_interval()
}

/// The unit, in µs, in which a sliding window of `policy` weighs its
/// previous window: 1 when exact, else the smallest power of ten that
/// divides the period and keeps `limit × period / unit` within
/// [`MAX_MAGNITUDE`](crate::MAX_MAGNITUDE) (the weight is then rounded up,
/// never down). 1 for other algorithms.
///
/// ```
/// use portcullis::{algorithms, Algorithm, Policy};
///
/// let policy = Policy::per_minute(100).algorithm(Algorithm::SlidingWindow).build()?;
/// assert_eq!(algorithms::weight_unit_micros(&policy), 1);
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[must_use]
pub fn weight_unit_micros(policy: &Policy) -> u64 {
    policy.weight_unit_micros()
}

/// Applies `policy` to `state` at `now_us` for `cost` permits.
///
/// `state` is `None` for a subject never seen (or forgotten). A state of
/// another algorithm than the policy's (the policy changed under the same
/// name) is treated as `None`; a state further ahead than this policy can
/// leave is clamped to its worst case and returned in `new_state` to be
/// written back (see [`Step::new_state`]). A cost of 0 is a peek: the
/// decision says whether a cost-1 request would be admitted now and how
/// many remain, and `new_state` is `None` unless a repair.
///
/// The caller must have checked `cost <= policy.capacity()`
/// ([`validate_check`](crate::validate_check)); a larger cost is denied with
/// no `retry_after` that could ever succeed, never a panic.
///
/// ```
/// use portcullis::{algorithms, Policy};
///
/// let policy = Policy::per_second(2).build()?;
/// let now = 1_700_000_000_000_000;
/// let first = algorithms::check(&policy, None, now, 1);
/// assert!(first.decision.is_allowed());
/// assert_eq!(first.decision.remaining(), 1);
/// let second = algorithms::check(&policy, first.new_state.as_ref(), now, 1);
/// let third = algorithms::check(&policy, second.new_state.as_ref(), now, 1);
/// assert!(!third.decision.is_allowed());
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
#[must_use]
pub fn check(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Step {
    // Cost above capacity, for every algorithm but the GCRA family (which
    // answers it in `gcra`): denied, never retried, and `remaining` /
    // `reset_after` as a peek reports them (ALGORITHMS.md). The algorithm
    // files below rely on `cost <= policy.capacity()`.
    let gcra_family = matches!(
        policy.algorithm(),
        Algorithm::Gcra | Algorithm::LeakyBucket(LeakyMode::Queue)
    );
    if cost > policy.capacity() && !gcra_family {
        let peek = check(policy, state, now_us, 0);
        let never = Decision::denied(
            peek.decision.limit(),
            peek.decision.remaining(),
            std::time::Duration::MAX,
            peek.decision.reset_after(),
        );
        return step(never, peek.new_state, now_us);
    }
    match policy.algorithm() {
        Algorithm::Gcra => {
            let state = match state {
                Some(State::Gcra(s)) => Some(s),
                _ => None,
            };
            gcra::check(policy, state, now_us, cost)
        }
        Algorithm::TokenBucket => {
            let state = match state {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            token_bucket::check(policy, state, now_us, cost)
        }
        Algorithm::LeakyBucket(LeakyMode::Meter) => {
            let state = match state {
                Some(State::LeakyMeter(s)) => Some(s),
                _ => None,
            };
            leaky_bucket::check_meter(policy, state, now_us, cost)
        }
        Algorithm::LeakyBucket(LeakyMode::Queue) => {
            let state = match state {
                Some(State::LeakyQueue(s)) => Some(s),
                _ => None,
            };
            leaky_bucket::check_queue(policy, state, now_us, cost)
        }
        Algorithm::FixedWindow => {
            let state = match state {
                Some(State::FixedWindow(s)) => Some(s),
                _ => None,
            };
            fixed_window::check(policy, state, now_us, cost)
        }
        Algorithm::SlidingWindow => {
            let state = match state {
                Some(State::SlidingWindow(s)) => Some(s),
                _ => None,
            };
            sliding_window::check(policy, state, now_us, cost)
        }
        Algorithm::SlidingLog => {
            let state = match state {
                Some(State::SlidingLog(s)) => Some(s),
                _ => None,
            };
            sliding_log::check(policy, state, now_us, cost)
        }
    }
}

/// [`check`] with GCRA taken in `u64` arithmetic where it fits (the
/// memory store's fast path, which decides exactly as [`check`]; the
/// memory = reference property tests hold it to that): for the Redis
/// store, which derives each fast reply's decision with it (about a tenth
/// of [`check`]'s instructions for GCRA).
#[doc(hidden)]
#[must_use]
#[inline]
pub fn check_fast(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Step {
    gcra_u64::check_policy(policy, state, now_us, cost)
}

// Arithmetic shared by the algorithm files. Everything is computed in `u128`:
// policy validation keeps every limit, burst, scale and increment at most
// 2^53, so no product of a `u64` time and one of those can overflow `u128`.

/// `ceil(a / b)`. Every divisor passed is a policy's limit or period, which
/// policy validation keeps at least 1.
fn ceil_div(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

/// `x` as a `u64`, saturating.
fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// `us` microseconds as a duration, saturating at `u64::MAX` microseconds.
fn micros(us: u128) -> std::time::Duration {
    std::time::Duration::from_micros(saturate(us))
}

/// Builds a step whose `expires_at_us` is `now + reset_after` (saturating).
fn step(decision: Decision, new_state: Option<State>, now_us: u64) -> Step {
    let expires_at_us = now_us.saturating_add(decision.reset_after_us());
    Step {
        decision,
        new_state,
        expires_at_us,
    }
}
