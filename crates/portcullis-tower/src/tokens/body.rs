//! [`TokenBody`], the response body of the token layer: it reads the
//! usage the response reports as the body passes and settles the
//! reservation once, when the body ends, fails or is dropped (a client
//! that went away); [`Settler`], what settles it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use portcullis_core::{ReservationId, ReservationStore, TokenBudget};
use tokio::runtime::Handle;

use super::shared::TokenLogs;
use super::usage::UsageReader;

type Settle = Box<dyn FnOnce(u64) + Send + Sync>;

/// Settles one reservation, once: with the usage reported, else its
/// estimate (the rule for a response whose usage is unknown: a client
/// gone, an upstream error, a body that reports none).
pub(crate) struct Settler {
    settle: Option<Settle>,
    estimate: u64,
    /// The task keeping the reservation open while the request runs
    /// ([`Settler::keep_open`]); stopped when it settles.
    keeper: Option<tokio::task::AbortHandle>,
}

impl fmt::Debug for Settler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settler")
            .field("estimate", &self.estimate)
            .field("settled", &self.settle.is_none())
            .finish()
    }
}

impl Settler {
    /// Settles reservation `id` of `key` through `store`, each call under
    /// `timeout`, retried (it is idempotent by id) up to three times after
    /// a store-wide failure.
    pub(crate) fn new<St: ReservationStore>(
        store: Arc<St>,
        key: Arc<str>,
        budget: TokenBudget,
        id: ReservationId,
        estimate: u64,
        timeout: Duration,
        logs: Arc<TokenLogs>,
    ) -> Self {
        let settle: Settle = Box::new(move |used| {
            let Ok(handle) = Handle::try_current() else {
                if let Some(count) = logs.settles.record() {
                    tracing::warn!(
                        budget = budget.name(),
                        count,
                        "token reservations could not be settled outside a tokio runtime; they expire after their TTL with their estimates charged (count: since the last such line)"
                    );
                }
                return;
            };
            let task = async move {
                for attempt in 0..3u32 {
                    if attempt > 0 {
                        // A store failing as a whole is not asked again at
                        // once: 50 ms, then 100 ms.
                        tokio::time::sleep(Duration::from_millis(50) * attempt).await;
                    }
                    match tokio::time::timeout(timeout, store.settle(&key, &budget, id, used)).await
                    {
                        Ok(Ok(settlement)) => {
                            tracing::debug!(
                                budget = budget.name(),
                                used,
                                charged = settlement.charged(),
                                outcome = ?settlement.outcome(),
                                "token reservation settled"
                            );
                            return;
                        }
                        Ok(Err(error)) if !error.is_store_wide() => {
                            if let Some(count) = logs.settles.record() {
                                tracing::warn!(
                                    budget = budget.name(),
                                    error = crate::observe::chain(&error),
                                    count,
                                    "settling token reservations failed (count: since the last such line)"
                                );
                            }
                            return;
                        }
                        Ok(Err(_)) | Err(_) => {}
                    }
                }
                if let Some(count) = logs.settles.record() {
                    tracing::warn!(
                        budget = budget.name(),
                        count,
                        "settling token reservations failed three times each; they expire after their TTL with their estimates charged (count: since the last such line)"
                    );
                }
            };
            // A store that answers at once (memory) settles before the
            // body's end is reported; others finish on the runtime.
            let mut task = Box::pin(task);
            let mut cx = Context::from_waker(Waker::noop());
            if task.as_mut().poll(&mut cx).is_pending() {
                handle.spawn(task);
            }
        });
        Self {
            settle: Some(settle),
            estimate,
            keeper: None,
        }
    }

    /// Keeps the reservation open until it is settled: renewed every half
    /// TTL ([`ReservationStore::renew`]), so that a request that runs
    /// longer than the budget's reservation TTL (a long stream, a slow
    /// upstream) neither loses it (its estimate charged, its usage never
    /// settled) nor frees its place in flight while it runs. Outside a
    /// tokio runtime it is not kept (the TTL ends it, as before).
    pub(crate) fn keep_open<St: ReservationStore>(
        &mut self,
        store: Arc<St>,
        key: Arc<str>,
        budget: TokenBudget,
        id: ReservationId,
        timeout: Duration,
        logs: Arc<TokenLogs>,
    ) {
        let Ok(handle) = Handle::try_current() else {
            return;
        };
        let every = (budget.reservation_ttl() / 2).max(Duration::from_millis(1));
        // Counted from now, not from the task's first poll.
        let mut next = tokio::time::Instant::now() + every;
        let task = handle.spawn(async move {
            loop {
                tokio::time::sleep_until(next).await;
                next += every;
                match tokio::time::timeout(timeout, store.renew(&key, &budget, id)).await {
                    Ok(Ok(true)) => {}
                    // Settled or expired: nothing to keep.
                    Ok(Ok(false)) => return,
                    Ok(Err(error)) => {
                        if let Some(count) = logs.renewals.record() {
                            tracing::warn!(
                                budget = budget.name(),
                                error = crate::observe::chain(&error),
                                count,
                                "keeping token reservations open failed; tried again in half a TTL (count: since the last such line)"
                            );
                        }
                    }
                    Err(_) => {
                        if let Some(count) = logs.renewals.record() {
                            tracing::warn!(
                                budget = budget.name(),
                                count,
                                "keeping token reservations open timed out; tried again in half a TTL (count: since the last such line)"
                            );
                        }
                    }
                }
            }
        });
        self.keeper = Some(task.abort_handle());
    }

    /// Settles with `used`, or the estimate when unknown (once).
    pub(crate) fn settle(&mut self, used: Option<u64>) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
        if let Some(settle) = self.settle.take() {
            settle(used.unwrap_or(self.estimate));
        }
    }
}

impl Drop for Settler {
    fn drop(&mut self) {
        self.settle(None);
    }
}

/// A reservation and the reader of its response's usage.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) settler: Settler,
    pub(crate) reader: UsageReader,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let used = self.reader.finish();
        self.settler.settle(used);
    }
}

pin_project! {
    /// The body of a response from
    /// [`TokenBudgetService`](crate::TokenBudgetService): the inner
    /// service's body, passed on frame by frame (nothing is held back)
    /// while the usage it reports is read, settling the reservation when
    /// it ends, fails or is dropped; or a short body the layer wrote
    /// itself (a refused request).
    ///
    /// An [`http_body::Body`] with `Data = Bytes` and the inner body's
    /// error, so Axum and Hyper accept it as they accept the inner body.
    ///
    /// ```
    /// // Also add: cargo add tower --features util && cargo add http-body-util
    /// use std::convert::Infallible;
    /// use axum::body::Bytes;
    /// use axum::http::{Request, Response};
    /// use http_body_util::{BodyExt, Full};
    /// use portcullis::{MemoryStore, Policy, Store, TokenBudget};
    /// use portcullis::tower::{Estimate, Global, TokenBudgetLayer, TokenRequestBody};
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let tokens = Policy::per_hour(1_000).name("tokens").build()?;
    /// let layer = TokenBudgetLayer::builder(store.clone(), TokenBudget::tokens(tokens.clone()).build()?, Global)
    ///     .estimate(Estimate::fixed(300))
    ///     .build();
    /// let upstream = tower::service_fn(|_: Request<TokenRequestBody<Full<Bytes>>>| async {
    ///     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("a long answer"))))
    /// });
    /// let request = Request::new(Full::new(Bytes::new()));
    /// let response = layer.layer(upstream).oneshot(request).await?;
    /// // Dropped unread (the client went away), with no usage reported:
    /// // settled at the estimate.
    /// drop(response.into_body());
    /// let left = store.peek("global", &[tokens]).await?.decisions()[0].remaining();
    /// assert_eq!(left, 700);
    /// # Ok(()) }
    /// ```
    pub struct TokenBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, watch: Option<Watch> },
        Own { data: Option<Bytes> },
    }
}

impl<B> TokenBody<B> {
    pub(crate) fn inner(body: B, watch: Option<Watch>) -> Self {
        Self {
            kind: Kind::Inner { body, watch },
        }
    }

    pub(crate) fn own(data: Bytes) -> Self {
        Self {
            kind: Kind::Own {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> fmt::Debug for TokenBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBody")
            .field("own", &matches!(self.kind, Kind::Own { .. }))
            .finish()
    }
}

impl<B: Body<Data = Bytes>> Body for TokenBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Own { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { body, watch } => {
                let polled = body.poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(watch) = watch {
                            if let Some(data) = frame.data_ref() {
                                watch.reader.data(data);
                            } else if let Some(trailers) = frame.trailers_ref() {
                                watch.reader.headers(trailers);
                            }
                        }
                    }
                    // The end, or a failure: settled now (`Watch::drop`).
                    Poll::Ready(_) => drop(watch.take()),
                    Poll::Pending => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Own { data } => data.is_none(),
            Kind::Inner { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Own { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Inner { body, .. } => body.size_hint(),
        }
    }
}
