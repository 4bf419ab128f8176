//! Envoy's rate-limit services on portcullis's exact algorithms and stores.
//!
//! Envoy (and what is built on it: Istio, Envoy Gateway, Contour, Gloo,
//! kgateway, Emissary) asks an external service whether a request may
//! pass. This crate answers **RLS v3** (`ShouldRateLimit`, the
//! `envoy.filters.http.ratelimit` filter) with any portcullis algorithm
//! (GCRA, token and leaky buckets, fixed and sliding windows, the sliding
//! log), all of a request's descriptors decided in one atomic step, on the
//! [`MemoryStore`](portcullis_core::MemoryStore) or on Redis
//! (`RedisStore`, feature `redis`). The `portcullis-envoy` binary serves it
//! from a TOML configuration file, reloaded live, with gRPC health
//! checking and graceful shutdown.
//!
//! ```
//! use portcullis::MemoryStore;
//! use portcullis_envoy::{Config, LiveConfig, RlsService};
//!
//! let config = Config::parse("envoy.toml", r#"
//! [[domains]]
//! name = "edge"
//! [[domains.descriptors]]
//! key = "remote_address"
//! limit = 100
//! period = "1m"
//! "#)?;
//! let rls = RlsService::builder(LiveConfig::new(config), MemoryStore::new()).build();
//! // tonic::transport::Server::builder().add_service(rls.into_server()).serve(addr)
//! # let _ = rls;
//! # Ok::<(), portcullis_envoy::ConfigError>(())
//! ```
//!
//! Envoy's API types and service traits come from the `envoy-types`
//! crate (Envoy's protos as Envoy 1.40 sends them).

// Never a panic on a caller's input or a server's reply: no `unwrap`,
// `expect`, `panic!` or `unreachable!` outside tests (clippy, which
// `cargo xtask test` runs with `-D warnings`).
#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

// The modules, top-down: the services (`rlqs`, `rls`) above the live configuration
// (`live`), the conversion from envoyproxy/ratelimit (`convert`), the
// configuration (`config`) and the stores (`store`), above
// the leaves (`subject`, `log`).
mod rlqs;
mod rls;

mod live;

mod convert;

mod config;
mod store;

mod log;
mod subject;

pub use config::{Config, ConfigError, Rule};
pub use convert::convert_ratelimit_yaml;
pub use live::{ConfigFile, LiveConfig};
pub use rlqs::{RlqsService, RlqsServiceBuilder, RlqsStream, MAX_BUCKETS_PER_REPORT};
pub use rls::{RlsService, RlsServiceBuilder, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_ENTRY_LEN};
pub use store::DescriptorStore;
