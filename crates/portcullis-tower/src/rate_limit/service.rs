//! [`RateLimit`], the service: `call` starts the check (the checker's
//! `start`), answers at once what a store answers at once, and otherwise
//! hands the request to its [`ResponseFuture`].

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use http_body::Body;
use portcullis_core::Store;
use tower_service::Service;

use super::body::ResponseBody;
use super::charge::Charge;
use super::checker::{Checker, Next};
use super::future::ResponseFuture;
use super::post_charge::PostCharge;
use crate::key::KeyExtractor;

layer_service! {
/// Middleware that rate-limits requests; built by
/// [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `poll_ready` only asks the inner service; the check runs in `call`'s
/// future, before the inner service is called. A limited request gets a
/// response (429, or gRPC status 8), never an error, so the service's error
/// type is the inner service's and it needs no `HandleErrorLayer` in Axum.
///
/// ```
/// // Also add: cargo add tower --features util
/// use std::convert::Infallible;
/// use std::net::SocketAddr;
/// use axum::body::Body;
/// use axum::http::{Request, Response, StatusCode};
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::RateLimitLayer;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::new(MemoryStore::new(), Policy::per_minute(1).name("demo").build()?);
/// let service = layer.layer(service_fn(|_req: Request<()>| async {
///     Ok::<_, Infallible>(Response::new(Body::from("hello")))
/// }));
/// let peer: SocketAddr = "192.0.2.1:4711".parse()?;
/// let request = || Request::get("/").extension(peer).body(()).unwrap();
///
/// let first = service.clone().oneshot(request()).await?;
/// assert_eq!(first.status(), StatusCode::OK);
/// assert_eq!(first.headers()["ratelimit"], "\"demo\";r=0;t=60");
///
/// let second = service.oneshot(request()).await?;
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(second.headers()["retry-after"], "60");
/// # Ok(()) }
/// ```
    RateLimit,
    Checker
}

impl<S, St, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    K: KeyExtractor,
    ResBody: Body,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, St, K, ReqBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let mut ticket = None;
        // A layer built with nothing a request brings but its key (chosen
        // at `build()`): an admitted request is forwarded from here, with
        // no step or ticket built; anything else continues below.
        let (mut next, charge) = if self.shared.straight {
            match self.shared.start_straight(&mut request, &mut ticket) {
                Ok(headers) => {
                    return ResponseFuture::forward(self.inner.call(request), headers, None)
                }
                Err(next) => (next, None),
            }
        } else {
            // Charging after the response: a handle for the handler, and
            // the post-response step.
            let charge = self.shared.charge.is_some().then(|| {
                let handle = Charge::new();
                request.extensions_mut().insert(handle.clone());
                PostCharge::new(Arc::clone(&self.shared), handle)
            });
            (self.shared.start(&mut request, &mut ticket), charge)
        };
        // A store that answers synchronously does so through
        // `Store::check_now` (`Next::Ready`), so the request is decided here
        // and the inner service is called directly instead of being cloned
        // into a waiting future. Each step moves forward (check, fallback,
        // answer), so this ends after a few rounds.
        if let Some(ticket) = ticket.as_mut() {
            while let Next::Ready(result) = next {
                next = self.shared.on_result(ticket, &mut request, result);
            }
        }
        // Each arm builds the returned future in one go (see
        // `ResponseFuture::forward`).
        match next {
            Next::Forward(headers) => {
                ResponseFuture::forward(self.inner.call(request), headers, charge)
            }
            Next::Respond(response) => ResponseFuture::respond(*response, charge),
            next => match ticket {
                Some(ticket) => {
                    // The inner service that was driven to readiness goes
                    // into the future; this service keeps a fresh clone.
                    let clone = self.inner.clone();
                    let inner = std::mem::replace(&mut self.inner, clone);
                    ResponseFuture::pending(
                        next,
                        Arc::clone(&self.shared),
                        inner,
                        request,
                        ticket,
                        charge,
                    )
                }
                None => {
                    // `start` writes a ticket with every step that waits.
                    tracing::error!("rate limiter step without a ticket; request let through");
                    ResponseFuture::forward(self.inner.call(request), None, charge)
                }
            },
        }
    }
}
