//! Token reservations for AI gateways: a request reserves an estimate of
//! the tokens it will use at admission (together with its request count
//! and, when limited, a place among the streams in flight: one atomic
//! step), and settles the actual usage when its response ends, with the
//! unused part refunded and an overage charged up to a cap.
//!
//! Top-down: `store.rs` (the [`ReservationStore`] trait,
//! [`validate_reserve`] and [`validate_settle`]) → `budget.rs` ([`TokenBudget`]) → `outcome.rs`
//! (the answers). The arithmetic is `algorithms::refund` and
//! `algorithms::charge`; ALGORITHMS.md, "Reservations", states it.

mod budget;
mod outcome;
mod store;

pub use budget::{TokenBudget, TokenBudgetBuilder, TokenBudgetError};
pub use outcome::{Refusal, ReservationId, Reserved, SettleOutcome, Settlement};
pub use store::{validate_reserve, validate_settle, ReservationStore};
