//! A shard's bounded table of token reservations ([`Reservations`]),
//! which [`ReservationStore`](crate::ReservationStore) reads and writes
//! under the subject's shard write lock (`table/reserve.rs`). A leaf.
//!
//! Per (subject, budget) a list of live reservations: open ones (their
//! estimate, until their TTL ends) and settled ones (what the settlement
//! charged, kept for a TTL so that a retried settle charges once). Bounds,
//! none of which lets one subject touch another's reservations:
//!
//! - a (subject, budget) holds at most [`MAX_PER_SUBJECT`] live
//!   reservations; past it a new one replaces the subject's own settled
//!   record nearest its end (a retry of that settle then finds nothing
//!   and charges nothing), and when all are open it is refused as streams
//!   in flight would be;
//! - a shard holds at most its share of the store's bound, as
//!   idempotency records do; when full and nothing expired, a new
//!   reservation is refused with `StoreError::Full` (never let through).

use std::collections::HashMap;

/// Most live reservations (open or settled) of one subject and budget.
pub(super) const MAX_PER_SUBJECT: usize = 1_024;
/// Fewest reservations a shard may hold, whatever the bound.
const MIN_PER_SHARD: usize = 16;

/// What a reservation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// Open: the estimate charged.
    Open { estimate: u64 },
    /// Settled: the estimate, the usage reported and the overage charged.
    Settled {
        estimate: u64,
        used: u64,
        overage: u64,
    },
}

struct Resv {
    id: u128,
    expires_at_us: u64,
    held: Held,
}

/// Why a reservation could not be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoRoom {
    /// The subject holds [`MAX_PER_SUBJECT`] open reservations.
    Subject,
    /// The shard's share of the bound is taken; the first record expires
    /// at this time.
    Shard(u64),
}

/// One shard's reservations, by subject key and budget name.
#[derive(Default)]
pub(super) struct Reservations {
    map: HashMap<Box<[u8]>, Vec<Resv>>,
    /// Reservations held, in all lists.
    len: usize,
    /// Sweep expired reservations when `len` reaches this.
    sweep_at: usize,
}

/// The map key: the subject's key, a byte no UTF-8 subject or policy name
/// holds, the budget's name.
pub(super) fn list_key(subject: &[u8], budget: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(subject.len() + 1 + budget.len());
    key.extend_from_slice(subject);
    key.push(0xff);
    key.extend_from_slice(budget.as_bytes());
    key
}

impl Reservations {
    /// Reservation `id` of the list, if live at `now`.
    pub(super) fn get(&self, key: &[u8], id: u128, now: u64) -> Option<Held> {
        self.map
            .get(key)?
            .iter()
            .find(|r| r.id == id && r.expires_at_us > now)
            .map(|r| r.held)
    }

    /// Open reservations of the list live at `now`, and the earliest of
    /// their expiries.
    pub(super) fn open(&self, key: &[u8], now: u64) -> (u64, Option<u64>) {
        let Some(list) = self.map.get(key) else {
            return (0, None);
        };
        list.iter()
            .filter(|r| r.expires_at_us > now && matches!(r.held, Held::Open { .. }))
            .fold((0, None), |(n, first), r| {
                let first = Some(first.map_or(r.expires_at_us, |f: u64| f.min(r.expires_at_us)));
                (n + 1, first)
            })
    }

    /// Makes room for one more reservation in the list (without adding
    /// it), per the bounds in the module docs.
    pub(super) fn make_room(
        &mut self,
        max_keys: Option<usize>,
        shards: usize,
        key: &[u8],
        now: u64,
    ) -> Result<(), NoRoom> {
        if let Some(list) = self.map.get_mut(key) {
            let before = list.len();
            list.retain(|r| r.expires_at_us > now);
            if list.len() >= MAX_PER_SUBJECT {
                let nearest = list
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| matches!(r.held, Held::Settled { .. }))
                    .min_by_key(|(_, r)| r.expires_at_us)
                    .map(|(index, _)| index);
                match nearest {
                    Some(index) => {
                        list.swap_remove(index);
                    }
                    None => {
                        self.len -= before - list.len();
                        return Err(NoRoom::Subject);
                    }
                }
            }
            self.len -= before - list.len();
        }
        let share = max_keys.map(|max| (max / shards).max(MIN_PER_SHARD));
        if self.len >= self.sweep_at.max(64) || share.is_some_and(|share| self.len >= share) {
            self.sweep(now);
            self.sweep_at = self.len * 2;
        }
        match share {
            Some(share) if self.len >= share => {
                let first = self
                    .map
                    .values()
                    .flatten()
                    .map(|r| r.expires_at_us)
                    .min()
                    .unwrap_or(now);
                Err(NoRoom::Shard(first))
            }
            _ => Ok(()),
        }
    }

    /// Adds reservation `id`, after [`Reservations::make_room`] said yes.
    pub(super) fn insert(&mut self, key: &[u8], id: u128, held: Held, expires_at_us: u64) {
        self.map.entry(key.into()).or_default().push(Resv {
            id,
            expires_at_us,
            held,
        });
        self.len += 1;
    }

    /// Replaces live reservation `id` with what it now holds, until
    /// `expires_at_us`. False when it is not there.
    pub(super) fn replace(&mut self, key: &[u8], id: u128, held: Held, expires_at_us: u64) -> bool {
        let Some(resv) = self
            .map
            .get_mut(key)
            .and_then(|list| list.iter_mut().find(|r| r.id == id))
        else {
            return false;
        };
        resv.held = held;
        resv.expires_at_us = expires_at_us;
        true
    }

    /// Drops every expired reservation.
    fn sweep(&mut self, now: u64) {
        let mut len = 0;
        self.map.retain(|_, list| {
            list.retain(|r| r.expires_at_us > now);
            len += list.len();
            !list.is_empty()
        });
        self.len = len;
    }

    /// Reservations held (live, or expired but not yet swept).
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes the reservations take: the map's slots, each list's key and
    /// its records.
    pub(super) fn memory_bytes(&self) -> usize {
        let slots = self.map.capacity() * (std::mem::size_of::<(Box<[u8]>, Vec<Resv>)>() + 1);
        let lists: usize = self
            .map
            .iter()
            .map(|(key, list)| key.len() + list.capacity() * std::mem::size_of::<Resv>())
            .sum();
        slots + lists
    }
}
