//! [`KeyExtractor`], the trait every key extractor implements (closures
//! included), how extractors combine (a tuple keys on all of its parts,
//! [`Or`] falls back), and the encoding of a combined key. The shipped
//! extractors are in the sibling files.

use std::borrow::Cow;
use std::fmt;

use portcullis_core::subject::{hash_subject, is_plain};

use super::buf::KeyBuf;
use super::head::RequestHead;

/// Derives the rate-limit key (the subject a store counts against) from a
/// request.
///
/// Returning `None` means the request carries no key; what happens then is
/// chosen with [`RateLimitLayerBuilder::on_missing_key`]
/// (skip, reject, or a shared fallback key).
///
/// An extractor reads the request's head ([`RequestHead`]: method, URI,
/// headers, extensions), borrowed from the request in place. Any
/// `Fn(&RequestHead) -> Option<String>` closure is a key extractor, and
/// extractors combine: a tuple keys on all of its parts, and
/// [`KeyExtractor::or`] falls back when the first yields nothing.
///
/// [`RateLimitLayerBuilder::on_missing_key`]: crate::RateLimitLayerBuilder::on_missing_key
///
/// ```
/// use axum::http::Request;
/// use portcullis::tower::{BearerToken, KeyExtractor, Method, PeerIp, RequestHead};
///
/// // A closure: the tenant from a header, lower-cased.
/// let tenant = |request: &RequestHead| {
///     let value = request.headers().get("x-tenant")?.to_str().ok()?;
///     Some(value.to_ascii_lowercase())
/// };
///
/// // The token if there is one, else the client's IP address.
/// let token_or_ip = BearerToken::new().or(PeerIp::new());
///
/// // One bucket per tenant and method.
/// let per_tenant_and_method = (tenant, Method);
///
/// let request = Request::post("/").header("x-tenant", "ACME").body(()).unwrap();
/// assert_eq!(per_tenant_and_method.extract(&request).as_deref(), Some("acme,POST"));
/// assert_eq!(token_or_ip.extract(&request), None); // no token, no peer address
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// Writes the key for this request into `key` and returns `true`, or
    /// returns `false` when the request carries none (what `key` then
    /// holds is unspecified). `key` is empty when a layer calls this.
    ///
    /// Both layers call this method: the shipped extractors write into the
    /// [`KeyBuf`] in place, so keying a request by IP address allocates
    /// nothing. (A closure `Fn(&RequestHead) -> Option<String>` is an extractor
    /// too, its `String` moved into `key`.)
    ///
    /// ```
    /// use axum::http::Request;
    /// use portcullis::tower::{KeyBuf, KeyExtractor, RequestHead};
    ///
    /// struct Tenant;
    /// impl KeyExtractor for Tenant {
    ///     fn extract_into(&self, request: &RequestHead, key: &mut KeyBuf) -> bool {
    ///         match request.headers().get("x-tenant").and_then(|v| v.to_str().ok()) {
    ///             Some(tenant) => {
    ///                 key.push_str("tenant:");
    ///                 key.push_str(tenant);
    ///                 true
    ///             }
    ///             None => false,
    ///         }
    ///     }
    /// }
    ///
    /// let request = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
    /// let mut key = KeyBuf::new();
    /// assert!(Tenant.extract_into(&RequestHead::new(&request), &mut key));
    /// assert_eq!(key.as_str(), "tenant:acme");
    /// assert_eq!(Tenant.extract(&request).as_deref(), Some("tenant:acme"));
    /// ```
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool;

    /// The key for a request (a `&Request`, its `&Parts` or a
    /// `&RequestHead`) as a `String`, or `None` when it carries none:
    /// [`extract_into`](Self::extract_into) into a fresh [`KeyBuf`].
    fn extract<'r>(&self, request: impl Into<RequestHead<'r>>) -> Option<String>
    where
        Self: Sized,
    {
        let mut key = KeyBuf::new();
        self.extract_into(&request.into(), &mut key)
            .then(|| key.into_string())
    }

    /// What the extractor reads, in words the client can act on (`"a
    /// bearer token in the Authorization header"`): the layers' default
    /// answer to a request without a key says it needs this, and their
    /// log names it. The default says only "a rate-limit key".
    ///
    /// ```
    /// use portcullis::tower::{BearerToken, KeyExtractor};
    ///
    /// assert_eq!(BearerToken::new().describe(), "a bearer token in the Authorization header");
    /// ```
    fn describe(&self) -> Cow<'static, str> {
        Cow::Borrowed("a rate-limit key")
    }

    /// For the operator: why requests may come without this key, and what
    /// to change (logged, at most once per second, when requests without
    /// one are rejected; never sent to the client). `None` by default.
    ///
    /// ```
    /// use portcullis::tower::{KeyExtractor, PeerIp};
    ///
    /// assert!(PeerIp::new().missing_hint().unwrap().contains("connect_info"));
    /// ```
    fn missing_hint(&self) -> Option<&'static str> {
        None
    }

    /// Uses `fallback` when `self` yields no key.
    fn or<F>(self, fallback: F) -> Or<Self, F>
    where
        Self: Sized,
        F: KeyExtractor,
    {
        Or {
            first: self,
            fallback,
        }
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&RequestHead<'_>) -> Option<String> + Send + Sync + 'static,
{
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        match self(request) {
            Some(string) => {
                key.push_string(string);
                true
            }
            None => false,
        }
    }

    fn extract<'r>(&self, request: impl Into<RequestHead<'r>>) -> Option<String> {
        self(&request.into())
    }
}

/// Tries one extractor, then another when the first yields no key. Built
/// with [`KeyExtractor::or`].
#[derive(Clone, Copy)]
pub struct Or<A, B> {
    first: A,
    fallback: B,
}

impl<A, B> fmt::Debug for Or<A, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Or").finish_non_exhaustive()
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        if self.first.extract_into(request, key) {
            return true;
        }
        key.clear();
        self.fallback.extract_into(request, key)
    }

    fn describe(&self) -> Cow<'static, str> {
        Cow::Owned(format!(
            "{} or {}",
            self.first.describe(),
            self.fallback.describe()
        ))
    }

    fn missing_hint(&self) -> Option<&'static str> {
        self.first
            .missing_hint()
            .or_else(|| self.fallback.missing_hint())
    }
}

/// Appends one component of a combined key, separated by `,`.
///
/// A component that is a plain subject without `,` is kept as it is;
/// anything else is replaced by its hash, which starts with `#` and so can
/// never equal a plain component. The joined key is therefore unambiguous:
/// two different tuples of components never produce the same key.
fn push_component(out: &mut KeyBuf, component: &str) {
    if !out.is_empty() {
        out.push_str(",");
    }
    if is_plain(component) && !component.contains(',') {
        out.push_str(component);
    } else {
        out.push_string(hash_subject(component.as_bytes()));
    }
}

macro_rules! tuple_extractor {
    ($($name:ident),+) => {
        /// Keys on every part; yields no key when any part yields none.
        #[allow(non_snake_case)]
        impl<$($name: KeyExtractor),+> KeyExtractor for ($($name,)+) {
            fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
                let ($($name,)+) = self;
                let mut component = KeyBuf::new();
                $(
                    component.clear();
                    if !$name.extract_into(request, &mut component) {
                        return false;
                    }
                    push_component(key, &component);
                )+
                true
            }

            fn describe(&self) -> Cow<'static, str> {
                let ($($name,)+) = self;
                let parts: Vec<Cow<'static, str>> = vec![$($name.describe()),+];
                Cow::Owned(parts.join(" and "))
            }

            fn missing_hint(&self) -> Option<&'static str> {
                let ($($name,)+) = self;
                None$(.or_else(|| $name.missing_hint()))+
            }
        }
    };
}

tuple_extractor!(A, B);
tuple_extractor!(A, B, C);
tuple_extractor!(A, B, C, D);
tuple_extractor!(A, B, C, D, E);
tuple_extractor!(A, B, C, D, E, F);

#[cfg(test)]
mod tests {
    use super::*;
    use http::request::Parts;
    use http::Request;

    fn parts() -> Parts {
        Request::get("/").body(()).unwrap().into_parts().0
    }

    fn fixed(value: &'static str) -> impl KeyExtractor {
        move |_: &RequestHead<'_>| Some(value.to_owned())
    }

    fn none() -> impl KeyExtractor {
        |_: &RequestHead<'_>| None
    }

    #[test]
    fn tuples_join_plain_components_and_hash_the_rest() {
        let parts = parts();
        assert_eq!(
            (fixed("a"), fixed("b")).extract(&parts).as_deref(),
            Some("a,b")
        );
        let key = (fixed("a,b"), fixed("c")).extract(&parts).unwrap();
        let other = (fixed("a"), fixed("b,c")).extract(&parts).unwrap();
        assert_ne!(key, other);
        assert!(key.starts_with('#') && key.ends_with(",c"));
        assert_eq!((fixed("a"), none()).extract(&parts), None);
        assert_eq!(
            (
                fixed("a"),
                fixed("b"),
                fixed("c"),
                fixed("d"),
                fixed("e"),
                fixed("f")
            )
                .extract(&parts)
                .as_deref(),
            Some("a,b,c,d,e,f")
        );
    }

    #[test]
    fn or_falls_back_only_when_the_first_has_no_key() {
        let parts = parts();
        assert_eq!(
            fixed("a").or(fixed("b")).extract(&parts).as_deref(),
            Some("a")
        );
        assert_eq!(none().or(fixed("b")).extract(&parts).as_deref(), Some("b"));
        assert_eq!(none().or(none()).extract(&parts), None);
    }

    proptest::proptest! {
        #[test]
        fn tuple_keys_are_injective(a in ".{0,8}", b in ".{0,8}", c in ".{0,8}", d in ".{0,8}") {
            let parts = parts();
            let (a2, b2, c2, d2) = (a.clone(), b.clone(), c.clone(), d.clone());
            let left = (move |_: &RequestHead<'_>| Some(a2.clone()), move |_: &RequestHead<'_>| Some(b2.clone())).extract(&parts);
            let right = (move |_: &RequestHead<'_>| Some(c2.clone()), move |_: &RequestHead<'_>| Some(d2.clone())).extract(&parts);
            proptest::prop_assert_eq!(left == right, (a, b) == (c, d));
        }
    }
}
