//! The response future of `RateLimit`: check, maybe wait, then call the
//! inner service or answer.
//!
//! The common ways (a request decided in `call` and forwarded, or
//! answered limited) are two variants that hold only the inner future and
//! its headers, or the response, as tower-http's limit future holds only
//! the inner one; everything that waits or charges after the response
//! (the check in flight, a fallback store, a shaping wait, a plan lookup,
//! a charge) is [`Slow`], boxed, so the common future stays small to build
//! and move and its `poll` is one match.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use portcullis_core::{BoxCheckFuture, Store, StoreError, Verdict};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::body::ResponseBody;
use super::checker::{Checker, Next, Then, Ticket};
use super::post_charge::PostCharge;
use super::resolve::Lookup;
use crate::headers::RateLimitHeaders;
use crate::key::KeyExtractor;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    pub struct ResponseFuture<S, St, K, ReqBody>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        kind: Kind<S::Future, Pin<Box<Slow<S, St, K, ReqBody>>>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, W> {
        // Decided in `call`, admitted: the inner service's future and the
        // headers for its response.
        Inner {
            #[pin]
            future: F,
            headers: Option<RateLimitHeaders>,
        },
        // Decided in `call`: answered by the layer.
        Done {
            response: Option<Response<Bytes>>,
        },
        // Waiting, or charging after the response.
        Slow {
            slow: W,
        },
    }
}

pin_project! {
    /// A request that waits (a store that answers later, a shaping delay, a
    /// plan lookup) or is charged after its response.
    struct Slow<S, St, K, ReqBody>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        state: State<S::Future, St::CheckFuture>,
        // Until the request is forwarded.
        pending: Option<Pending<S, St, K, ReqBody>>,
        // Charging after the response (post_charge.rs), when the layer does.
        charge: Option<Box<PostCharge<S::Response, St, K>>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, C> {
        Check {
            #[pin]
            check: C,
            // Started at the first `Pending`, so a store that answers at once
            // never touches the timer (boxed: the fast path stays small).
            timer: Option<Pin<Box<Sleep>>>,
        },
        // Bounded by the layer's check timeout, as the first store is.
        Fallback {
            check: BoxCheckFuture,
            timer: Option<Pin<Box<Sleep>>>,
        },
        // A store's answer that came at once (after a wait's recheck).
        Ready {
            result: Option<Result<Verdict, StoreError>>,
        },
        Wait {
            until: Instant,
            sleep: Option<Pin<Box<Sleep>>>,
            then: Option<Then>,
        },
        Inner {
            #[pin]
            future: F,
            headers: Option<RateLimitHeaders>,
        },
        Done {
            response: Option<Response<Bytes>>,
        },
        // The inner service answered; its response waits in `charge`
        // while the cost is charged.
        Charging,
        // Waiting for the subject's plan (resolve/).
        Resolve {
            lookup: Lookup,
        },
    }
}

/// What a request that is still being checked holds on to.
struct Pending<S, St, K, ReqBody> {
    checker: Arc<Checker<St, K>>,
    inner: S,
    request: Request<ReqBody>,
    ticket: Ticket,
}

impl<S, St, K, ReqBody> fmt::Debug for ResponseFuture<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Inner { .. } => "calling the inner service",
            Kind::Done { .. } => "answered",
            Kind::Slow { slow } => slow.describe(),
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, St, K, ReqBody> Slow<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    fn describe(&self) -> &'static str {
        match &self.state {
            State::Check { .. } => "checking",
            State::Fallback { .. } => "checking the fallback store",
            State::Ready { .. } => "checked",
            State::Wait { .. } => "waiting",
            State::Inner { .. } => "calling the inner service",
            State::Done { .. } => "answered",
            State::Charging => "charging after the response",
            State::Resolve { .. } => "looking up the plan",
        }
    }
}

impl<S, St, K, ReqBody> ResponseFuture<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>>,
    St: Store,
    K: KeyExtractor,
{
    // The constructors take the post-charge, if any, so `call` builds its
    // future in one expression rather than moving the whole future again
    // to set it. Without one, the future is one of the small variants.
    pub(crate) fn forward(
        future: S::Future,
        headers: Option<RateLimitHeaders>,
        charge: Option<Box<PostCharge<S::Response, St, K>>>,
    ) -> Self {
        let kind = match charge {
            None => Kind::Inner { future, headers },
            charge => Kind::Slow {
                slow: Box::pin(Slow {
                    state: State::Inner { future, headers },
                    pending: None,
                    charge,
                }),
            },
        };
        Self { kind }
    }

    pub(crate) fn respond(
        response: Response<Bytes>,
        charge: Option<Box<PostCharge<S::Response, St, K>>>,
    ) -> Self {
        let kind = match charge {
            None => Kind::Done {
                response: Some(response),
            },
            charge => Kind::Slow {
                slow: Box::pin(Slow {
                    state: State::Done {
                        response: Some(response),
                    },
                    pending: None,
                    charge,
                }),
            },
        };
        Self { kind }
    }

    pub(crate) fn pending(
        next: Next<St>,
        checker: Arc<Checker<St, K>>,
        inner: S,
        request: Request<ReqBody>,
        ticket: Ticket,
        charge: Option<Box<PostCharge<S::Response, St, K>>>,
    ) -> Self {
        let mut pending = Some(Pending {
            checker,
            inner,
            request,
            ticket,
        });
        let state = enter(next, &mut pending);
        Self {
            kind: Kind::Slow {
                slow: Box::pin(Slow {
                    state,
                    pending,
                    charge,
                }),
            },
        }
    }
}

/// The state for `next`. Calling the inner service consumes `pending`.
fn enter<S, St, K, ReqBody>(
    next: Next<St>,
    pending: &mut Option<Pending<S, St, K, ReqBody>>,
) -> State<S::Future, St::CheckFuture>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    match next {
        Next::Check(check) => State::Check { check, timer: None },
        Next::Fallback(check) => State::Fallback { check, timer: None },
        Next::Ready(result) => State::Ready {
            result: Some(result),
        },
        Next::Wait(until, then) => State::Wait {
            until,
            sleep: None,
            then: Some(then),
        },
        Next::Resolve(lookup) => State::Resolve { lookup },
        Next::Respond(response) => {
            *pending = None;
            State::Done {
                response: Some(*response),
            }
        }
        Next::Forward(headers) => match pending.take() {
            Some(Pending {
                mut inner, request, ..
            }) => State::Inner {
                future: inner.call(request),
                headers,
            },
            None => State::Done {
                response: Some(missing_request()),
            },
        },
    }
}

/// Unreachable: every waiting state keeps its request until it is forwarded.
fn missing_request() -> Response<Bytes> {
    crate::response::internal_error("rate limiter lost its request")
}

/// [`missing_request`] as the future's answer.
fn lost<B>() -> Response<ResponseBody<B>> {
    missing_request().map(ResponseBody::own)
}

/// Polls a store's check (the first store's or the fallback's), bounded
/// by the layer's check timeout from its first `Pending`, and turns its
/// answer (or the timeout) into the next step.
fn poll_check<F, S, St, K, ReqBody>(
    check: Pin<&mut F>,
    timer: &mut Option<Pin<Box<Sleep>>>,
    pending: &mut Pending<S, St, K, ReqBody>,
    cx: &mut Context<'_>,
) -> Poll<Next<St>>
where
    F: Future<Output = Result<Verdict, StoreError>> + ?Sized,
    St: Store,
    K: KeyExtractor,
{
    let next = match check.poll(cx) {
        Poll::Ready(result) => {
            pending
                .checker
                .on_result(&mut pending.ticket, &mut pending.request, result)
        }
        Poll::Pending => {
            let timer =
                timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(pending.checker.timeout)));
            ready!(timer.as_mut().poll(cx));
            pending
                .checker
                .on_timeout(&mut pending.ticket, &mut pending.request)
        }
    };
    Poll::Ready(next)
}

impl<S, St, K, ReqBody, ResBody> Future for ResponseFuture<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    St: Store,
    K: KeyExtractor,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, headers } => {
                let mut response = ready!(future.poll(cx))?;
                if let Some(headers) = headers.take() {
                    headers.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response.map(ResponseBody::inner)))
            }
            KindProj::Done { response } => {
                let response = response.take().unwrap_or_else(missing_request);
                Poll::Ready(Ok(response.map(ResponseBody::own)))
            }
            KindProj::Slow { slow } => slow.as_mut().poll(cx),
        }
    }
}

impl<S, St, K, ReqBody, ResBody> Future for Slow<S, St, K, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    St: Store,
    K: KeyExtractor,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Inner { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    let headers = headers.take();
                    let response = match this.charge.as_mut() {
                        // The headers then describe the state after the
                        // charge (or, if there is none, these).
                        Some(charge) => match charge.begin(response, headers) {
                            Ok(()) => {
                                this.state.set(State::Charging);
                                continue;
                            }
                            Err(response) => response,
                        },
                        None => {
                            if let Some(headers) = headers {
                                headers.apply(response.headers_mut());
                            }
                            response
                        }
                    };
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
                StateProj::Charging => {
                    let charged = match this.charge.as_mut() {
                        Some(charge) => ready!(charge.poll(cx)),
                        None => None,
                    };
                    return Poll::Ready(match charged {
                        Some(response) => Ok(response.map(ResponseBody::inner)),
                        None => Ok(lost()),
                    });
                }
                StateProj::Done { response } => {
                    let response = response.take().unwrap_or_else(missing_request);
                    return Poll::Ready(Ok(response.map(ResponseBody::own)));
                }
                StateProj::Check { check, timer } => {
                    let Some(pending) = this.pending.as_mut() else {
                        return Poll::Ready(Ok(lost()));
                    };
                    ready!(poll_check(check, timer, pending, cx))
                }
                StateProj::Ready { result } => {
                    let Some((pending, result)) = this.pending.as_mut().zip(result.take()) else {
                        return Poll::Ready(Ok(lost()));
                    };
                    pending
                        .checker
                        .on_result(&mut pending.ticket, &mut pending.request, result)
                }
                StateProj::Fallback { check, timer } => {
                    let Some(pending) = this.pending.as_mut() else {
                        return Poll::Ready(Ok(lost()));
                    };
                    ready!(poll_check(check.as_mut(), timer, pending, cx))
                }
                StateProj::Resolve { lookup } => {
                    let cached = ready!(lookup.as_mut().poll(cx));
                    let Some(pending) = this.pending.as_mut() else {
                        return Poll::Ready(Ok(lost()));
                    };
                    pending
                        .checker
                        .on_resolved(&mut pending.ticket, &mut pending.request, &cached)
                }
                StateProj::Wait { until, sleep, then } => {
                    let until = *until;
                    let sleep =
                        sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                    ready!(sleep.as_mut().poll(cx));
                    let Some(pending) = this.pending.as_mut() else {
                        return Poll::Ready(Ok(lost()));
                    };
                    let then = then.take().unwrap_or(Then::Forward(None));
                    pending
                        .checker
                        .after_wait(&mut pending.ticket, pending.request.headers(), then)
                }
            };
            let state = enter(next, this.pending);
            this.state.set(state);
        }
    }
}
