//! The response body: the inner service's, or the layer's own short body.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response from [`RateLimit`](crate::RateLimit): the inner
    /// service's body for forwarded requests, or a short body the layer
    /// wrote itself (a limited, rejected or failed request).
    ///
    /// It is an [`http_body::Body`] with `Data = Bytes` and the inner body's
    /// error, so Axum, Tonic and Hyper accept it as they accept the inner
    /// body.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Own { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
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

impl<B: From<Bytes>> ResponseBody<B> {
    /// The body as the inner service's body type: the inner body itself,
    /// or the layer's own bytes through `B::from` (what
    /// [`KeepBodyLayer`](crate::KeepBodyLayer) does to every response).
    ///
    /// ```
    /// use axum::body::Body;
    /// use portcullis::tower::RateLimitBody;
    ///
    /// # fn unwrap(body: RateLimitBody<Body>) -> Body {
    /// body.into_body()
    /// # }
    /// ```
    pub fn into_body(self) -> B {
        match self.kind {
            Kind::Inner { body } => body,
            Kind::Own { data } => B::from(data.unwrap_or_default()),
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
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
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Own { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Own { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Own { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn own_body_yields_its_bytes_once() {
        let body =
            ResponseBody::<http_body_util::Empty<Bytes>>::own(Bytes::from_static(b"slow down"));
        assert_eq!(body.size_hint().exact(), Some(9));
        assert!(!body.is_end_stream());
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected, "slow down");
        let empty = ResponseBody::<http_body_util::Empty<Bytes>>::own(Bytes::new());
        assert!(empty.is_end_stream());
    }

    #[tokio::test]
    async fn into_body_keeps_the_inner_body_and_converts_the_own_one() {
        let inner = ResponseBody::inner(http_body_util::Full::new(Bytes::from_static(b"hi")));
        let inner: http_body_util::Full<Bytes> = inner.into_body();
        assert_eq!(inner.collect().await.unwrap().to_bytes(), "hi");
        let own = ResponseBody::<http_body_util::Full<Bytes>>::own(Bytes::from_static(b"429"));
        assert_eq!(own.into_body().collect().await.unwrap().to_bytes(), "429");
        let empty = ResponseBody::<http_body_util::Full<Bytes>>::own(Bytes::new());
        assert!(empty.into_body().is_end_stream());
    }

    #[tokio::test]
    async fn inner_body_passes_through() {
        let body = ResponseBody::inner(http_body_util::Full::new(Bytes::from_static(b"hello")));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    }
}
