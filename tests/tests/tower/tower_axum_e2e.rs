//! End to end: a real Axum server on 127.0.0.1 with the rate-limit layer,
//! driven by reqwest, with the memory store and with Redis.

use std::net::SocketAddr;

use axum::routing::get;
use axum::{Extension, Router};
use portcullis::redis::RedisStore;
use portcullis::tower::{ClientIp, KeyExtractor, RateLimitInfo, RateLimitLayer};
use portcullis::{MemoryStore, Policy, Store};
use portcullis_tests::{redis_url, unique_prefix};

async fn redis_store(tag: &str) -> RedisStore {
    RedisStore::builder()
        .url(redis_url())
        .prefix(unique_prefix(&format!("e2e-{tag}")))
        .build()
        .await
        .unwrap()
}

async fn serve<St: Store, K: KeyExtractor>(layer: RateLimitLayer<St, K>) -> SocketAddr {
    async fn handler(Extension(info): Extension<RateLimitInfo>) -> String {
        info.key().to_owned()
    }
    let app = Router::new().route("/", get(handler)).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

fn sf_item_params(value: &str) -> Vec<(String, i64)> {
    let list = sfv::Parser::new(value)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{value:?}: {e}"));
    assert_eq!(list.len(), 1, "{value}");
    let sfv::ListEntry::Item(item) = &list[0] else {
        panic!("{value} is not an item list")
    };
    assert_eq!(item.bare_item.as_string().unwrap().as_str(), "e2e");
    item.params
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), i64::from(v.as_integer().unwrap())))
        .collect()
}

/// The peer (127.0.0.1) is not a trusted proxy: whatever X-Forwarded-For it
/// sends, all its requests count against its own address.
async fn spoofed_forwarded_for_does_not_change_the_key<St: Store>(store: St) {
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(3).name("e2e").build().unwrap())
        .key(ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let addr = serve(layer).await;
    let client = reqwest::Client::new();
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let response = client
            .get(format!("http://{addr}/"))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let rate = response.headers()["ratelimit"].to_str().unwrap().to_owned();
        let params = sf_item_params(&rate);
        assert_eq!(params[0], ("r".to_owned(), remaining), "{rate}");
        assert!(params[1].0 == "t" && params[1].1 > 0, "{rate}");
        let policy = response.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            sf_item_params(&policy),
            vec![("q".to_owned(), 3), ("w".to_owned(), 60)]
        );
        assert_eq!(response.text().await.unwrap(), "127.0.0.1");
    }
    let response = client
        .get(format!("http://{addr}/"))
        .header("x-forwarded-for", "203.0.113.99")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&retry_after), "{retry_after}");
    let params = sf_item_params(response.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(params[0], ("r".to_owned(), 0));
    assert_eq!(params[1].1, i64::try_from(retry_after).unwrap());
    assert!(response
        .text()
        .await
        .unwrap()
        .contains("rate limit \"e2e\" exceeded"));
}

/// When the peer is a trusted proxy, the header names the client.
async fn trusted_proxy_header_sets_the_key<St: Store>(store: St) {
    let layer = RateLimitLayer::builder(store)
        .policy(Policy::per_minute(1).name("e2e").build().unwrap())
        .key(ClientIp::trusting(["127.0.0.1/32".parse().unwrap()]))
        .info_in_extensions(true)
        .build()
        .unwrap();
    let addr = serve(layer).await;
    let client = reqwest::Client::new();
    let get = |client_ip: &'static str| {
        client
            .get(format!("http://{addr}/"))
            .header("x-forwarded-for", format!("{client_ip}, 127.0.0.1"))
            .send()
    };
    let first = get("203.0.113.1").await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.text().await.unwrap(), "203.0.113.1");
    assert_eq!(get("203.0.113.1").await.unwrap().status(), 429);
    let other = get("203.0.113.2").await.unwrap();
    assert_eq!(other.status(), 200);
    assert_eq!(other.text().await.unwrap(), "203.0.113.2");
}

#[tokio::test]
async fn memory_spoofed_forwarded_for_does_not_change_the_key() {
    spoofed_forwarded_for_does_not_change_the_key(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_spoofed_forwarded_for_does_not_change_the_key() {
    spoofed_forwarded_for_does_not_change_the_key(redis_store("spoof").await).await;
}

#[tokio::test]
async fn memory_trusted_proxy_header_sets_the_key() {
    trusted_proxy_header_sets_the_key(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_trusted_proxy_header_sets_the_key() {
    trusted_proxy_header_sets_the_key(redis_store("proxy").await).await;
}

/// Two server instances with one Redis share one limit.
#[tokio::test]
async fn redis_two_instances_share_one_limit() {
    let prefix = unique_prefix("e2e-shared");
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder()
            .url(redis_url())
            .prefix(prefix.clone())
            .build()
            .await
            .unwrap();
        let layer = RateLimitLayer::builder(store)
            .policy(Policy::per_minute(4).name("e2e").build().unwrap())
            .key(ClientIp::trusting([]))
            .info_in_extensions(true)
            .build()
            .unwrap();
        addrs.push(serve(layer).await);
    }
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for i in 0..6 {
        let addr = addrs[i % 2];
        statuses.push(
            client
                .get(format!("http://{addr}/"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
}
