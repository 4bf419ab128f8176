//! [`ConcurrencyLimit`], the service, and the decision it takes on an
//! acquire's result (grant, 429, failure policy).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use portcullis_core::{ErrorScope, LeaseDecision, LeaseId, LeaseStore, StoreError};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::Shared;
use super::permit::Permit;
use super::ResponseBody;
use crate::config::MissingKey;
use crate::headers::ceil_secs;
use crate::key::{KeyBuf, KeyExtractor};
use crate::observe::{self, Concurrency};
use crate::response::{grpc_content_type, plain};

static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The service a [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer)
/// wraps around an inner service.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
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
pub struct ConcurrencyLimit<S, St, K> {
    inner: S,
    shared: Arc<Shared<St, K>>,
}

impl<S, St, K> ConcurrencyLimit<S, St, K> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St, K>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St, K> Clone for ConcurrencyLimit<S, St, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, St, K> fmt::Debug for ConcurrencyLimit<S, St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

/// What to do with a request once its acquire answered.
pub(crate) enum Outcome {
    /// Call the inner service, holding this permit (none: fail-open).
    Forward(Option<Permit>),
    /// Answer with this response.
    Respond(Response<Bytes>),
}

/// The request's identity for the store.
pub(crate) struct Ticket {
    pub(crate) subject: Arc<str>,
    pub(crate) lease: LeaseId,
    pub(crate) grpc: Option<HeaderValue>,
}

impl<St: LeaseStore, K> Shared<St, K> {
    /// Turns an acquire's result into what to do. `cleanup` releases the
    /// lease if it may have been granted (an error or a timeout).
    pub(crate) fn decide(
        &self,
        ticket: &Ticket,
        result: Result<LeaseDecision, StoreError>,
    ) -> Outcome {
        if result.is_ok() && self.breaker.success() {
            tracing::info!(
                policy = self.policy.name(),
                "concurrency limit store answers again; circuit breaker closed"
            );
        }
        match result {
            Ok(decision) if decision.is_granted() => {
                observe::concurrency(&self.policy_name, Concurrency::Granted);
                Outcome::Forward(Some(Permit::hold(
                    &self.store,
                    Arc::clone(&ticket.subject),
                    &self.policy,
                    ticket.lease,
                )))
            }
            Ok(decision) => Outcome::Respond(self.limited(ticket, decision.retry_after())),
            Err(error) => self.on_error(ticket, &error),
        }
    }

    fn on_error(&self, ticket: &Ticket, error: &StoreError) -> Outcome {
        match error.scope() {
            // No room for a new subject, or a request the store refuses:
            // denied, never let through.
            ErrorScope::NoRoom => {
                observe::concurrency(&self.policy_name, Concurrency::StoreError);
                Outcome::Respond(self.limited(ticket, error.retry_after()))
            }
            ErrorScope::Request => {
                observe::concurrency(&self.policy_name, Concurrency::StoreError);
                Outcome::Respond(self.limited(ticket, None))
            }
            // Only store-wide errors count toward the breaker (the table
            // at `portcullis_core::ErrorScope`), as in the rate layer.
            scope => {
                observe::concurrency(&self.policy_name, Concurrency::StoreError);
                if scope == ErrorScope::Store && self.breaker.failure() {
                    tracing::warn!(policy = self.policy.name(), error = crate::observe::chain(error), pause = ?self.breaker.pause(), "concurrency limit store failing; circuit breaker opened");
                } else {
                    self.log_error(error);
                }
                self.on_failure(ticket)
            }
        }
    }

    /// Logs a store error at `warn`, at most once per second per layer with
    /// the count since the last log (every one at `debug`).
    fn log_error(&self, error: &StoreError) {
        tracing::debug!(
            policy = self.policy.name(),
            error = crate::observe::chain(error),
            "concurrency limit store failed"
        );
        if let Some(count) = self.errors.record() {
            tracing::warn!(
                policy = self.policy.name(),
                error = crate::observe::chain(error),
                count,
                "concurrency limit store failed: {count} error(s) since the last such warning"
            );
        }
    }

    /// Whether the store may be asked: `false` while the circuit breaker
    /// is open.
    pub(crate) fn store_allowed(&self) -> bool {
        let allowed = self.breaker.allow();
        if !allowed {
            tracing::debug!(
                policy = self.policy.name(),
                "store skipped: circuit breaker open"
            );
        }
        allowed
    }

    /// The failure policy, after the store failed or timed out, or while
    /// the circuit breaker skips it.
    pub(crate) fn on_failure(&self, ticket: &Ticket) -> Outcome {
        if self.fail_closed {
            Outcome::Respond(plain(
                ticket.grpc.clone(),
                StatusCode::SERVICE_UNAVAILABLE,
                "The service cannot check its concurrency limit right now; try again shortly.\n",
            ))
        } else {
            observe::concurrency(&self.policy_name, Concurrency::FailOpen);
            if let Some(count) = self.undecided.record() {
                tracing::warn!(
                    policy = self.policy.name(),
                    count,
                    "concurrency limit failing open: {count} request(s) run without a permit since the last such warning"
                );
            }
            Outcome::Forward(None)
        }
    }

    /// The `429` (gRPC `RESOURCE_EXHAUSTED`) of a denied request, with
    /// `Retry-After` when the store knows when a permit comes back.
    fn limited(&self, ticket: &Ticket, retry_after: Option<Duration>) -> Response<Bytes> {
        observe::concurrency(&self.policy_name, Concurrency::Denied);
        let mut message = format!(
            "Too many requests: concurrency limit \"{}\" of {} in flight reached",
            self.policy.name(),
            self.policy.limit()
        );
        let secs = retry_after.map(|r| ceil_secs(r).max(1));
        if let Some(secs) = secs {
            let unit = if secs == 1 { "second" } else { "seconds" };
            message.push_str(&format!(
                "; a permit frees when a running request ends, or in {secs} {unit} unless its lease is renewed"
            ));
        }
        message.push_str(".\n");
        let mut response = plain(ticket.grpc.clone(), StatusCode::TOO_MANY_REQUESTS, &message);
        if let (Some(secs), Some(retry)) = (secs, retry_after) {
            let headers = response.headers_mut();
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            if ticket.grpc.is_some() {
                let millis = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX);
                headers.insert(GRPC_RETRY_PUSHBACK_MS.clone(), HeaderValue::from(millis));
            }
        }
        response
    }
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
        let shared = &*self.shared;
        let grpc = grpc_content_type(request.headers());
        let (parts, body) = request.into_parts();
        // Read as the rate layer reads it (`extract_into`), so both layers
        // count a request against the same key.
        let mut key = KeyBuf::new();
        if !shared.key.extract_into(&parts, &mut key) {
            match &shared.missing_key {
                MissingKey::Skip => {
                    let request = Request::from_parts(parts, body);
                    return ResponseFuture::forward(self.inner.call(request), None);
                }
                MissingKey::Reject { status, message } => {
                    return ResponseFuture::respond(plain(grpc, *status, message));
                }
                MissingKey::Fallback(fallback) => {
                    key.clear();
                    key.push_str(fallback);
                }
            }
        }
        let request = Request::from_parts(parts, body);
        let ticket = Ticket {
            subject: Arc::from(key.as_str()),
            lease: LeaseId::generate(),
            grpc,
        };
        if !shared.store_allowed() {
            return match shared.on_failure(&ticket) {
                Outcome::Forward(permit) => {
                    ResponseFuture::forward(self.inner.call(request), permit)
                }
                Outcome::Respond(response) => ResponseFuture::respond(response),
            };
        }
        // A store that answers synchronously (the memory store) is decided
        // here, and the inner service called directly.
        if let Some(result) =
            shared
                .store
                .acquire_now(&ticket.subject, &shared.policy, ticket.lease)
        {
            return match shared.decide(&ticket, result) {
                Outcome::Forward(permit) => {
                    ResponseFuture::forward(self.inner.call(request), permit)
                }
                Outcome::Respond(response) => ResponseFuture::respond(response),
            };
        }
        let acquire = shared
            .store
            .acquire(&ticket.subject, &shared.policy, ticket.lease);
        // The inner service that was driven to readiness goes into the
        // future; this service keeps a fresh clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::acquiring(acquire, Arc::clone(&self.shared), inner, request, ticket)
    }
}
