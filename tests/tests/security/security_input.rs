//! Bad input at the edge: property tests (the CI-run equivalent of a fuzz
//! target) feeding arbitrary bytes, huge values, non-UTF-8, IPv6 zones and
//! IPv4-mapped forms to the header parsers and key extractors
//! (`Forwarded`, `X-Forwarded-For`, `Authorization`, API-key and named
//! headers, tuples and fallbacks). Nothing panics; each extractor yields a
//! safe key (plain, or a hash) or none, and the layer then applies the
//! configured missing-key behaviour.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use http::{HeaderName, HeaderValue, Request, StatusCode};
use portcullis_core::subject::{hash_subject, is_plain};
use portcullis_core::{MemoryStore, Policy};
use portcullis_tests::reliability::{classify, probe_service, Reply};
use portcullis_tower::{
    ApiKey, BearerToken, ClientIp, Header, KeyExtractor, MissingKey, PeerIp, ProxyHeader,
    RateLimitLayer,
};
use proptest::prelude::*;
use tower::{Layer, ServiceExt};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

/// One extractor's key is safe when it is a plain subject or a
/// `#`-prefixed SHA-256: bounded, no braces, spaces or control bytes. (A
/// plain subject may contain `,`: a header value of `,` is a safe key.)
fn is_safe_subject(key: &str) -> bool {
    is_plain(key)
        || (key.len() == 65
            && key.starts_with('#')
            && key[1..].bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A combined key is safe when every `,`-separated part is a safe subject
/// (a combination hashes any part that contains `,`).
fn is_safe_key(key: &str) -> bool {
    !key.is_empty() && key.split(',').all(is_safe_subject)
}

/// The case proptest once found: a named header of `,` is a plain key of
/// its own, and a combination hashes it, so it cannot split a combined key.
#[test]
fn a_comma_is_a_plain_key_alone_and_hashed_in_a_combination() {
    let parts = parts(None, &[("x-api-key", b"k"), ("x-tenant", b",")]);
    let tenant = Header::new(HeaderName::from_static("x-tenant"));
    assert_eq!(tenant.extract(&parts).as_deref(), Some(","));
    let combined = (ApiKey::new(), tenant).extract(&parts).unwrap();
    // The API key's own `#` hash is not plain either, so it is hashed again.
    let api_key = hash_subject(b"k");
    assert_eq!(
        combined,
        format!(
            "{},{}",
            hash_subject(api_key.as_bytes()),
            hash_subject(b",")
        )
    );
    assert!(is_safe_key(&combined));
}

fn trusting() -> ClientIp {
    ClientIp::trusting(["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()])
}

/// One hop of a forwarding header: addresses in every spelling, with
/// ports, brackets, zones, mapped forms, quotes, parameters and junk.
fn hop() -> impl Strategy<Value = String> {
    let v4 = any::<[u8; 4]>().prop_map(|o| IpAddr::from(o).to_string());
    let v6 = any::<u128>().prop_map(|n| IpAddr::from(n.to_be_bytes()).to_string());
    let trusted_v4 = any::<[u8; 3]>().prop_map(|o| format!("10.{}.{}.{}", o[0], o[1], o[2]));
    prop_oneof![
        v4.clone(),
        v6.clone(),
        trusted_v4,
        (v4.clone(), any::<u16>()).prop_map(|(ip, port)| format!("{ip}:{port}")),
        (v6.clone(), any::<u16>()).prop_map(|(ip, port)| format!("[{ip}]:{port}")),
        v6.clone().prop_map(|ip| format!("[{ip}]")),
        (v6.clone(), "[a-z0-9%]{0,8}").prop_map(|(ip, zone)| format!("{ip}%{zone}")),
        ("fe80::[0-9a-f]{1,4}", "[a-z0-9]{1,6}")
            .prop_map(|(ip, zone)| format!("[{ip}%25{zone}]:80")),
        any::<[u8; 4]>().prop_map(|o| format!("::ffff:{}.{}.{}.{}", o[0], o[1], o[2], o[3])),
        any::<[u8; 4]>().prop_map(|o| format!("[::ffff:{}.{}.{}.{}]:443", o[0], o[1], o[2], o[3])),
        v4.prop_map(|ip| format!("for={ip}")),
        v6.clone()
            .prop_map(|ip| format!("for=\"[{ip}]:1\";proto=https;by=x")),
        v6.prop_map(|ip| format!("For=\"[{ip}\"")),
        Just("unknown".to_owned()),
        Just("for=_hidden".to_owned()),
        Just("for=\"unterminated".to_owned()),
        Just("for=\"esc\\\"aped\"".to_owned()),
        "[ -~]{0,24}",
    ]
}

/// A whole header value: hops joined by commas or semicolons, or raw bytes.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(hop(), 0..6).prop_map(|hops| hops.join(", ").into_bytes()),
        1 => prop::collection::vec(hop(), 0..6).prop_map(|hops| hops.join(";").into_bytes()),
        2 => prop::collection::vec(any::<u8>(), 0..300),
        1 => prop::collection::vec(128u8..=255, 0..64),
    ]
}

fn peer() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|o| SocketAddr::from((o, 1234))),
        any::<[u8; 3]>().prop_map(|o| SocketAddr::from(([10, o[0], o[1], o[2]], 1234))),
        any::<u128>().prop_map(|n| SocketAddr::from((n.to_be_bytes(), 1234))),
        any::<[u8; 4]>().prop_map(|o| {
            let mapped = std::net::Ipv4Addr::from(o).to_ipv6_mapped();
            SocketAddr::from((mapped, 1234))
        }),
    ]
}

/// Builds request parts with `headers`; header values the `http` crate
/// refuses (control bytes) are dropped, as a server would refuse them.
fn parts(peer: Option<SocketAddr>, headers: &[(&str, &[u8])]) -> http::request::Parts {
    let mut builder = Request::get("/");
    if let Some(peer) = peer {
        builder = builder.extension(peer);
    }
    let (mut parts, ()) = builder.body(()).unwrap().into_parts();
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            parts
                .headers
                .append(HeaderName::from_bytes(name.as_bytes()).unwrap(), value);
        }
    }
    parts
}

fn grouped(ip: IpAddr) -> String {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let net = std::net::Ipv6Addr::from(u128::from(v6) & (u128::MAX << 72));
            format!("{net}/56")
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Forwarding headers never panic the client-IP extractor; an untrusted
    /// peer's headers are ignored, a trusted peer's walk ends on an address.
    #[test]
    fn forwarding_headers(peer in peer(), xff in header_bytes(), fwd in header_bytes(), xff2 in header_bytes()) {
        let parts = parts(Some(peer), &[("x-forwarded-for", &xff), ("forwarded", &fwd), ("x-forwarded-for", &xff2)]);
        for header in [ProxyHeader::XForwardedFor, ProxyHeader::Forwarded] {
            let extractor = trusting().header(header);
            let key = extractor.extract(&parts);
            let key = key.expect("a request with a peer always has a client address");
            prop_assert!(is_safe_subject(&key), "unsafe key {key:?}");
            let peer_ip = match peer.ip() {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer.ip(), IpAddr::V4),
                v4 => v4,
            };
            let trusted = match peer_ip {
                IpAddr::V4(v4) => v4.octets()[0] == 10,
                IpAddr::V6(v6) => v6.octets()[0] == 0xfd,
            };
            if !trusted {
                prop_assert_eq!(&key, &grouped(peer.ip()), "an untrusted peer's headers must not change its key");
            }
            // The key is an address or a network, nothing else.
            let address = key.split('/').next().unwrap();
            prop_assert!(address.parse::<IpAddr>().is_ok(), "{key:?} is not an address");
        }
        prop_assert_eq!(PeerIp::new().extract(&parts), Some(grouped(peer.ip())));
    }

    /// Credentials and named headers: arbitrary bytes give a hashed key or
    /// none, never the secret itself.
    #[test]
    fn credential_and_named_headers(auth in header_bytes(), api in header_bytes(), named in header_bytes(), scheme in "(Bearer|bearer|BEARER|Basic|Token| Bearer|Bearer\t)") {
        let mut authorization = scheme.into_bytes();
        authorization.push(b' ');
        authorization.extend_from_slice(&auth);
        let parts = parts(None, &[("authorization", &authorization), ("x-api-key", &api), ("x-tenant", &named)]);
        let present = |name: &str| parts.headers.get(name).map(HeaderValue::as_bytes);

        let bearer = BearerToken::new().extract(&parts);
        if let Some(key) = &bearer {
            prop_assert!(is_safe_subject(key) && key.starts_with('#'));
            let value = present("authorization").unwrap();
            prop_assert!(value[..6].eq_ignore_ascii_case(b"bearer"));
            prop_assert_eq!(key, &hash_subject(value[6..].trim_ascii()));
        } else if let Some(value) = present("authorization") {
            let is_bearer = value.len() > 7
                && value[..6].eq_ignore_ascii_case(b"bearer")
                && matches!(value[6], b' ' | b'\t')
                && !value[7..].trim_ascii().is_empty();
            prop_assert!(!is_bearer, "a bearer token was not recognised: {value:?}");
        }

        let api_key = ApiKey::new().extract(&parts);
        match (present("x-api-key").map(<[u8]>::trim_ascii), &api_key) {
            (Some(value), Some(key)) if !value.is_empty() => prop_assert_eq!(key, &hash_subject(value)),
            (Some(value), None) => prop_assert!(value.is_empty()),
            (None, None) => {}
            (value, key) => prop_assert!(false, "api key {value:?} gave {key:?}"),
        }

        let tenant = Header::new(HeaderName::from_static("x-tenant")).extract(&parts);
        if let Some(key) = &tenant {
            prop_assert!(is_safe_subject(key), "unsafe key {key:?}");
        }
        // Combinations stay safe and unambiguous.
        if let Some(key) = (BearerToken::new(), ApiKey::new(), Header::new(HeaderName::from_static("x-tenant"))).extract(&parts) {
            prop_assert!(is_safe_key(&key), "unsafe key {key:?}");
        }
        let chained = BearerToken::new().or(ApiKey::new()).extract(&parts);
        prop_assert_eq!(chained, bearer.or(api_key));
    }

    /// Through the layer: a request without a key gets the configured
    /// missing-key behaviour, one with a key is decided.
    #[test]
    fn layer_applies_the_missing_key_behaviour(auth in prop::option::of(header_bytes())) {
        let headers: Vec<(&str, &[u8])> = auth.as_deref().map(|a| ("authorization", a)).into_iter().collect();
        let key = BearerToken::new().extract(&parts(None, &headers));
        for (missing, expected) in [
            (MissingKey::default(), Reply::Other(400)),
            (MissingKey::Skip, Reply::Passed),
            (MissingKey::fallback("anonymous"), Reply::Admitted),
        ] {
            let layer = RateLimitLayer::builder(MemoryStore::new())
                .policy(Policy::per_minute(100).name("input").build().unwrap())
                .key(BearerToken::new())
                .on_missing_key(missing)
                .build()
                .unwrap();
            let service = layer.layer(probe_service());
            let mut request = Request::get("/").body(()).unwrap();
            for (name, value) in &headers {
                if let Ok(value) = HeaderValue::from_bytes(value) {
                    request.headers_mut().append(*name, value);
                }
            }
            let response = runtime().block_on(service.oneshot(request)).unwrap();
            let reply = classify(&response);
            if key.is_some() {
                prop_assert_eq!(reply, Reply::Admitted);
            } else {
                prop_assert_eq!(reply, expected);
            }
        }
    }
}

/// Huge values (1 MB) in every header: a bounded key or none, quickly.
#[test]
fn huge_header_values() {
    let huge_text = "1.2.3.4, ".repeat(110_000).into_bytes();
    let pool = b"abc{} \t\xff,;=\"[";
    let huge_junk: Vec<u8> = (0..1_048_576usize).map(|i| pool[i % pool.len()]).collect();
    let huge_token = [b"Bearer ".as_slice(), &vec![b'x'; 1 << 20]].concat();
    for value in [&huge_text, &huge_junk, &huge_token] {
        let parts = parts(
            Some("10.0.0.1:1".parse().unwrap()),
            &[
                ("x-forwarded-for", value),
                ("forwarded", value),
                ("authorization", value),
                ("x-api-key", value),
                ("x-tenant", value),
            ],
        );
        for key in [
            trusting().extract(&parts),
            trusting().header(ProxyHeader::Forwarded).extract(&parts),
            BearerToken::new().extract(&parts),
            ApiKey::new().extract(&parts),
            Header::new(HeaderName::from_static("x-tenant")).extract(&parts),
        ]
        .into_iter()
        .flatten()
        {
            assert!(is_safe_subject(&key), "unsafe key of {} bytes", key.len());
            assert!(
                key.len() <= 65,
                "a key from a 1 MB header is bounded: {} bytes",
                key.len()
            );
        }
    }
}

/// Zones and mapped forms parse the way the documentation says.
#[test]
fn ipv6_zones_and_mapped_addresses() {
    let proxy: SocketAddr = "10.0.0.1:1".parse().unwrap();
    let case =
        |xff: &str| trusting().extract(&parts(Some(proxy), &[("x-forwarded-for", xff.as_bytes())]));
    // A zone is not an address: the walk stops at the last good hop.
    assert_eq!(case("fe80::1%eth0").as_deref(), Some("10.0.0.1"));
    assert_eq!(
        case("203.0.113.5, fe80::1%eth0").as_deref(),
        Some("10.0.0.1")
    );
    assert_eq!(case("[fe80::1%25eth0]:80").as_deref(), Some("10.0.0.1"));
    // Mapped addresses count as IPv4, as peer and as hop.
    assert_eq!(case("::ffff:203.0.113.5").as_deref(), Some("203.0.113.5"));
    assert_eq!(
        case("[::ffff:203.0.113.5]:443").as_deref(),
        Some("203.0.113.5")
    );
    assert_eq!(case("::ffff:10.9.9.9").as_deref(), Some("10.9.9.9"));
    let mapped_peer: SocketAddr = "[::ffff:198.51.100.7]:9".parse().unwrap();
    assert_eq!(
        trusting()
            .extract(&parts(
                Some(mapped_peer),
                &[("x-forwarded-for", b"1.1.1.1")]
            ))
            .as_deref(),
        Some("198.51.100.7")
    );
    assert_eq!(
        PeerIp::new()
            .extract(&parts(Some(mapped_peer), &[]))
            .as_deref(),
        Some("198.51.100.7")
    );
    // A mapped trusted proxy is still trusted.
    let mapped_proxy: SocketAddr = "[::ffff:10.0.0.1]:9".parse().unwrap();
    assert_eq!(
        trusting()
            .extract(&parts(
                Some(mapped_proxy),
                &[("x-forwarded-for", b"192.0.2.1")]
            ))
            .as_deref(),
        Some("192.0.2.1")
    );
}

/// Requests the layer cannot key are answered, not failed: 400 by
/// default with a body saying why.
#[test]
fn missing_key_default_is_a_clear_400() {
    let layer = RateLimitLayer::builder(MemoryStore::new())
        .policy(Policy::per_minute(1).build().unwrap())
        .build()
        .unwrap();
    let service = layer.layer(probe_service());
    let response = runtime()
        .block_on(service.oneshot(Request::get("/").body(()).unwrap()))
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}
