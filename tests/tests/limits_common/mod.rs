//! Helpers shared by the limits tests (a module, not a test target): a
//! policy by name and limit, the `x-customer` key, and a service that
//! answers with the request's `RateLimitInfo` in headers.
#![allow(dead_code)] // each test binary uses a different subset

use std::convert::Infallible;

use http::{HeaderName, Request, Response};
use portcullis::tower::{Header, KeyExtractor, RateLimitInfo, RateLimitLayer};
use portcullis::{MemoryStore, Policy};
use tower::{service_fn, Layer, Service};

pub(crate) type Answer = Response<String>;

pub(crate) fn policy(name: &str, limit: u64) -> Policy {
    Policy::per_minute(limit).name(name).build().expect("valid")
}

pub(crate) fn customer() -> Header {
    Header::new(HeaderName::from_static("x-customer"))
}

/// A service answering with the request's `RateLimitInfo` summarised in
/// headers: its tier, source, limits version and policy names.
pub(crate) fn service<K: KeyExtractor>(
    layer: &RateLimitLayer<MemoryStore, K>,
) -> impl Service<
    Request<()>,
    Response = Response<portcullis::tower::RateLimitBody<String>>,
    Error = Infallible,
    Future: Send,
>
       + Clone
       + Send
       + 'static
       + use<K> {
    layer.layer(service_fn(|request: Request<()>| async move {
        let mut response = Response::new(String::new());
        if let Some(info) = request.extensions().get::<RateLimitInfo>() {
            let names: Vec<&str> = info.policies().iter().map(Policy::name).collect();
            let headers = response.headers_mut();
            headers.insert("x-tier", info.tier().parse().unwrap());
            headers.insert("x-source", info.source().as_str().parse().unwrap());
            headers.insert(
                "x-version",
                info.limits_version()
                    .unwrap_or(0)
                    .to_string()
                    .parse()
                    .unwrap(),
            );
            headers.insert("x-policies", names.join(",").parse().unwrap());
        }
        Ok::<Answer, Infallible>(response)
    }))
}

pub(crate) fn request(customer: &str) -> Request<()> {
    Request::get("/")
        .header("x-customer", customer)
        .body(())
        .unwrap()
}

pub(crate) fn header<B>(response: &Response<B>, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}
