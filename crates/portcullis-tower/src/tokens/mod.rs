//! The token layer for AI gateways ([`TokenBudgetLayer`]): a request
//! reserves its token estimate at admission and settles the usage its
//! (streamed) response reports when the response ends; refunds, the
//! overage cap, idempotent settlement and expiry are the store's
//! ([`ReservationStore`](portcullis_core::ReservationStore)).
//!
//! Top-down: `layer.rs` (the layer and its builder) → `service.rs` (a
//! request's way through) → `body.rs` (the response body that settles,
//! the settler) → `shared.rs` (what the layer's services share, its log
//! counters) → `request.rs` (the estimate, the request body read and
//! handed on) and `usage.rs` (the usage a response reports).

mod body;
mod layer;
mod request;
mod service;
mod shared;
mod usage;

pub use body::TokenBody;
pub use layer::{TokenBudgetLayer, TokenBudgetLayerBuilder};
pub use request::{Estimate, TokenRequestBody, MAX_ESTIMATE_BODY};
pub use service::{TokenBudgetFuture, TokenBudgetService};
