//! End to end: a plain Hyper server whose service is wrapped in the
//! rate-limit layer (the connection's peer address is put in the request
//! extensions), called by Hyper's client, with both stores.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use portcullis::redis::RedisStore;
use portcullis::tower::RateLimitLayer;
use portcullis::{MemoryStore, Policy, Store};
use portcullis_tests::redis_url;
use tower::{Layer, ServiceExt};

async fn serve<St: Store>(store: St) -> SocketAddr {
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(2).name("hyper").build().unwrap())
        .legacy_headers(true)
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(|_req: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = service.clone();
            let per_connection =
                hyper::service::service_fn(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(peer);
                    service.clone().oneshot(request)
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

async fn limits_a_plain_hyper_server<St: Store>(store: St) {
    let addr = serve(store).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = || client.get(format!("http://{addr}/").parse().unwrap());
    for remaining in ["1", "0"] {
        let response = get().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-ratelimit-limit"], "2");
        assert_eq!(response.headers()["x-ratelimit-remaining"], remaining);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "hello");
    }
    let response = get().await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after));
    let rate = response.headers()["ratelimit"].to_str().unwrap().to_owned();
    let list = sfv::Parser::new(&rate).parse::<sfv::List>().unwrap();
    assert_eq!(list.len(), 1);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("rate limit \"hyper\" exceeded"));
}

#[tokio::test]
async fn memory_limits_a_plain_hyper_server() {
    limits_a_plain_hyper_server(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_limits_a_plain_hyper_server() {
    let store = RedisStore::builder()
        .url(redis_url())
        .prefix(portcullis_tests::unique_prefix("e2e-hyper"))
        .build()
        .await
        .unwrap();
    limits_a_plain_hyper_server(store).await;
}
