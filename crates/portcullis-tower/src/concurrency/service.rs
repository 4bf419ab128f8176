//! [`ConcurrencyLimit`], the service: reads the key, and acquires a lease
//! at once from a synchronous store or in its [`ResponseFuture`].

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use portcullis_core::{LeaseId, LeaseStore};
use tower_service::Service;

use super::body::ResponseBody;
use super::future::ResponseFuture;
use super::gate::{Gate, Outcome, Ticket};
use crate::config::MissingKey;
use crate::key::{KeyBuf, KeyExtractor, RequestHead};
use crate::response::{grpc_content_type, plain};

layer_service! {
/// The service a [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer)
/// wraps around an inner service.
///
/// ```
/// // Also add: cargo add tower --features util
/// use std::convert::Infallible;
/// use axum::http::{Request, Response, StatusCode};
/// use portcullis::{ConcurrencyPolicy, MemoryStore};
/// use portcullis::tower::{ConcurrencyLimitLayer, Global};
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = ConcurrencyLimitLayer::builder(MemoryStore::new())
///     .policy(ConcurrencyPolicy::max_in_flight(1).build()?)
///     .key(Global)
///     .build()?;
/// let service = layer.layer(tower::service_fn(|_: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("hi")))
/// }));
/// // The first response holds the only permit while its body is unsent.
/// let first = service.clone().oneshot(Request::new(String::new())).await?;
/// let second = service.clone().oneshot(Request::new(String::new())).await?;
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// drop(first); // body dropped: permit released
/// let third = service.oneshot(Request::new(String::new())).await?;
/// assert_eq!(third.status(), StatusCode::OK);
/// # Ok(()) }
/// ```
    ConcurrencyLimit,
    Gate
}

impl<S, St, K, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S, St, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: LeaseStore,
    K: KeyExtractor,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, St, K, ReqBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let gate = &*self.shared;
        let grpc = grpc_content_type(request.headers());
        // Read as the rate layer reads it (`extract_into`), so both layers
        // count a request against the same key.
        let mut key = KeyBuf::new();
        if !gate.key.extract_into(&RequestHead::new(&request), &mut key) {
            match &gate.missing_key {
                MissingKey::Skip => {
                    return ResponseFuture::forward(self.inner.call(request), None);
                }
                MissingKey::Reject { status, message } => {
                    crate::response::log_missing_key(
                        &gate.rejected,
                        &gate.key,
                        *status,
                        grpc.is_some(),
                    );
                    return ResponseFuture::respond(plain(grpc, *status, message));
                }
                MissingKey::Fallback(fallback) => {
                    key.clear();
                    key.push_str(fallback);
                }
            }
        }
        let ticket = Ticket {
            subject: Arc::from(key.as_str()),
            lease: LeaseId::generate(),
            grpc,
        };
        if !gate.store_allowed() {
            return match gate.on_failure(&ticket) {
                Outcome::Forward(permit) => {
                    ResponseFuture::forward(self.inner.call(request), permit)
                }
                Outcome::Respond(response) => ResponseFuture::respond(response),
            };
        }
        // A store that answers synchronously (the memory store) is decided
        // here, and the inner service called directly.
        if let Some(result) = gate
            .store
            .acquire_now(&ticket.subject, &gate.policy, ticket.lease)
        {
            return match gate.decide(&ticket, result) {
                Outcome::Forward(permit) => {
                    ResponseFuture::forward(self.inner.call(request), permit)
                }
                Outcome::Respond(response) => ResponseFuture::respond(response),
            };
        }
        let acquire = gate
            .store
            .acquire(&ticket.subject, &gate.policy, ticket.lease);
        // The inner service that was driven to readiness goes into the
        // future; this service keeps a fresh clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::acquiring(acquire, Arc::clone(&self.shared), inner, request, ticket)
    }
}
