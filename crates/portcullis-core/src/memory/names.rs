//! The policy names a shard interns ([`Names`]: each name with the units
//! its states are written in) and how two names compare ([`same_name`]).
//! A leaf.

use std::sync::Arc;

use crate::algorithms::Shape;
use crate::Policy;

/// Most policy names a shard shares between its subjects.
const MAX_INTERNED_NAMES: usize = 32;

/// The policies a shard shares between its subjects: up to
/// [`MAX_INTERNED_NAMES`] (applications use a handful; past that, each slot
/// holds the `Arc` of the policy that wrote it), each a name with the
/// [`Shape`] its states are written in. A name changed to another rate or
/// capacity (a plan change under the same name) is a second entry, so a
/// compact state always says in which units it was written.
///
/// The first policy seen with a name and shape lends its own `Arc`, so
/// checks made with clones of that policy find their slot by a pointer
/// comparison.
#[derive(Default)]
pub(super) struct Names {
    names: Vec<Arc<str>>,
    shapes: Vec<Shape>,
}

impl Names {
    /// The shared name of `policy`'s name and shape.
    pub(super) fn intern(&mut self, policy: &Policy) -> Arc<str> {
        let name = policy.shared_name();
        let shape = Shape::of(policy);
        let found = self
            .names
            .iter()
            .zip(&self.shapes)
            .find(|(interned, interned_shape)| {
                **interned_shape == shape && same_name(interned, name)
            });
        if let Some((interned, _)) = found {
            return Arc::clone(interned);
        }
        if self.names.len() < MAX_INTERNED_NAMES {
            self.names.push(Arc::clone(name));
            self.shapes.push(shape);
        }
        Arc::clone(name)
    }

    /// The interned name at `index` and its shape.
    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> Option<(&Arc<str>, Shape)> {
        Some((self.names.get(index)?, *self.shapes.get(index)?))
    }

    /// Where `name` (this very `Arc`) is interned.
    pub(super) fn position(&self, name: &Arc<str>) -> Option<usize> {
        self.names
            .iter()
            .position(|interned| Arc::ptr_eq(interned, name))
    }

    /// Bytes held outside the shard.
    pub(super) fn heap_bytes(&self) -> usize {
        self.names.capacity() * std::mem::size_of::<Arc<str>>()
            + self.shapes.capacity() * std::mem::size_of::<Shape>()
    }
}

/// Whether two policy names are equal, comparing pointers first.
#[inline(always)]
pub(super) fn same_name(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}
