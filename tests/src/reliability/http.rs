//! The scenarios' load over real HTTP: a layered service served by Hyper on
//! 127.0.0.1, and a client that is itself a `Service<Request<()>>`, so the
//! load generators and [`classify`](super::classify) work unchanged.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::{Service, ServiceExt};

/// Serves `service` (a layer over [`probe_service`](super::probe_service),
/// taking `Request<()>`) over HTTP/1 on a free port of 127.0.0.1, until the
/// runtime ends; returns the address.
///
/// # Panics
///
/// When no port can be bound.
pub async fn serve_http<S, B>(service: S) -> SocketAddr
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port on 127.0.0.1");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _peer)) = listener.accept().await else {
                continue;
            };
            let service = service.clone();
            let per_connection = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (parts, _body) = request.into_parts();
                service.clone().oneshot(Request::from_parts(parts, ()))
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), per_connection)
                    .await;
            });
        }
    });
    addr
}

/// A client for the server at `addr`, as a service: sends each request's
/// method, path and headers, reads the whole answer, and returns its
/// status and headers (a connection error becomes status 599, which
/// [`classify`](super::classify) counts as an unexpected status).
pub fn http_client(
    addr: SocketAddr,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + Sync
       + 'static {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    tower::service_fn(move |request: Request<()>| {
        let client = client.clone();
        async move {
            let (mut parts, ()) = request.into_parts();
            let path = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            parts.uri = format!("http://{addr}{path}").parse().unwrap_or_default();
            let answer = match client
                .request(Request::from_parts(parts, Empty::new()))
                .await
            {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let _ = body.collect().await;
                    Response::from_parts(parts, String::new())
                }
                Err(error) => {
                    let mut response = Response::new(error.to_string());
                    *response.status_mut() =
                        StatusCode::from_u16(599).unwrap_or(StatusCode::BAD_GATEWAY);
                    response
                }
            };
            Ok::<_, Infallible>(answer)
        }
    })
}
