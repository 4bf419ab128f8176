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
    /// The state key of each policy, back to back, held inline up to
    /// [`INLINE`] bytes (one or two keys of a short prefix and subject):
    /// so the target is one allocation, the `Arc`'s.
    text: SmallVec<[u8; INLINE]>,
    /// Where each key ends in `text`.
    ends: SmallVec<[usize; 2]>,
    set: PolicySet,
    /// The policies, for a fast function's integer replies (empty where a
    /// call only sends the set).
    policies: SmallVec<[Policy; 2]>,
}

/// Bytes of keys a target holds without allocating.
const INLINE: usize = 112;

impl Target {
    /// The target of a check against `policies` (or of a call that sends
    /// only `set`, with no policies), with no keys yet.
    pub(crate) fn new(set: PolicySet, policies: &[Policy]) -> Self {
        Self {
            text: SmallVec::new(),
            ends: SmallVec::new(),
            set,
            policies: policies.iter().cloned().collect(),
        }
    }

    /// Adds the next policy's state key, written from `parts`.
    pub(crate) fn push_key(&mut self, parts: &[&str]) {
        for part in parts {
            self.text.extend_from_slice(part.as_bytes());
        }
        self.ends.push(self.text.len());
    }

    /// With `key` as the next policy's state key.
    pub(crate) fn with_key(mut self, key: &str) -> Self {
        self.push_key(&[key]);
        self
    }

    /// Key `i`'s bytes.
    fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// The state key of each policy, in order (as sent: bytes).
    pub(crate) fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        (0..self.ends.len()).map(|i| self.key(i))
    }

    /// How many keys.
    pub(crate) fn key_count(&self) -> usize {
        self.ends.len()
    }

    /// Every key's bytes together (a call's size).
    pub(crate) fn key_bytes(&self) -> usize {
        self.text.len()
    }

    /// The first state key (where the call is routed in a Cluster; keys
    /// are written from `&str`s only, so always UTF-8).
    pub(crate) fn first_key(&self) -> &str {
        if self.ends.is_empty() {
            ""
        } else {
            std::str::from_utf8(self.key(0)).unwrap_or_default()
        }
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
        self.text == other.text
            && self.ends == other.ends
            && self.set.arguments().eq(other.set.arguments())
            && self.set.algorithms().eq(other.set.algorithms())
    }
}

impl Eq for Target {}

impl Hash for Target {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.text.hash(state);
        self.ends.hash(state);
        for argument in self.set.arguments() {
            argument.hash(state);
        }
        for algorithm in self.set.algorithms() {
            algorithm.hash(state);
        }
    }
}
