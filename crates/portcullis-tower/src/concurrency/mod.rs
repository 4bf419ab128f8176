//! Keyed concurrency limits: [`ConcurrencyLimitLayer`] (at most N requests
//! in flight per key, each holding a lease from a
//! [`LeaseStore`](portcullis_core::LeaseStore)), its service, future, and the
//! permit the response body holds. The crate docs, "Concurrency limits",
//! describe it for users.

mod future;
mod layer;
mod permit;
mod service;

pub use future::ConcurrencyLimitFuture;
pub use layer::{ConcurrencyFailure, ConcurrencyLimitLayer, ConcurrencyLimitLayerBuilder};
pub use permit::ConcurrencyLimitBody;
pub use service::ConcurrencyLimit;
