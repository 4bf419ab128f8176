//! [`ResponseFuture`]: acquire a lease (with a timeout), then call
//! the inner service holding the permit, then hand the permit to the
//! response body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use portcullis_core::{LeaseStore, StoreError};
use tokio::time::Sleep;
use tower_service::Service;

use super::body::ResponseBody;
use super::gate::{Gate, Outcome, Ticket};
use super::permit::Permit;

/// What an acquire under way keeps for the call that follows.
struct Pending<S, St, K, ReqBody> {
    inner: S,
    request: Request<ReqBody>,
    gate: Arc<Gate<St, K>>,
    ticket: Ticket,
    /// Releases the lease if this future is dropped (or the store fails)
    /// before the acquire's answer says it was not granted.
    cleanup: Option<Permit>,
    timer: Option<Pin<Box<Sleep>>>,
}

pin_project! {
    /// The response future of [`ConcurrencyLimit`](crate::ConcurrencyLimit).
    pub struct ResponseFuture<S, St, K, ReqBody>
    where
        S: Service<Request<ReqBody>>,
        St: LeaseStore,
    {
        #[pin]
        state: State<S::Future, St::AcquireFuture>,
        pending: Option<Box<Pending<S, St, K, ReqBody>>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, A> {
        Acquire { #[pin] acquire: A },
        Inner { #[pin] future: F, permit: Option<Permit> },
        Done { response: Option<Response<Bytes>> },
    }
}

impl<S, St, K, ReqBody> fmt::Debug for ResponseFuture<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>>,
    St: LeaseStore,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquire { .. } => "Acquire",
            State::Inner { .. } => "Inner",
            State::Done { .. } => "Done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S, St, K, ReqBody> ResponseFuture<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>>,
    St: LeaseStore,
{
    pub(crate) fn forward(future: S::Future, permit: Option<Permit>) -> Self {
        Self {
            state: State::Inner { future, permit },
            pending: None,
        }
    }

    pub(crate) fn respond(response: Response<Bytes>) -> Self {
        Self {
            state: State::Done {
                response: Some(response),
            },
            pending: None,
        }
    }

    pub(crate) fn acquiring(
        acquire: St::AcquireFuture,
        gate: Arc<Gate<St, K>>,
        inner: S,
        request: Request<ReqBody>,
        ticket: Ticket,
    ) -> Self {
        let cleanup = Some(Permit::release_on_drop(
            &gate.store,
            Arc::clone(&ticket.subject),
            &gate.policy,
            ticket.lease,
        ));
        Self {
            state: State::Acquire { acquire },
            pending: Some(Box::new(Pending {
                inner,
                request,
                gate,
                ticket,
                cleanup,
                timer: None,
            })),
        }
    }
}

impl<S, St, K, ReqBody, ResBody> Future for ResponseFuture<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    St: LeaseStore,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquire { acquire } => {
                    let Some(pending) = this.pending.as_mut() else {
                        // Never: `acquiring` sets both together.
                        return Poll::Ready(Ok(internal_error()));
                    };
                    let result = match acquire.poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            let timeout = pending.gate.timeout;
                            let timer = pending
                                .timer
                                .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                            if timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            Err(StoreError::Timeout { after: timeout })
                        }
                    };
                    let Some(mut pending) = this.pending.take() else {
                        return Poll::Ready(Ok(internal_error()));
                    };
                    if matches!(&result, Ok(decision) if !decision.is_granted()) {
                        // Denied: no lease to give back.
                        if let Some(cleanup) = pending.cleanup.take() {
                            cleanup.disarm();
                        }
                    }
                    let outcome = pending.gate.decide(&pending.ticket, result);
                    if matches!(outcome, Outcome::Forward(Some(_))) {
                        // Granted: the permit releases it from now on.
                        if let Some(cleanup) = pending.cleanup.take() {
                            cleanup.disarm();
                        }
                    }
                    // Otherwise (an error: it may have been granted) the
                    // cleanup releases it here.
                    drop(pending.cleanup.take());
                    let Pending {
                        mut inner, request, ..
                    } = *pending;
                    let next = match outcome {
                        Outcome::Forward(permit) => State::Inner {
                            future: inner.call(request),
                            permit,
                        },
                        Outcome::Respond(response) => State::Done {
                            response: Some(response),
                        },
                    };
                    this.state.set(next);
                }
                StateProj::Inner { future, permit } => {
                    return match future.poll(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(Ok(response)) => {
                            let permit = permit.take();
                            Poll::Ready(Ok(response.map(|body| ResponseBody::inner(body, permit))))
                        }
                        Poll::Ready(Err(error)) => {
                            drop(permit.take());
                            Poll::Ready(Err(error))
                        }
                    };
                }
                StateProj::Done { response } => {
                    let response = response.take().unwrap_or_else(internal_error_bytes);
                    return Poll::Ready(Ok(response.map(ResponseBody::own)));
                }
            }
        }
    }
}

fn internal_error_bytes() -> Response<Bytes> {
    crate::response::internal_error("concurrency limit future polled after completion")
}

fn internal_error<B>() -> Response<ResponseBody<B>> {
    internal_error_bytes().map(ResponseBody::own)
}
