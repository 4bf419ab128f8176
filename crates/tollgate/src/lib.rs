//! # tollgate
//!
//! Exact rate limiting for Rust services: one set of algorithms that behaves
//! the same in process memory and in Redis (standalone or Cluster), and a
//! tower `RateLimitLayer` for Axum, Tonic and Hyper; plus keyed
//! concurrency limits (`ConcurrencyPolicy`, leases in memory or Redis, and
//! the tower `ConcurrencyLimitLayer`).
//!
//! ```
//! use tollgate::{MemoryStore, Policy, Store};
//!
//! # futures::executor::block_on(async {
//! let store = MemoryStore::new();
//! let policy = Policy::per_second(10).name("api").build()?;
//! let verdict = store.check("user:42", std::slice::from_ref(&policy), 1).await?;
//! assert!(verdict.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! Features: `tower` (default) re-exports [`tower`] (the layer), `axum` and
//! `tonic` add framework integration, `redis` re-exports [`redis`] (the
//! Redis store: standalone, Cluster, Sentinel, ACL users, your own bb8-redis
//! pool), `tls` adds `rediss://` (rustls; `tls-webpki-roots` trusts the
//! compiled-in Mozilla roots instead of the system's, `tls-insecure` accepts
//! `#insecure` URLs for tests), `metrics` counts decisions through the
//! `metrics` crate.

// docs.rs shows which feature each item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use tollgate_core::*;

/// The Redis store for standalone servers, Redis Cluster and Sentinel
/// (feature `redis`; TLS with feature `tls`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use tollgate_redis::*;
}

/// The tower layer (feature `tower`, on by default).
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower {
    pub use tollgate_tower::*;
}
