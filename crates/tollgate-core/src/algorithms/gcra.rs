//! STUB: to be implemented.
use super::{GcraState, Step};
use crate::Policy;

/// The five integers redis-cell's `CL.THROTTLE` replies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThrottleReply {
    /// Whether the request was limited (redis-cell's 1/0).
    pub limited: bool,
    /// `max_burst + 1`.
    pub limit: i64,
    /// Remaining requests.
    pub remaining: i64,
    /// Seconds until a retry would succeed (truncated), or -1 when allowed.
    pub retry_after_secs: i64,
    /// Seconds until the key is back to full (truncated).
    pub reset_after_secs: i64,
}

/// Why `throttle` refused its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ThrottleError {}

impl std::fmt::Display for ThrottleError {
    fn fmt(&self, _f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}
impl std::error::Error for ThrottleError {}

/// redis-cell's `CL.THROTTLE key max_burst count period quantity`.
///
/// # Errors
/// Invalid arguments.
pub fn throttle(
    _state: Option<&GcraState>,
    _now_us: u64,
    _max_burst: u64,
    _count: u64,
    _period_secs: u64,
    _quantity: u64,
) -> Result<(ThrottleReply, Option<GcraState>), ThrottleError> {
    todo!()
}

pub(super) fn check(_policy: &Policy, _state: Option<&GcraState>, _now_us: u64, _cost: u64) -> Step {
    todo!()
}
