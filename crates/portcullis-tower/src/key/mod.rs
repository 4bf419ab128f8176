//! Key extractors: who a request is counted against. Each file imports
//! only those below it: the shipped extractors (`boxed.rs`, `header.rs`,
//! `client_ip.rs` above `ip.rs`, `misc.rs`) implement the trait in `extractor.rs`, which writes
//! into the buffer in `buf.rs`, reading the request's head as
//! `head.rs` borrows it.

mod boxed;
mod buf;
mod client_ip;
mod extractor;
mod head;
mod header;
mod ip;
mod misc;

pub use boxed::BoxKeyExtractor;
pub use buf::KeyBuf;
pub use client_ip::{ClientIp, ProxyHeader};
pub use extractor::{KeyExtractor, Or};
pub use head::RequestHead;
pub use header::{ApiKey, BearerToken, Header};
pub use ip::PeerIp;
#[cfg(feature = "axum")]
pub use misc::MatchedRoute;
pub use misc::{Global, Method, User};
