//! Keys from request headers: a named header, a bearer token, an API key.

use http::header::{HeaderName, AUTHORIZATION};
use portcullis_core::subject::{hash_subject, is_plain};

use super::buf::KeyBuf;
use super::extractor::KeyExtractor;
use super::head::RequestHead;

/// Keys on the value of a request header, for example a tenant id set by a
/// trusted gateway.
///
/// A value made of plain characters (see [`portcullis::subject::is_plain`](portcullis_core::subject::is_plain)) is the
/// key as it is; any other value (long, non-ASCII, not UTF-8) is hashed. An
/// absent or empty header yields no key. For secrets use [`ApiKey`], which
/// always hashes.
///
/// ```
/// use axum::http::{HeaderName, Request};
/// use portcullis::tower::{Header, KeyExtractor};
///
/// let tenant = Header::new(HeaderName::from_static("x-tenant"));
/// let request = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(tenant.extract(&request).as_deref(), Some("acme"));
/// ```
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
}

impl Header {
    /// Keys on the header `name`.
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl KeyExtractor for Header {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        let Some(value) = request.headers().get(&self.name).map(|v| v.as_bytes()) else {
            return false;
        };
        if value.is_empty() {
            return false;
        }
        match std::str::from_utf8(value) {
            Ok(text) if is_plain(text) => key.push_str(text),
            _ => key.push_string(hash_subject(value)),
        }
        true
    }

    fn describe(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Owned(format!("the {} header", self.name))
    }
}

/// Keys on the bearer token of the `Authorization` header, hashed with
/// SHA-256 so the token itself never reaches the store or the logs.
///
/// The scheme is matched case-insensitively (`Bearer`, `bearer`). No
/// header, another scheme or an empty token yields no key.
///
/// ```
/// use axum::http::Request;
/// use portcullis::tower::{BearerToken, KeyExtractor};
///
/// let request = Request::get("/")
///     .header("authorization", "Bearer s3cr3t")
///     .body(())
///     .unwrap();
/// let key = BearerToken::new().extract(&request).unwrap();
/// assert!(key.starts_with('#') && !key.contains("s3cr3t"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct BearerToken {
    _private: (),
}

impl BearerToken {
    /// Keys on the hashed bearer token.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl KeyExtractor for BearerToken {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        match self.token(request) {
            Some(token) => {
                key.push_string(hash_subject(token));
                true
            }
            None => false,
        }
    }

    fn describe(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("a bearer token in the Authorization header")
    }
}

impl BearerToken {
    /// The token of a `Bearer` `Authorization` header, if there is one.
    pub(crate) fn token<'a>(&self, request: &'a RequestHead<'a>) -> Option<&'a [u8]> {
        let value = request.headers().get(AUTHORIZATION)?.as_bytes();
        let (scheme, rest) = value.split_at_checked(6)?;
        if !scheme.eq_ignore_ascii_case(b"bearer")
            || !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t')
        {
            return None;
        }
        let token = rest.trim_ascii();
        (!token.is_empty()).then_some(token)
    }
}

/// Keys on an API key sent in a header (`x-api-key` by default), hashed
/// with SHA-256 so the key itself never reaches the store or the logs. An
/// absent or empty header yields no key.
///
/// The key is `#` and the 64 lowercase hex digits of the SHA-256 of the
/// (trimmed) API key. What that means for limits as data:
///
/// - **Plan lookups.** A [`PlanResolver`](crate::PlanResolver) is given
///   the layer's key, the hash, unless told otherwise: give it the API key
///   itself with `.lookup_key(ApiKey::new())`
///   ([`PlanResolverBuilder::lookup_key`](crate::PlanResolverBuilder::lookup_key)).
/// - **Overrides** (in a `LimitSet` or a limits file) name the hash:
///   `"#" + sha256(key)`, from `printf '%s' "$API_KEY" | sha256sum` or
///   [`portcullis::subject::hash_subject`](portcullis_core::subject::hash_subject); the file then holds no
///   secret.
///
/// ```
/// use axum::http::{HeaderName, Request};
/// use portcullis::tower::{ApiKey, KeyExtractor};
///
/// let request = Request::get("/").header("x-api-key", "k-123").body(()).unwrap();
/// let default = ApiKey::new().extract(&request).unwrap();
/// assert!(default.starts_with('#'));
/// let custom = ApiKey::header(HeaderName::from_static("x-token")).extract(&request);
/// assert_eq!(custom, None);
/// ```
#[derive(Debug, Clone)]
pub struct ApiKey {
    name: HeaderName,
}

impl Default for ApiKey {
    fn default() -> Self {
        Self {
            name: HeaderName::from_static("x-api-key"),
        }
    }
}

impl ApiKey {
    /// Keys on the hashed `x-api-key` header.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys on the hashed header `name`.
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self { name }
    }
}

impl ApiKey {
    /// The API key of a request, trimmed, if it has a non-empty one: what a
    /// plan lookup is given (see `PlanResolverBuilder::lookup_key`), never
    /// a store key or a log field.
    pub(crate) fn credential<'a>(&self, request: &'a RequestHead<'a>) -> Option<&'a [u8]> {
        request
            .headers()
            .get(&self.name)
            .map(|value| value.as_bytes().trim_ascii())
            .filter(|value| !value.is_empty())
    }
}

impl KeyExtractor for ApiKey {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        match self.credential(request) {
            Some(value) => {
                key.push_string(hash_subject(value));
                true
            }
            _ => false,
        }
    }

    fn describe(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Owned(format!("an API key in the {} header", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::request::Parts;
    use http::{HeaderValue, Request};

    fn with(name: &str, value: &[u8]) -> Parts {
        let mut parts = Request::get("/").body(()).unwrap().into_parts().0;
        parts.headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
        parts
    }

    #[test]
    fn header_values_plain_or_hashed() {
        let h = Header::new(HeaderName::from_static("x-tenant"));
        assert_eq!(
            h.extract(&with("x-tenant", b"acme")).as_deref(),
            Some("acme")
        );
        assert_eq!(h.extract(&with("x-tenant", b"")), None);
        let hashed = h.extract(&with("x-tenant", b"\xff\xfe garbage")).unwrap();
        assert_eq!(hashed, hash_subject(b"\xff\xfe garbage"));
        let huge = vec![b'a'; 64 * 1024];
        assert_eq!(h.extract(&with("x-tenant", &huge)).unwrap().len(), 65);
        assert_eq!(h.extract(&with("x-other", b"acme")), None);
    }

    #[test]
    fn bearer_tokens() {
        let b = BearerToken::new();
        let key = b.extract(&with("authorization", b"Bearer abc")).unwrap();
        assert_eq!(key, hash_subject(b"abc"));
        assert_eq!(
            b.extract(&with("authorization", b"bearer   abc  ")),
            Some(key)
        );
        assert_eq!(b.extract(&with("authorization", b"Basic abc")), None);
        assert_eq!(b.extract(&with("authorization", b"Bearer ")), None);
        assert_eq!(b.extract(&with("authorization", b"Bearerabc")), None);
        assert_eq!(b.extract(&with("authorization", b"Bear")), None);
        assert!(b
            .extract(&with("authorization", b"Bearer \xff\x80"))
            .is_some());
    }

    #[test]
    fn api_keys() {
        let k = ApiKey::new();
        assert_eq!(
            k.extract(&with("x-api-key", b" k1 ")),
            Some(hash_subject(b"k1"))
        );
        assert_eq!(k.extract(&with("x-api-key", b"  ")), None);
        assert_ne!(
            k.extract(&with("x-api-key", b"k1")),
            k.extract(&with("x-api-key", b"k2"))
        );
    }
}
