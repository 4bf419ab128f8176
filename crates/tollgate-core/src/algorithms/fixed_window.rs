//! STUB: to be implemented.
use super::{FixedWindowState, Step};
use crate::Policy;

pub(super) fn check(_policy: &Policy, _state: Option<&FixedWindowState>, _now_us: u64, _cost: u64) -> Step {
    todo!()
}
