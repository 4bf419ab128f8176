//! STUB: to be implemented.
use super::{TokenBucketState, Step};
use crate::Policy;

pub(super) fn check(_policy: &Policy, _state: Option<&TokenBucketState>, _now_us: u64, _cost: u64) -> Step {
    todo!()
}
