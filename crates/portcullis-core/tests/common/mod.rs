//! Helpers shared by the algorithm tests.

use portcullis_core::algorithms::{self, State, Step};
use portcullis_core::Policy;

/// One key: applies each step's new state, as a store does.
#[derive(Debug, Default)]
pub(crate) struct Key(pub(crate) Option<State>);

impl Key {
    /// One check of `cost` at `now` under `policy`, keeping the new state.
    pub(crate) fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Step {
        let step = algorithms::check(policy, self.0.as_ref(), now, cost);
        if let Some(state) = &step.new_state {
            self.0 = Some(state.clone());
        }
        step
    }
}
