//! `BoxKeyExtractor`: a key extractor whose type is chosen at run time.

use std::fmt;
use std::sync::Arc;

use super::buf::KeyBuf;
use super::extractor::KeyExtractor;
use super::head::RequestHead;

/// Any [`KeyExtractor`] behind one type, so the extractor can be picked at
/// run time (from configuration, say) where each choice is a different
/// type: `match` arms of `PeerIp` and `ClientIp` do not unify, two
/// `BoxKeyExtractor`s do. Cloning it shares the extractor.
///
/// Each request costs one dynamic call more than the extractor itself, and
/// no allocation.
///
/// ```
/// use portcullis::tower::{BoxKeyExtractor, ClientIp, PeerIp, RateLimitLayer};
/// use portcullis::{MemoryStore, Policy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Behind a load balancer in 10.0.0.0/8, or exposed directly.
/// let behind_proxy = std::env::var_os("BEHIND_PROXY").is_some();
/// let key = if behind_proxy {
///     BoxKeyExtractor::new(ClientIp::trusting(["10.0.0.0/8".parse()?]))
/// } else {
///     BoxKeyExtractor::new(PeerIp::new())
/// };
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_second(10).name("api").build()?)
///     .key(key)
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone)]
pub struct BoxKeyExtractor(Arc<dyn KeyExtractor>);

impl BoxKeyExtractor {
    /// Boxes `extractor`.
    #[must_use]
    pub fn new(extractor: impl KeyExtractor) -> Self {
        Self(Arc::new(extractor))
    }
}

impl fmt::Debug for BoxKeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxKeyExtractor").finish_non_exhaustive()
    }
}

impl KeyExtractor for BoxKeyExtractor {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        self.0.extract_into(request, key)
    }

    fn describe(&self) -> std::borrow::Cow<'static, str> {
        self.0.describe()
    }

    fn missing_hint(&self) -> Option<&'static str> {
        self.0.missing_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use http::Request;

    use super::*;
    use crate::key::{Header, PeerIp};

    #[test]
    fn a_boxed_extractor_keys_as_the_one_it_holds() {
        let mut request = Request::get("/").header("x-user", "ann").body(()).unwrap();
        request
            .extensions_mut()
            .insert(SocketAddr::from(([192, 0, 2, 7], 40_000)));
        let (parts, ()) = request.into_parts();
        let choices = [
            BoxKeyExtractor::new(PeerIp::new()),
            BoxKeyExtractor::new(Header::new(http::HeaderName::from_static("x-user"))),
        ];
        for (boxed, expected) in choices.iter().zip(["192.0.2.7", "ann"]) {
            let mut key = KeyBuf::new();
            assert!(boxed.extract_into(&RequestHead::from_parts(&parts), &mut key));
            assert_eq!(key.as_str(), expected);
            assert_eq!(boxed.clone().extract(&parts).as_deref(), Some(expected));
        }
        let (empty, ()) = Request::get("/").body(()).unwrap().into_parts();
        assert_eq!(choices[0].extract(&empty), None);
        assert!(format!("{:?}", choices[0]).starts_with("BoxKeyExtractor"));
    }
}
