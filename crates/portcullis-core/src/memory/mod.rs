//! The concurrent in-memory store: [`MemoryStore`], its builder and its
//! bound ([`DEFAULT_MAX_KEYS`], [`WhenFull`]).
//!
//! How it holds state (the layout, the GCRA hot path under the read lock,
//! expiry and sweeping, the bound) is described in `ALGORITHMS.md`, "How
//! `MemoryStore` holds its state".

// The modules, top-down: each uses only the ones below it (a module's
// submodules are part of it).
//
// - `store`: `MemoryStore` (the public type, its inherent methods and its
//   `Store` impl), by concern: `builder`, `hot_path` (the store's half of
//   the GCRA hot path), `charge`, `options` (`check_with`), `lease` (the
//   `LeaseStore` impl).
// - `table`: the store's shared state (`Inner`, `WhenFull`) and a shard:
//   `general` (the general path under the write lock: checks,
//   post-charges, checks with options, inserts), `hot_path` (the shard's
//   half: compare-and-swap under the read lock, the hot slot), `sweep`.
// - `records` (idempotency records), `reservations` (token reservations)
//   and `lease` (the concurrency lease table), beside the shards.
// - `entry`: what a shard holds per subject (compact and general forms).
// - `names` (the policy names a shard interns) and `key` (a subject's key,
//   looked up and stored).
// - `tat`: the packed TAT and the `u64` GCRA arithmetic both paths use.
mod store;
mod table;

mod lease;
mod records;
mod reservations;

mod entry;

mod key;
mod names;

pub(crate) mod tat;

#[cfg(test)]
mod tests;

pub use self::store::{MemoryStore, MemoryStoreBuilder, DEFAULT_MAX_KEYS};
pub use self::table::WhenFull;
