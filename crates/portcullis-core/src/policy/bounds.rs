//! Caps a policy is validated against that its error messages name: the
//! longest policy name and the largest sliding-log limit. A leaf.

/// Longest policy name accepted by [`PolicyBuilder::name`](crate::PolicyBuilder::name).
pub const MAX_POLICY_NAME_LEN: usize = 64;

/// Largest limit a [`Algorithm::SlidingLog`](crate::Algorithm::SlidingLog) policy accepts.
///
/// A sliding log remembers every admitted permit until it leaves the window, so
/// its memory grows with the limit. Above this cap, use
/// [`Algorithm::SlidingWindow`](crate::Algorithm::SlidingWindow) (two counters) or [`Algorithm::Gcra`](crate::Algorithm::Gcra) (one
/// integer) instead.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 10_000;
