//! STUB: to be implemented.
use super::{LeakyMeterState, LeakyQueueState, Step};
use crate::Policy;

pub(super) fn check_meter(_policy: &Policy, _state: Option<&LeakyMeterState>, _now_us: u64, _cost: u64) -> Step {
    todo!()
}
pub(super) fn check_queue(_policy: &Policy, _state: Option<&LeakyQueueState>, _now_us: u64, _cost: u64) -> Step {
    todo!()
}
