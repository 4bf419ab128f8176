//! [`PolicySet`]: what a call reads about its policies, derived once per
//! check and shared by every path the check takes (the local budget,
//! coalescing, the call and its `EVALSHA` fallback), and kept by a
//! coalesced batch and a local budget's grant for as long as they live.

use std::sync::Arc;

use portcullis_core::{Algorithm, Policy, StoreError};
use smallvec::SmallVec;

use crate::scripts::{Library, Serving};

/// The facts about a check's policies that its calls send or read.
#[derive(Debug, Clone)]
pub(crate) struct PolicySet {
    /// Each policy as the library's argument, `<limit>:<period_us>:<capacity>`
    /// (the library parses a policy once, not on every call): the policy's
    /// own text, written when it was built, shared.
    arguments: SmallVec<[Arc<str>; 2]>,
    capacities: SmallVec<[u64; 2]>,
    algorithms: SmallVec<[Algorithm; 2]>,
    /// Which function serves the check ([`Library::serving`]).
    serving: Serving,
}

impl PolicySet {
    /// The set of a check against `policies` that `serving` serves
    /// ([`Library::serving`], decided first: a check the local budget
    /// answers, or one that waits for a coalesced call, never needs the
    /// arguments). Allocates nothing for up to two policies.
    pub(crate) fn new(policies: &[Policy], serving: Serving) -> Self {
        // One pass: three `collect`s into `SmallVec`s cost 143
        // instructions a check against this one's 89 (`cargo bench -p
        // portcullis-redis --bench redis_client`, callgrind).
        let mut set = Self {
            arguments: SmallVec::new(),
            capacities: SmallVec::new(),
            algorithms: SmallVec::new(),
            serving,
        };
        for policy in policies {
            set.arguments.push(Arc::clone(policy.shape_argument()));
            set.capacities.push(policy.capacity());
            set.algorithms.push(policy.algorithm());
        }
        set
    }

    /// How many policies.
    pub(crate) fn len(&self) -> usize {
        self.arguments.len()
    }

    /// Policy `i`'s `<limit>:<period_us>:<capacity>`.
    pub(crate) fn argument(&self, i: usize) -> &str {
        &self.arguments[i]
    }

    /// Every policy's argument, in order.
    pub(crate) fn arguments(&self) -> impl Iterator<Item = &str> {
        self.arguments.iter().map(|argument| &**argument)
    }

    /// Each policy's capacity (a decision's limit).
    pub(crate) fn capacities(&self) -> &[u64] {
        &self.capacities
    }

    /// Each policy's algorithm, in order.
    pub(crate) fn algorithms(&self) -> impl ExactSizeIterator<Item = Algorithm> + Clone + '_ {
        self.algorithms.iter().copied()
    }

    /// Which function serves the check.
    pub(crate) fn serving(&self) -> Serving {
        self.serving
    }

    /// The plan argument of a Functions call: one letter per policy.
    pub(crate) fn letters(&self) -> Result<SmallVec<[u8; 8]>, StoreError> {
        Library::letters(self.algorithms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_is_one_argument_computed_once() {
        let policies = [
            Policy::per_second(5).name("a").build().unwrap(),
            Policy::per_minute(10).burst(12).name("b").build().unwrap(),
        ];
        let set = PolicySet::new(&policies, Library::serving(&policies, 1));
        assert_eq!(set.len(), 2);
        assert_eq!(set.argument(0), "5:1000000:5");
        assert_eq!(set.argument(1), "10:60000000:12");
        assert_eq!(
            set.arguments().collect::<Vec<_>>(),
            ["5:1000000:5", "10:60000000:12"]
        );
        assert_eq!(set.capacities(), [5, 12]);
        assert_eq!(set.serving(), Serving::GcraMulti);
        assert_eq!(Library::serving(&policies, 0), Serving::General);
    }
}
