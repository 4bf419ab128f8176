//! Stacked layers: every layer's policies reach the client. An outer layer
//! appends its members to the `RateLimit` / `RateLimit-Policy` lists an
//! inner layer wrote; the values are parsed back with `sfv`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use portcullis_core::{MemoryStore, Policy};
use portcullis_tower::RateLimitLayer;
use tower::{service_fn, Layer, Service, ServiceExt};

/// One member of a `RateLimit` or `RateLimit-Policy` list.
#[derive(Debug, PartialEq)]
struct Member {
    name: String,
    params: Vec<(String, i64)>,
}

fn members(headers: &HeaderMap, name: &str) -> Vec<Member> {
    let lines: Vec<_> = headers.get_all(name).iter().collect();
    assert_eq!(lines.len(), 1, "{name} is one field line: {lines:?}");
    let list = sfv::Parser::new(lines[0].to_str().unwrap())
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{name}: {:?} is not a list: {e}", lines[0]));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => Member {
                name: item.bare_item.as_string().unwrap().as_str().to_owned(),
                params: item
                    .params
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), i64::from(v.as_integer().unwrap())))
                    .collect(),
            },
            sfv::ListEntry::InnerList(inner) => panic!("unexpected inner list {inner:?}"),
        })
        .collect()
}

fn names(members: &[Member]) -> Vec<&str> {
    members.iter().map(|m| m.name.as_str()).collect()
}

fn param(member: &Member, key: &str) -> i64 {
    member
        .params
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{member:?} has no {key}"))
        .1
}

fn layer(policy: Policy) -> RateLimitLayer<MemoryStore> {
    RateLimitLayer::new(MemoryStore::new(), policy)
}

fn request() -> Request<()> {
    let peer: SocketAddr = "192.0.2.7:4711".parse().unwrap();
    Request::get("/").extension(peer).body(()).unwrap()
}

fn handler() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

#[tokio::test]
async fn two_layers_list_both_policies() {
    let inner = layer(Policy::per_minute(100).name("per-user").build().unwrap());
    let outer = layer(Policy::per_second(10).name("free-second").build().unwrap());
    let service = outer.layer(inner.layer(handler()));

    let response = service.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let rate = members(response.headers(), "ratelimit");
    assert_eq!(names(&rate), ["per-user", "free-second"]);
    assert_eq!(param(&rate[0], "r"), 99);
    assert_eq!(param(&rate[1], "r"), 9);
    let policy = members(response.headers(), "ratelimit-policy");
    assert_eq!(names(&policy), ["per-user", "free-second"]);
    assert_eq!([param(&policy[0], "q"), param(&policy[0], "w")], [100, 60]);
    assert_eq!([param(&policy[1], "q"), param(&policy[1], "w")], [10, 1]);
    assert!(response.headers().get("retry-after").is_none());
}

#[tokio::test]
async fn three_layers_list_every_policy_innermost_first() {
    let user = layer(Policy::per_minute(100).name("per-user").build().unwrap());
    let day = layer(Policy::per_day(1000).name("free-day").build().unwrap());
    let second = layer(Policy::per_second(10).name("free-second").build().unwrap());
    let service = second.layer(day.layer(user.layer(handler())));

    for remaining in [9, 8, 7] {
        let response = service.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let rate = members(response.headers(), "ratelimit");
        assert_eq!(names(&rate), ["per-user", "free-day", "free-second"]);
        assert_eq!(param(&rate[0], "r"), 90 + remaining);
        assert_eq!(param(&rate[1], "r"), 990 + remaining);
        assert_eq!(param(&rate[2], "r"), remaining);
        let policy = members(response.headers(), "ratelimit-policy");
        assert_eq!(names(&policy), ["per-user", "free-day", "free-second"]);
        assert_eq!(param(&policy[1], "w"), 86_400);
    }
}

#[tokio::test]
async fn an_inner_denial_carries_the_outer_policies_and_its_retry_after() {
    let inner = layer(Policy::per_minute(1).name("per-user").build().unwrap());
    let middle = layer(Policy::per_day(1000).name("free-day").build().unwrap());
    let outer = layer(Policy::per_second(10).name("free-second").build().unwrap());
    let service = outer.layer(middle.layer(inner.layer(handler())));

    assert_eq!(
        service.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    let denied = service.oneshot(request()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let rate = members(denied.headers(), "ratelimit");
    assert_eq!(names(&rate), ["per-user", "free-day", "free-second"]);
    assert_eq!(param(&rate[0], "r"), 0);
    assert_eq!(param(&rate[2], "r"), 8);
    // The outer layers admitted (and charged) the request, so the inner
    // layer's Retry-After is the one that stands.
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(
        names(&members(denied.headers(), "ratelimit-policy")),
        ["per-user", "free-day", "free-second"]
    );
}

#[tokio::test]
async fn an_outer_denial_has_only_the_outer_policy() {
    let inner = layer(Policy::per_minute(100).name("per-user").build().unwrap());
    let outer = layer(
        Policy::per(1, Duration::from_secs(30))
            .name("free-burst")
            .build()
            .unwrap(),
    );
    let service = outer.layer(inner.layer(handler()));
    service.clone().oneshot(request()).await.unwrap();
    let denied = service.oneshot(request()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        names(&members(denied.headers(), "ratelimit")),
        ["free-burst"]
    );
    assert_eq!(denied.headers()["retry-after"], "30");
}
