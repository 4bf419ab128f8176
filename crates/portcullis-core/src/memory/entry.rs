//! What a shard stores per subject: the 40-byte [`Entry`] (its
//! [`StoredKey`] and its [`Body`]): the compact form (one GCRA state, its
//! TAT packed into one word, `tat.rs`) and the general form (a list of
//! [`Slot`]s), and how a state written in other units is read ([`Live`]).

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::key::StoredKey;
use super::names::{same_name, Names};
use super::tat::{pack, packed_expiry, unpack};
use crate::algorithms::{rescale, GcraState, Shape, State};
use crate::Policy;

/// The packed TAT of a state the compact form can hold: a GCRA state that
/// expires when its TAT is reached and that [`pack`] fits.
fn compact(state: &State, expires_at_us: u64) -> Option<u64> {
    match state {
        State::Gcra(GcraState { tat_us, tat_rem })
            if tat_us.checked_add(u64::from(*tat_rem != 0)) == Some(expires_at_us) =>
        {
            pack(*tat_us, *tat_rem)
        }
        _ => None,
    }
}

/// One subject: 40 bytes (a test holds it there).
pub(super) struct Entry {
    pub(super) key: StoredKey,
    pub(super) body: Body,
}

/// A subject's states.
pub(super) enum Body {
    /// The compact form, which the fast path charges: one GCRA state, of
    /// the policy named `names[name]` in the shard's interned names, its
    /// TAT packed ([`pack`]), which also gives its expiry
    /// ([`packed_expiry`]).
    ///
    /// When [`PolicyRef::is_hot`], the TAT is kept in its shard's
    /// [`Shard::hot_tat`](super::table::Shard::hot_tat) instead (and `tat`
    /// is stale), on the cache line of the shard's lock word: a subject
    /// charged by several threads at once is moved there, so that each
    /// charge contends for one cache line rather than two. At most one per
    /// shard.
    Tat { name: PolicyRef, tat: AtomicU64 },
    /// Any other states (several policies, other algorithms, a GCRA state
    /// the compact form cannot hold, a policy name the shard does not
    /// intern): one slot per policy that charged the subject and has not
    /// expired (save for policies no longer used, until the next write
    /// drops them). Boxed so that the entry stays at 40 bytes (a `Vec`
    /// is 24).
    #[allow(clippy::box_collection)]
    Slots(Box<Vec<Slot>>),
}

/// One policy's state for one subject, in the general form.
pub(super) struct Slot {
    /// Shared with the shard's other slots of the same policy.
    pub(super) policy: Arc<str>,
    /// The units `state` is written in (those of the policy that wrote it).
    pub(super) shape: Shape,
    pub(super) state: State,
    pub(super) expires_at_us: u64,
}

/// Which policy a compact entry's state is of: the position of its name
/// among the shard's interned names, and the address of that interned name
/// (below 2^48, as on every 64-bit platform Rust runs on today; a name
/// elsewhere is not interned this way), kept in the entry's padding. The
/// shard holds the interned name as long as it lives, so a policy whose
/// name is at that address has that name: the fast path compares one word
/// and reads no shared memory (a policy built apart, with a copy of the
/// name, is compared by its characters).
///
/// One word: the address in bits 0–47, the index in bits 48–55, and in
/// bit 63 whether the state is in the shard's hot slot. The fast path
/// recognises its policy by one masked comparison, and the word is never
/// zero (an address is not), so [`Body`] keeps its variant in that niche
/// and stays at 16 bytes.
#[derive(Clone, Copy)]
pub(super) struct PolicyRef(NonZeroU64);

/// The address bits of a [`PolicyRef`].
const ADDRESS_MASK: u64 = (1 << 48) - 1;
/// Where a [`PolicyRef`] keeps the index.
const INDEX_SHIFT: u32 = 48;
/// The bit of a [`PolicyRef`] that says its state is in the hot slot.
const HOT_BIT: u64 = 1 << 63;

/// The address of a policy's name, as [`PolicyRef`] compares it.
#[inline(always)]
fn address_of(name: &Arc<str>) -> u64 {
    Arc::as_ptr(name).cast::<u8>() as usize as u64
}

impl PolicyRef {
    /// The reference to the interned name at `index`, if its address fits.
    fn new(names: &Names, index: usize) -> Option<Self> {
        let address = address_of(names.get(index)?.0);
        let index = u8::try_from(index).ok()?;
        if address & !ADDRESS_MASK != 0 {
            return None;
        }
        NonZeroU64::new(address | u64::from(index) << INDEX_SHIFT).map(Self)
    }

    /// The position of the name among the shard's interned names.
    #[inline(always)]
    pub(super) fn index(self) -> usize {
        usize::from((self.0.get() >> INDEX_SHIFT) as u8)
    }

    /// Whether the state is in the shard's hot slot.
    #[inline(always)]
    pub(super) fn is_hot(self) -> bool {
        self.0.get() & HOT_BIT != 0
    }

    /// The same reference, its state in the hot slot or not.
    #[must_use]
    pub(super) fn with_hot(self, hot: bool) -> Self {
        let word = (self.0.get() & !HOT_BIT) | if hot { HOT_BIT } else { 0 };
        // The address bits stay, and they are not all zero.
        NonZeroU64::new(word).map_or(self, Self)
    }

    /// Whether this is `policy`: its name, in its units. (The same `Arc`
    /// is the same built policy: [`PolicyBuilder::build`](crate::PolicyBuilder::build)
    /// allocates the name of each.)
    #[inline(always)]
    pub(super) fn is(self, names: &Names, policy: &Policy) -> bool {
        self.0.get() & ADDRESS_MASK == address_of(policy.shared_name())
            || self.is_by_characters(names, policy)
    }

    #[cold]
    #[inline(never)]
    fn is_by_characters(self, names: &Names, policy: &Policy) -> bool {
        names.get(self.index()).is_some_and(|(interned, shape)| {
            shape == Shape::of(policy) && same_name(interned, policy.shared_name())
        })
    }

    /// The units of a state of `policy`'s name written in other units (a
    /// plan change under the same name).
    #[cold]
    #[inline(never)]
    fn written_in_other_units(self, names: &Names, policy: &Policy) -> Option<Shape> {
        names
            .get(self.index())
            .filter(|(interned, _)| same_name(interned, policy.shared_name()))
            .map(|(_, shape)| shape)
    }

    /// Whether this is `policy`'s name, in whatever units.
    fn is_named(self, names: &Names, policy: &Policy) -> bool {
        names
            .get(self.index())
            .is_some_and(|(interned, _)| same_name(interned, policy.shared_name()))
    }
}

/// A state as it is read: `(state, rescaled)`, `rescaled` when it was
/// written in other units than the reading policy's and converted
/// ([`rescale`]).
pub(super) type Live<'a> = (Cow<'a, State>, bool);

/// `state`, written in units `shape`, read through `policy` at `now`.
fn read_through<'a>(state: Cow<'a, State>, shape: Shape, policy: &Policy, now: u64) -> Live<'a> {
    match rescale(&state, shape, policy, now) {
        Some(rescaled) => (Cow::Owned(rescaled), true),
        None => (state, false),
    }
}

/// The state of a compact entry, unless it expired.
fn compact_state(packed: u64, now: u64) -> Option<Cow<'static, State>> {
    let (tat_us, tat_rem) = unpack(packed);
    (packed_expiry(packed) > now).then_some(Cow::Owned(State::Gcra(GcraState { tat_us, tat_rem })))
}

impl Body {
    /// The body of a subject whose first state is `state`.
    fn one(names: &mut Names, policy: &Policy, state: State, expires_at_us: u64) -> Self {
        let shape = Shape::of(policy);
        let policy = names.intern(policy);
        if let Some(packed) = compact(&state, expires_at_us) {
            let name = names.position(&policy);
            if let Some(name) = name.and_then(|name| PolicyRef::new(names, name)) {
                return Self::Tat {
                    name,
                    tat: AtomicU64::new(packed),
                };
            }
        }
        Self::Slots(Box::new(vec![Slot {
            policy,
            shape,
            state,
            expires_at_us,
        }]))
    }
}

impl Entry {
    /// A new subject's entry holding `policy`'s first state.
    pub(super) fn new(
        names: &mut Names,
        key: &[u8],
        policy: &Policy,
        state: State,
        expires_at_us: u64,
    ) -> Self {
        Self {
            key: StoredKey::new(key),
            body: Body::one(names, policy, state, expires_at_us),
        }
    }

    /// A new subject's entry without states yet (several policies).
    pub(super) fn empty(key: &[u8]) -> Self {
        Self {
            key: StoredKey::new(key),
            body: Body::Slots(Box::default()),
        }
    }

    /// The latest expiry of the states: from then on the entry is absent.
    /// `hot` is the shard's [`Shard::hot_tat`](super::table::Shard::hot_tat).
    #[inline]
    pub(super) fn expires_at_us(&self, hot: u64) -> u64 {
        match &self.body {
            Body::Tat { name, tat } => packed_expiry(if name.is_hot() {
                hot
            } else {
                tat.load(Ordering::Acquire)
            }),
            Body::Slots(slots) => slots
                .iter()
                .map(|slot| slot.expires_at_us)
                .max()
                .unwrap_or(0),
        }
    }

    /// Whether the entry holds its shard's hot slot.
    pub(super) fn is_hot(&self) -> bool {
        matches!(&self.body, Body::Tat { name, .. } if name.is_hot())
    }

    /// The state `policy` left, unless it expired, in `policy`'s units
    /// (see [`Live`]).
    #[inline]
    pub(super) fn live(
        &self,
        names: &Names,
        policy: &Policy,
        now: u64,
        hot: u64,
    ) -> Option<Live<'_>> {
        let (name, packed) = match &self.body {
            Body::Tat { name, .. } if name.is_hot() => (*name, hot),
            Body::Tat { name, tat } => (*name, tat.load(Ordering::Acquire)),
            Body::Slots(slots) => {
                let slot = slots
                    .iter()
                    .find(|slot| same_name(&slot.policy, policy.shared_name()))
                    .filter(|slot| slot.expires_at_us > now)?;
                let state = Cow::Borrowed(&slot.state);
                if slot.shape == Shape::of(policy) {
                    return Some((state, false));
                }
                return Some(read_through(state, slot.shape, policy, now));
            }
        };
        if name.is(names, policy) {
            return compact_state(packed, now).map(|state| (state, false));
        }
        let shape = name.written_in_other_units(names, policy)?;
        compact_state(packed, now).map(|state| read_through(state, shape, policy, now))
    }

    /// The state `policy` left, unless it expired, in `policy`'s units.
    #[inline]
    pub(super) fn live_state(
        &self,
        names: &Names,
        policy: &Policy,
        now: u64,
        hot: u64,
    ) -> Option<Cow<'_, State>> {
        self.live(names, policy, now, hot).map(|(state, _)| state)
    }

    /// Stores `state` as `policy`'s. `hot` is the shard's
    /// [`Shard::hot_tat`](super::table::Shard::hot_tat) (the general path
    /// demotes its subject first, so it is never this entry's).
    #[inline(always)]
    pub(super) fn write(
        &mut self,
        names: &mut Names,
        policy: &Policy,
        state: State,
        expires_at_us: u64,
        hot: u64,
    ) {
        if let Body::Tat { name, tat } = &mut self.body
            && !name.is_hot()
            && name.is(names, policy)
            && let Some(packed) = compact(&state, expires_at_us)
        {
            *tat.get_mut() = packed;
            return;
        }
        self.write_slot(names, policy, state, expires_at_us, hot);
    }

    /// [`Entry::write`] in the general form.
    #[inline(never)]
    fn write_slot(
        &mut self,
        names: &mut Names,
        policy: &Policy,
        state: State,
        expires_at_us: u64,
        hot: u64,
    ) {
        let expanded = match &self.body {
            Body::Slots(_) => None,
            Body::Tat { name, .. } if name.is_hot() => Some((*name, hot)),
            Body::Tat { name, tat } => Some((*name, tat.load(Ordering::Relaxed))),
        };
        if let Some((name, packed)) = expanded {
            let mut slots = Vec::with_capacity(2);
            if let Some((interned, shape)) = names.get(name.index()) {
                let (tat_us, tat_rem) = unpack(packed);
                slots.push(Slot {
                    policy: Arc::clone(interned),
                    shape,
                    state: State::Gcra(GcraState { tat_us, tat_rem }),
                    expires_at_us: packed_expiry(packed),
                });
            }
            self.body = Body::Slots(Box::new(slots));
        }
        let Body::Slots(slots) = &mut self.body else {
            return;
        };
        let shape = Shape::of(policy);
        match slots
            .iter_mut()
            .find(|slot| same_name(&slot.policy, policy.shared_name()))
        {
            Some(slot) => {
                if slot.shape != shape {
                    // Now in the new units: under the name interned with
                    // them, so that it compacts as the new policy's.
                    slot.policy = names.intern(policy);
                    slot.shape = shape;
                }
                slot.state = state;
                slot.expires_at_us = expires_at_us;
            }
            None => slots.push(Slot {
                policy: names.intern(policy),
                shape,
                state,
                expires_at_us,
            }),
        }
    }

    /// After writes: drops the slots that expired (policies no longer used
    /// with this subject), and returns to the compact form when one state
    /// it can hold is left.
    #[inline]
    pub(super) fn refresh(&mut self, names: &Names, now: u64) {
        let Body::Slots(slots) = &mut self.body else {
            return;
        };
        if slots.len() > 1 {
            slots.retain(|slot| slot.expires_at_us > now);
        }
        self.compact(names);
    }

    /// Returns to the compact form when one state it can hold is left.
    fn compact(&mut self, names: &Names) {
        let Body::Slots(slots) = &self.body else {
            return;
        };
        if let [slot] = &slots[..] {
            let name = names
                .position(&slot.policy)
                .filter(|&index| {
                    names
                        .get(index)
                        .is_some_and(|(_, shape)| shape == slot.shape)
                })
                .and_then(|name| PolicyRef::new(names, name));
            if let (Some(name), Some(packed)) = (name, compact(&slot.state, slot.expires_at_us)) {
                self.body = Body::Tat {
                    name,
                    tat: AtomicU64::new(packed),
                };
            }
        }
    }

    /// Forgets the states of `policies`; whether none is left.
    pub(super) fn forget(&mut self, names: &Names, policies: &[Policy]) -> bool {
        let empty = match &mut self.body {
            Body::Tat { name, .. } => policies.iter().any(|policy| name.is_named(names, policy)),
            Body::Slots(slots) => {
                slots.retain(|slot| !policies.iter().any(|p| p.name() == &*slot.policy));
                slots.is_empty()
            }
        };
        if !empty {
            self.compact(names);
        }
        empty
    }

    /// Bytes the entry holds outside itself.
    pub(super) fn heap_bytes(&self) -> usize {
        self.key.heap_bytes()
            + match &self.body {
                Body::Slots(slots) => {
                    std::mem::size_of::<Vec<Slot>>()
                        + slots.capacity() * std::mem::size_of::<Slot>()
                }
                _ => 0,
            }
    }
}
