//! Key extractors: who a request is counted against. Each file imports
//! only those below it: the shipped extractors (`boxed.rs`, `header.rs`,
//! `ip.rs`, `misc.rs`) implement the trait in `extractor.rs`, which writes
//! into the buffer in `buf.rs`.

mod boxed;
mod buf;
mod extractor;
mod header;
mod ip;
mod misc;

pub use boxed::BoxKeyExtractor;
pub use buf::KeyBuf;
pub use extractor::{KeyExtractor, Or};
pub use header::{ApiKey, BearerToken, Header};
pub use ip::{ClientIp, PeerIp, ProxyHeader};
#[cfg(feature = "axum")]
pub use misc::MatchedRoute;
pub use misc::{Global, Method, User};
