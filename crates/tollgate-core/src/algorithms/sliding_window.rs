//! STUB: to be implemented.
use super::{SlidingWindowState, Step};
use crate::Policy;

pub(super) fn check(_policy: &Policy, _state: Option<&SlidingWindowState>, _now_us: u64, _cost: u64) -> Step {
    todo!()
}
