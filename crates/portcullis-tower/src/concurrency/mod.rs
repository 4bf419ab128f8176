//! Keyed concurrency limits: [`ConcurrencyLimitLayer`] (at most N requests
//! in flight per key, each holding a lease from a
//! [`LeaseStore`](portcullis_core::LeaseStore)), its builder, service,
//! [`ResponseFuture`] and [`ResponseBody`] (which holds the permit until the
//! body is done). The layer, service and builder are also at the crate
//! root; the crate docs, "Concurrency limits", describe how to use them.
//! Like [`rate_limit`](crate::rate_limit), this module names its future and
//! body `ResponseFuture` and `ResponseBody`.

//!
//! Inside: the state the services of one layer share and the decision on an
//! acquire's result (`gate.rs`, like the rate layer's), and the held
//! lease (`permit.rs`).

mod body;
mod future;
mod gate;
mod layer;
mod permit;
mod service;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::{ConcurrencyFailure, ConcurrencyLimitLayer, ConcurrencyLimitLayerBuilder};
pub use service::ConcurrencyLimit;
