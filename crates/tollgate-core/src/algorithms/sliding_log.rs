//! STUB: to be implemented.
use super::{SlidingLogState, Step};
use crate::Policy;

pub(super) fn check(_policy: &Policy, _state: Option<&SlidingLogState>, _now_us: u64, _cost: u64) -> Step {
    todo!()
}
