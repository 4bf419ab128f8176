//! A shard's bounded table of idempotency records ([`Records`]), which
//! [`Store::check_with`](crate::Store::check_with) reads and writes under
//! the subject's shard write lock (`table/general.rs`). A leaf.
//!
//! Records live with their subject: a shard keeps, per subject key, that
//! subject's live records (the record id, [`Record::id`](crate::Record::id),
//! hashed to 32 bytes), each holding an admitted decision until its window
//! ends and counting the free replays it has left. Only an admitted check
//! writes one, so a subject gains records no faster than its policies
//! admit it. Bounds, none of which lets one subject touch another's
//! records:
//!
//! - a subject holds at most [`MAX_RECORDS_PER_SUBJECT`]; its next record
//!   replaces its own record nearest its end (a retry of that request is
//!   charged again: never more admitted);
//! - a shard holds at most its share of the store's bound
//!   ([`MemoryStore::max_keys`](crate::MemoryStore::max_keys) divided by the shards, at least 16); when
//!   full, expired records are swept, and if none has expired the new
//!   record is not kept (the request is still decided and charged as
//!   usual; its retry is charged again). A missing record never denies a
//!   request and never answers `Retry-After: 0`.

use std::collections::HashMap;

use crate::Verdict;

/// Most live idempotency records one subject holds; its next replaces its
/// own record nearest its end.
pub(super) const MAX_RECORDS_PER_SUBJECT: usize = 64;
/// Fewest records a shard may hold, whatever the bound.
const MIN_RECORDS_PER_SHARD: usize = 16;

/// One record: an admitted decision, until when, and the free replays
/// it has left.
pub(super) struct Rec {
    pub(super) id: [u8; 32],
    pub(super) expires_at_us: u64,
    pub(super) replays_left: u32,
    pub(super) verdict: Verdict,
}

impl Rec {
    /// Bytes the record holds outside its slot (a verdict of several
    /// decisions).
    fn heap_bytes(&self) -> usize {
        let decisions = self.verdict.decisions();
        if decisions.len() > 1 {
            std::mem::size_of_val(decisions)
        } else {
            0
        }
    }
}

/// One shard's idempotency records, by subject key.
#[derive(Default)]
pub(super) struct Records {
    map: HashMap<Box<[u8]>, Vec<Rec>>,
    /// Records held, in all subjects' lists.
    len: usize,
    /// Sweep expired records when `len` reaches this.
    sweep_at: usize,
}

impl Records {
    /// Answers a repeat from the subject's live record `id`, if it has one
    /// with a free replay left (and spends that replay).
    pub(super) fn replay(&mut self, subject: &[u8], id: &[u8; 32], now: u64) -> Option<Verdict> {
        let rec = self
            .map
            .get_mut(subject)?
            .iter_mut()
            .find(|rec| rec.id == *id && rec.expires_at_us > now && rec.replays_left > 0)?;
        rec.replays_left -= 1;
        Some(rec.verdict.clone())
    }

    /// Keeps an admitted decision for the subject, per the bounds in the
    /// module docs.
    /// `max_keys` and `shards` are the store's bound and shard count.
    pub(super) fn insert(
        &mut self,
        max_keys: Option<usize>,
        shards: usize,
        subject: &[u8],
        rec: Rec,
        now: u64,
    ) {
        if let Some(list) = self.map.get_mut(subject) {
            let before = list.len();
            list.retain(|old| old.id != rec.id && old.expires_at_us > now);
            self.len -= before - list.len();
            if list.len() >= MAX_RECORDS_PER_SUBJECT {
                // The subject at its most: its own record nearest its end
                // makes room (no other subject's is touched).
                if let Some(nearest) = list
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, old)| old.expires_at_us)
                    .map(|(index, _)| index)
                {
                    list[nearest] = rec;
                }
                return;
            }
        }
        if !self.has_room(max_keys, shards, now) {
            return;
        }
        self.map.entry(subject.into()).or_default().push(rec);
        self.len += 1;
    }

    /// Whether one more record fits in the shard's share, after sweeping
    /// expired records when due.
    fn has_room(&mut self, max_keys: Option<usize>, shards: usize, now: u64) -> bool {
        let share = max_keys.map(|max| (max / shards).max(MIN_RECORDS_PER_SHARD));
        if self.len >= self.sweep_at.max(64) || share.is_some_and(|share| self.len >= share) {
            self.sweep(now);
            // Amortized: the next sweep after as many inserts again.
            self.sweep_at = self.len * 2;
        }
        share.is_none_or(|share| self.len < share)
    }

    /// Drops every expired record.
    fn sweep(&mut self, now: u64) {
        let mut len = 0;
        self.map.retain(|_, list| {
            list.retain(|rec| rec.expires_at_us > now);
            len += list.len();
            !list.is_empty()
        });
        self.len = len;
    }

    /// Records held (live or expired but not yet swept).
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes the records take: the map's slots, each subject's key and
    /// list, and what records hold outside their slot.
    pub(super) fn memory_bytes(&self) -> usize {
        let slots = self.map.capacity() * (std::mem::size_of::<(Box<[u8]>, Vec<Rec>)>() + 1);
        let lists: usize = self
            .map
            .iter()
            .map(|(key, list)| {
                key.len()
                    + list.capacity() * std::mem::size_of::<Rec>()
                    + list.iter().map(Rec::heap_bytes).sum::<usize>()
            })
            .sum();
        slots + lists
    }
}
