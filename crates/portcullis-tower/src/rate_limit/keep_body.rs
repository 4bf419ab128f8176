//! [`KeepBodyLayer`]: a rate-limit layer whose responses keep the inner
//! service's body type, so a framework that erases body types (Axum) does
//! not box a wrapper body on every response.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::ResponseBody;

/// Wraps a layer whose services answer [`ResponseBody`]s (such as
/// [`RateLimitLayer`](crate::RateLimitLayer)) so that they answer the inner
/// service's own body type `B` instead; built with
/// [`RateLimitLayer::keep_body`](crate::RateLimitLayer::keep_body).
///
/// A forwarded response's body is passed on as it is, and the body the
/// layer writes itself (a limited, rejected or failed request) is made with
/// `B::from(Bytes)`, so `B` must implement `From<Bytes>`: Axum's `Body`
/// and `http_body_util::Full<Bytes>` do.
///
/// Why: Axum turns every response body that is not its own `Body` into one
/// by boxing it, so behind the default layer each admitted response costs
/// one allocation more than the handler's; with `keep_body` it costs none.
/// A body type without `From<Bytes>` (Tonic's, or a boxed body) keeps the
/// default [`ResponseBody`].
///
/// ```
/// // Also add: cargo add tower --features util
/// use std::net::SocketAddr;
/// use axum::{body::Body, routing::get, Router};
/// use axum::http::{Request, StatusCode};
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::RateLimitLayer;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::new(MemoryStore::new(), Policy::per_minute(1).name("api").build()?);
/// let app = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(layer.keep_body());
///
/// let peer: SocketAddr = "192.0.2.1:4711".parse()?;
/// // (Served by Axum with `into_make_service_with_connect_info`, the peer
/// // address is in the extensions already.)
/// let request = || Request::get("/").extension(peer).body(Body::empty()).unwrap();
/// assert_eq!(app.clone().oneshot(request()).await?.status(), StatusCode::OK);
/// let limited = app.oneshot(request()).await?;
/// assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(limited.headers()["retry-after"], "60");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct KeepBodyLayer<L> {
    inner: L,
}

impl<L> KeepBodyLayer<L> {
    pub(crate) fn new(inner: L) -> Self {
        Self { inner }
    }

    /// The wrapped layer.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }

    /// Unwraps the wrapped layer.
    pub fn into_inner(self) -> L {
        self.inner
    }
}

impl<S, L: Layer<S>> Layer<S> for KeepBodyLayer<L> {
    type Service = KeepBody<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        KeepBody {
            inner: self.inner.layer(inner),
        }
    }
}

/// The service of a [`KeepBodyLayer`]: `S`'s responses with their
/// [`ResponseBody`] unwrapped into the inner body type.
#[derive(Debug, Clone)]
pub struct KeepBody<S> {
    inner: S,
}

impl<S> KeepBody<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the wrapped service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req, B> Service<Req> for KeepBody<S>
where
    S: Service<Req, Response = Response<ResponseBody<B>>>,
    B: From<Bytes>,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = KeepBodyFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        KeepBodyFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project! {
    /// The response future of [`KeepBody`].
    #[derive(Debug)]
    pub struct KeepBodyFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, B, E> Future for KeepBodyFuture<F>
where
    F: Future<Output = Result<Response<ResponseBody<B>>, E>>,
    B: From<Bytes>,
{
    type Output = Result<Response<B>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = ready!(self.project().inner.poll(cx))?;
        Poll::Ready(Ok(response.map(ResponseBody::into_body)))
    }
}
