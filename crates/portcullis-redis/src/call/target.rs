//! [`Target`]: what a check's calls address, built once per check: the
//! state key of each policy, the [`PolicySet`] and the policies. Shared
//! behind an `Arc` by the [`Call`](super::Call), by the table of calls in
//! flight (where it is the key that says which checks may share a call:
//! the same keys and the same policies) and by the batches sent after it,
//! so none of them copies it.

use std::hash::{Hash, Hasher};

use portcullis_core::Policy;
use smallvec::SmallVec;

use super::PolicySet;

/// The keys, policy set and policies of one check (see the module docs).
#[derive(Debug)]
pub(crate) struct Target {
    /// The state key of each policy, in order.
    keys: SmallVec<[String; 2]>,
    set: PolicySet,
    /// The policies, for a fast function's integer replies (empty where a
    /// call only sends the set).
    policies: SmallVec<[Policy; 2]>,
}

impl Target {
    /// The target of a check against `policies` (or of a call that sends
    /// only `set`, with no policies) at `keys`.
    pub(crate) fn new(keys: SmallVec<[String; 2]>, set: PolicySet, policies: &[Policy]) -> Self {
        Self {
            keys,
            set,
            policies: policies.iter().cloned().collect(),
        }
    }

    /// The state key of each policy.
    pub(crate) fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The first state key (where the call is routed in a Cluster).
    pub(crate) fn first_key(&self) -> &str {
        self.keys.first().map_or("", String::as_str)
    }

    pub(crate) fn set(&self) -> &PolicySet {
        &self.set
    }

    /// The policies (empty for a call that sends only the set).
    pub(crate) fn policies(&self) -> &[Policy] {
        &self.policies
    }
}

/// Two checks may share a call when they address the same keys (the
/// subject and each policy's name) with the same figures and algorithms.
/// Which function serves them is left out: it depends on the cost, and a
/// batch serves every cost.
impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys
            && self.set.arguments().eq(other.set.arguments())
            && self.set.algorithms().eq(other.set.algorithms())
    }
}

impl Eq for Target {}

impl Hash for Target {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.keys.hash(state);
        for argument in self.set.arguments() {
            argument.hash(state);
        }
        for algorithm in self.set.algorithms() {
            algorithm.hash(state);
        }
    }
}
