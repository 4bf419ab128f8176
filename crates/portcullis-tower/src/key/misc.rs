//! Keys from extensions, the route and the method, and the global key.

use std::fmt;
use std::marker::PhantomData;

use super::buf::KeyBuf;
use super::extractor::KeyExtractor;
use super::head::RequestHead;

/// Keys on an authenticated user that an earlier layer (your authentication
/// middleware) inserted into the request extensions, as any type you name;
/// the key is its [`Display`](fmt::Display) form. A request without one
/// yields no key.
///
/// ```
/// use std::fmt;
/// use axum::http::Request;
/// use portcullis::tower::{KeyExtractor, User};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl fmt::Display for UserId {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///         write!(f, "user:{}", self.0)
///     }
/// }
///
/// let request = Request::get("/").extension(UserId(42)).body(()).unwrap();
/// assert_eq!(User::<UserId>::new().extract(&request).as_deref(), Some("user:42"));
/// ```
pub struct User<T> {
    _type: PhantomData<fn() -> T>,
}

impl<T> User<T> {
    /// Keys on the `T` in the request extensions.
    #[must_use]
    pub fn new() -> Self {
        Self { _type: PhantomData }
    }
}

impl<T> Default for User<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for User<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for User<T> {}

impl<T> fmt::Debug for User<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "User<{}>", std::any::type_name::<T>())
    }
}

impl<T> KeyExtractor for User<T>
where
    T: fmt::Display + Send + Sync + 'static,
{
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        use std::fmt::Write as _;
        match request.extensions().get::<T>() {
            // Writing to a `KeyBuf` only fails if `T`'s `Display` does.
            Some(user) => write!(key, "{user}").is_ok(),
            None => false,
        }
    }

    fn describe(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("an authenticated caller")
    }

    fn missing_hint(&self) -> Option<&'static str> {
        Some("the request had no user in its extensions: put the authentication layer that inserts it before (outside) the rate-limit layer, or choose MissingKey::Skip or MissingKey::fallback for anonymous requests")
    }
}

/// One key for every request: the limit is shared by all callers.
///
/// ```
/// use axum::http::Request;
/// use portcullis::tower::{Global, KeyExtractor};
///
/// let request = Request::get("/").body(()).unwrap();
/// assert_eq!(Global.extract(&request).as_deref(), Some("global"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract_into(&self, _request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        key.push_str("global");
        true
    }
}

/// Keys on the request method (`GET`, `POST`, ...). Useful in a tuple, for
/// example `(PeerIp::new(), Method)`.
///
/// ```
/// use axum::http::Request;
/// use portcullis::tower::{KeyExtractor, Method};
///
/// let request = Request::delete("/").body(()).unwrap();
/// assert_eq!(Method.extract(&request).as_deref(), Some("DELETE"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Method;

impl KeyExtractor for Method {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        key.push_str(request.method().as_str());
        true
    }
}

/// Keys on the route Axum matched (`/users/{id}`, not `/users/42`), from
/// Axum's [`MatchedPath`](axum::extract::MatchedPath); no key outside a
/// matched route. Combine with [`Method`] and a caller key, e.g.
/// `(MatchedRoute, Method, PeerIp::new())`, for per-route limits from one
/// layer. Feature `axum`.
///
/// ```
/// use axum::{routing::get, Router};
/// use portcullis::tower::{MatchedRoute, RateLimitLayer};
/// # fn policy() -> portcullis::Policy { portcullis::Policy::per_second(5).build().unwrap() }
///
/// let layer = RateLimitLayer::builder(portcullis::MemoryStore::new())
///     .policy(policy())
///     .key(MatchedRoute)
///     .build()
///     .unwrap();
/// let app: Router = Router::new().route("/users/{id}", get(|| async { "hi" })).layer(layer);
/// ```
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchedRoute;

#[cfg(feature = "axum")]
impl KeyExtractor for MatchedRoute {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        match request.extensions().get::<axum::extract::MatchedPath>() {
            Some(path) => {
                key.push_str(path.as_str());
                true
            }
            None => false,
        }
    }

    fn describe(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("a known route")
    }

    fn missing_hint(&self) -> Option<&'static str> {
        Some("the request matched no route: add the layer with Router::route_layer (or inside the routes) so axum's MatchedPath is set, or choose MissingKey::Skip")
    }
}
