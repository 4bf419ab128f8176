//! [`RequestHead`]: what the layers' per-request functions (key
//! extractors, tier selectors, cost functions, plan lookups) read of a
//! request, borrowed from it where it stands.
//!
//! http 1.x offers no `&Parts` of a `&Request`, so a function that reads
//! `&Parts` makes the layer move the request's head (over 200 bytes) out of
//! the request and back in for every request; this view borrows the same
//! fields instead.

use std::fmt;

use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// A request's head (method, URI, version, headers, extensions), borrowed:
/// what a [`KeyExtractor`](crate::KeyExtractor) and the layer's other
/// per-request functions read. Its accessors are named as
/// [`http::Request`]'s.
///
/// Make one of a request with [`RequestHead::new`] (or `From`), or of a
/// request's parts with [`RequestHead::from_parts`].
///
/// ```
/// use axum::http::Request;
/// use portcullis::tower::{KeyExtractor, RequestHead};
///
/// // A closure reads the head.
/// let tenant = |request: &RequestHead| {
///     Some(request.headers().get("x-tenant")?.to_str().ok()?.to_owned())
/// };
///
/// let request = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(tenant(&RequestHead::new(&request)).as_deref(), Some("acme"));
/// // `extract` takes a request, its parts or a head.
/// assert_eq!(tenant.extract(&request).as_deref(), Some("acme"));
/// ```
#[derive(Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    #[must_use]
    #[inline]
    pub fn new<B>(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The head of a request taken apart.
    #[must_use]
    #[inline]
    pub fn from_parts(parts: &'a Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }

    /// The request's method.
    #[must_use]
    #[inline]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request's URI.
    #[must_use]
    #[inline]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request's HTTP version.
    #[must_use]
    #[inline]
    pub fn version(&self) -> Version {
        self.version
    }

    /// The request's headers.
    #[must_use]
    #[inline]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request's extensions (the peer address Axum's `ConnectInfo`
    /// puts there, an authenticated user, ...).
    #[must_use]
    #[inline]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

impl<'a, B> From<&'a Request<B>> for RequestHead<'a> {
    #[inline]
    fn from(request: &'a Request<B>) -> Self {
        Self::new(request)
    }
}

impl<'a> From<&'a Parts> for RequestHead<'a> {
    #[inline]
    fn from(parts: &'a Parts) -> Self {
        Self::from_parts(parts)
    }
}

impl<'a> From<&RequestHead<'a>> for RequestHead<'a> {
    #[inline]
    fn from(head: &RequestHead<'a>) -> Self {
        *head
    }
}

/// The method, URI and version only: headers may carry credentials, and a
/// request's head is logged by whoever debug-prints it.
impl fmt::Debug for RequestHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestHead")
            .field("method", self.method)
            .field("uri", self.uri)
            .field("version", &self.version)
            .field("headers", &self.headers.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_reads_what_its_request_holds() {
        let request = Request::post("/a?b=c")
            .header("x-one", "1")
            .extension(7_u32)
            .version(Version::HTTP_2)
            .body(())
            .unwrap();
        let head = RequestHead::new(&request);
        assert_eq!(head.method(), Method::POST);
        assert_eq!(head.uri().query(), Some("b=c"));
        assert_eq!(head.version(), Version::HTTP_2);
        assert_eq!(head.headers()["x-one"], "1");
        assert_eq!(head.extensions().get::<u32>(), Some(&7));
        let (parts, ()) = request.into_parts();
        let from_parts = RequestHead::from_parts(&parts);
        assert_eq!(from_parts.uri(), "/a?b=c");
        assert_eq!(from_parts.extensions().get::<u32>(), Some(&7));
    }

    #[test]
    fn its_debug_form_shows_no_header_value() {
        let request = Request::get("/")
            .header("authorization", "Bearer secret-token")
            .body(())
            .unwrap();
        let shown = format!("{:?}", RequestHead::new(&request));
        assert!(shown.contains("GET"), "{shown}");
        assert!(!shown.contains("secret-token"), "{shown}");
    }
}
