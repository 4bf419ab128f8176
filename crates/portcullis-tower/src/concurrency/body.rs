//! [`ResponseBody`], the response body of the concurrency layer: it holds
//! the request's permit until the body is done.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::permit::Permit;

pin_project! {
    /// The body of a response from
    /// [`ConcurrencyLimit`](crate::ConcurrencyLimit): the inner service's
    /// body, holding the request's permit until the body has been sent in
    /// full, has failed, or is dropped; or a short body the layer wrote
    /// itself (a limited or rejected request).
    ///
    /// It is an [`http_body::Body`] with `Data = Bytes` and the inner body's
    /// error, so Axum, Tonic and Hyper accept it as they accept the inner
    /// body.
    ///
    /// ```
    /// // Also add: cargo add tower --features util && cargo add http-body-util
    /// use std::convert::Infallible;
    /// use axum::body::Bytes;
    /// use axum::http::{Request, Response};
    /// use http_body_util::{BodyExt, Full};
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
    /// let service = layer.layer(tower::service_fn(|_: Request<Full<Bytes>>| async {
    ///     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("report"))))
    /// }));
    /// let response = service.clone().oneshot(Request::new(Full::default())).await?;
    /// // Reading the body to its end releases the permit.
    /// let body = response.into_body().collect().await?.to_bytes();
    /// assert_eq!(&body[..], b"report");
    /// let next = service.oneshot(Request::new(Full::default())).await?;
    /// assert_eq!(next.status(), axum::http::StatusCode::OK);
    /// # Ok(()) }
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, permit: Option<Permit> },
        Own { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, permit: Option<Permit>) -> Self {
        Self {
            kind: Kind::Inner { body, permit },
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

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { permit, .. } => f
                .debug_struct("ResponseBody::Inner")
                .field("permit", permit)
                .finish_non_exhaustive(),
            Kind::Own { data } => f.debug_tuple("ResponseBody::Own").field(data).finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, permit } => {
                let frame = body.poll_frame(cx);
                // The body is done (or failed): the request no longer runs.
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
                    drop(permit.take());
                }
                frame
            }
            KindProj::Own { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Own { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Own { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}
