//! Live limits read through each thread's view of the compiled set: a
//! change is seen by the next request on the same thread, every layer sees
//! its own limits however many a thread serves (more than it keeps views
//! for), and a layer made after another was dropped never sees the old
//! one's limits. The layers here take the straight path (`.limits(..)`
//! and nothing a request brings but its key), and the tests run on one
//! thread, so every request goes through the same thread's views.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use portcullis_core::{LimitSet, Limits, MemoryStore, Policy};
use portcullis_tower::RateLimitLayer;
use tower::{service_fn, Layer, ServiceExt};

fn policy(name: &str, per_minute: u32) -> Policy {
    Policy::per_minute(u64::from(per_minute))
        .name(name)
        .build()
        .unwrap()
}

fn request(last_octet: u8) -> Request<()> {
    let peer = SocketAddr::from(([192, 0, 2, last_octet], 4711));
    Request::get("/").extension(peer).body(()).unwrap()
}

async fn hello(_: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hi"))))
}

/// The `RateLimit-Policy` value and status of one request through `layer`.
async fn ask(layer: &RateLimitLayer<MemoryStore>, client: u8) -> (StatusCode, String) {
    let response = layer
        .layer(service_fn(hello))
        .oneshot(request(client))
        .await
        .unwrap();
    let policy = response
        .headers()
        .get("ratelimit-policy")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (response.status(), policy)
}

fn layer_over(limits: &Limits) -> RateLimitLayer<MemoryStore> {
    RateLimitLayer::builder(MemoryStore::new())
        .limits(limits.clone())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_change_is_seen_by_the_next_request_on_the_same_thread() {
    let limits = Limits::new(LimitSet::of([policy("wide", 100)]).unwrap());
    let layer = layer_over(&limits);
    assert_eq!(
        ask(&layer, 1).await,
        (StatusCode::OK, "\"wide\";q=100;w=60".into())
    );

    limits.replace(LimitSet::of([policy("narrow", 1)]).unwrap());
    assert_eq!(
        ask(&layer, 1).await,
        (StatusCode::OK, "\"narrow\";q=1;w=60".into())
    );
    assert_eq!(ask(&layer, 1).await.0, StatusCode::TOO_MANY_REQUESTS);

    // An override for one subject, then its removal.
    limits
        .update(|set| set.override_policies("192.0.2.2", [policy("own", 3)]))
        .unwrap();
    assert_eq!(
        ask(&layer, 2).await,
        (StatusCode::OK, "\"own\";q=3;w=60".into())
    );
    assert_eq!(
        ask(&layer, 3).await,
        (StatusCode::OK, "\"narrow\";q=1;w=60".into())
    );
    limits.replace(LimitSet::of([policy("wide", 100)]).unwrap());
    assert_eq!(
        ask(&layer, 2).await,
        (StatusCode::OK, "\"wide\";q=100;w=60".into())
    );
}

#[tokio::test(flavor = "current_thread")]
async fn every_layer_sees_its_own_limits_however_many_a_thread_serves() {
    // More layers than a thread keeps views for, asked in turn, so views
    // are replaced while the layers change their limits.
    let all: Vec<(Limits, RateLimitLayer<MemoryStore>)> = (0..7u32)
        .map(|i| {
            let limits = Limits::new(LimitSet::of([policy(&format!("layer{i}"), 10 + i)]).unwrap());
            let layer = layer_over(&limits);
            (limits, layer)
        })
        .collect();
    for round in 0..3u32 {
        for (i, (limits, layer)) in (0u32..).zip(&all) {
            let expected = format!("\"layer{i}-{round}\";q={};w=60", 20 + i + round);
            limits.replace(
                LimitSet::of([policy(&format!("layer{i}-{round}"), 20 + i + round)]).unwrap(),
            );
            let (status, seen) = ask(layer, 1).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(seen, expected, "layer {i}, round {round}");
        }
    }

    // Layers dropped and new ones made: each new layer sees its own limits,
    // never a dropped layer's view.
    drop(all);
    for i in 0..7u32 {
        let limits = Limits::new(LimitSet::of([policy(&format!("new{i}"), 50 + i)]).unwrap());
        let layer = layer_over(&limits);
        let (status, seen) = ask(&layer, 1).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(seen, format!("\"new{i}\";q={};w=60", 50 + i));
    }
}
