//! Keys from the client behind trusted proxies ([`ClientIp`]): the walk of
//! `X-Forwarded-For` or `Forwarded` from the right past the proxies on an
//! allow-list, bounded, and the parsing of their elements. The address
//! becomes a key as [`PeerIp`](super::PeerIp)'s does (`ip.rs`).

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use ipnet::IpNet;

use super::buf::KeyBuf;
use super::extractor::KeyExtractor;
use super::head::RequestHead;
use super::ip::{peer_ip, Grouping, NO_PEER_HINT};

/// Most proxy hops [`ClientIp`] walks past before it stops trusting a header.
const MAX_HOPS: usize = 64;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Which header a trusted proxy writes the client's address to.
///
/// ```
/// use portcullis::tower::{ClientIp, ProxyHeader};
///
/// let behind_envoy = ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]).header(ProxyHeader::Forwarded);
/// # let _ = behind_envoy;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, most load
    /// balancers). The default.
    #[default]
    XForwardedFor,
    /// The standard `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// Keys on the client's IP address behind reverse proxies you trust.
///
/// The connection's peer is the nearest proxy. If its address is in one of
/// the trusted networks, the proxy header (`X-Forwarded-For` by default, or
/// `Forwarded`) is walked from the right, past every hop inside the trusted
/// networks; the first address outside them is the client. A peer outside
/// the trusted networks is the client itself and its headers are ignored,
/// so a client cannot pick its own key by sending a forged header. A hop
/// that does not parse (`unknown`, an obfuscated name, garbage) ends the
/// walk at the last address that did; a trusted peer that sent no header is
/// the client itself. At most 64 hops are walked.
///
/// Trust only the header your proxy *writes*: a proxy that appends to
/// `X-Forwarded-For` passes a client's own `Forwarded` header through
/// untouched.
///
/// Addresses are grouped like [`PeerIp`](crate::PeerIp) (IPv6 by `/56`).
///
/// ```
/// use std::net::SocketAddr;
/// use axum::http::Request;
/// use portcullis::tower::{ClientIp, KeyExtractor};
///
/// let extractor = ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]);
///
/// // Through the load balancer at 10.0.0.2: the client is 203.0.113.7
/// // (the left-most entry is what the client sent and is not trusted).
/// let via_proxy: SocketAddr = "10.0.0.2:5000".parse().unwrap();
/// let request = Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.9")
///     .extension(via_proxy)
///     .body(())
///     .unwrap();
/// assert_eq!(extractor.extract(&request).as_deref(), Some("203.0.113.7"));
///
/// // Straight from the internet: the header is ignored.
/// let direct: SocketAddr = "198.51.100.1:5000".parse().unwrap();
/// let request = Request::get("/")
///     .header("x-forwarded-for", "1.2.3.4")
///     .extension(direct)
///     .body(())
///     .unwrap();
/// assert_eq!(extractor.extract(&request).as_deref(), Some("198.51.100.1"));
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: ProxyHeader,
    grouping: Grouping,
}

impl ClientIp {
    /// Trusts proxies in the given networks. A single address is a network
    /// too: `"10.1.2.3/32".parse()`, or `IpNet::from(addr)`.
    #[must_use]
    pub fn trusting(networks: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            trusted: networks.into_iter().map(|net| net.trunc()).collect(),
            header: ProxyHeader::default(),
            grouping: Grouping::default(),
        }
    }

    /// Reads this header instead of `X-Forwarded-For`.
    #[must_use]
    pub fn header(mut self, header: ProxyHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 addresses by their first `bits` bits (default 56, at most
    /// 128).
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.grouping.v6_prefix = bits.min(128);
        self
    }

    /// Groups IPv4 addresses by their first `bits` bits (default and at most
    /// 32).
    #[must_use]
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.grouping.v4_prefix = bits.min(32);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address, or `None` without a peer address.
    fn client(&self, request: &RequestHead<'_>) -> Option<IpAddr> {
        let peer = peer_ip(request)?.to_canonical();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let mut client = peer;
        let header_name: &HeaderName = match self.header {
            ProxyHeader::XForwardedFor => &X_FORWARDED_FOR,
            ProxyHeader::Forwarded => &FORWARDED,
        };
        let mut hops = 0;
        // Header lines in reverse, and each line's entries from the right.
        for line in request.headers().get_all(header_name).iter().rev() {
            let Ok(line) = line.to_str() else {
                return Some(client);
            };
            let stopped = match self.header {
                ProxyHeader::XForwardedFor => self.walk(
                    &mut client,
                    &mut hops,
                    line.rsplit(',').map(|entry| parse_node(entry.trim())),
                ),
                ProxyHeader::Forwarded => self.walk(
                    &mut client,
                    &mut hops,
                    forwarded_elements(line)
                        .into_iter()
                        .rev()
                        .map(|entry| forwarded_for(entry).and_then(|n| parse_node(&n))),
                ),
            };
            if stopped {
                return Some(client);
            }
        }
        Some(client)
    }

    /// Walks one header line's hops, rightmost first, moving `client` to
    /// each; `true` when the walk stops (an unparsable hop, an untrusted
    /// one, or [`MAX_HOPS`] reached).
    fn walk(
        &self,
        client: &mut IpAddr,
        hops: &mut usize,
        line: impl Iterator<Item = Option<IpAddr>>,
    ) -> bool {
        for hop in line {
            *hops += 1;
            let Some(hop) = hop else {
                return true;
            };
            let hop = hop.to_canonical();
            *client = hop;
            if !self.is_trusted(hop) || *hops >= MAX_HOPS {
                return true;
            }
        }
        false
    }
}

impl KeyExtractor for ClientIp {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        match self.client(request) {
            Some(ip) => {
                self.grouping.write_key(ip, key);
                true
            }
            None => false,
        }
    }

    fn describe(&self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("the client's network address")
    }

    fn missing_hint(&self) -> Option<&'static str> {
        Some(NO_PEER_HINT)
    }
}

/// Parses a node: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:80`.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    let inner = node.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// Splits a `Forwarded` line into its comma-separated elements, respecting
/// quoted strings.
fn forwarded_elements(line: &str) -> Vec<&str> {
    let mut elements = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, byte) in line.bytes().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        match byte {
            b'\\' if in_quotes => escaped = true,
            b'"' => in_quotes = !in_quotes,
            b',' if !in_quotes => {
                elements.push(&line[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    elements.push(&line[start..]);
    elements
}

/// The unquoted value of the `for` parameter of one `Forwarded` element
/// (borrowed unless it holds escapes).
fn forwarded_for(element: &str) -> Option<Cow<'_, str>> {
    let mut rest = element;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        if rest.is_empty() {
            return None;
        }
        let eq = rest.find('=')?;
        let name = rest[..eq].trim();
        let after = &rest[eq + 1..];
        let (value, tail) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find(['"', '\\']) {
                // No escape before the closing quote: the text up to it.
                Some(end) if quoted.as_bytes()[end] == b'"' => {
                    (Cow::Borrowed(&quoted[..end]), &quoted[end + 1..])
                }
                _ => {
                    let mut value = String::new();
                    let mut chars = quoted.char_indices();
                    let mut end = None;
                    while let Some((i, c)) = chars.next() {
                        match c {
                            '\\' => value.push(chars.next()?.1),
                            '"' => {
                                end = Some(i + 1);
                                break;
                            }
                            c => value.push(c),
                        }
                    }
                    (Cow::Owned(value), &quoted[end?..])
                }
            }
        } else {
            let end = after.find(';').unwrap_or(after.len());
            (Cow::Borrowed(after[..end].trim()), &after[end..])
        };
        if name.eq_ignore_ascii_case("for") {
            return Some(value);
        }
        rest = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::request::Parts;
    use http::Request;
    use std::net::Ipv4Addr;

    use crate::key::PeerIp;

    fn parts_from(peer: &str, headers: &[(&str, &[u8])]) -> Parts {
        let mut builder = Request::get("/");
        for (name, value) in headers {
            builder = builder.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        let peer: SocketAddr = peer.parse().unwrap();
        builder.extension(peer).body(()).unwrap().into_parts().0
    }

    fn trusted() -> ClientIp {
        ClientIp::trusting([
            "10.0.0.0/8".parse().unwrap(),
            "2001:db8:ffff::/48".parse().unwrap(),
        ])
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let parts = parts_from("203.0.113.9:1", &[("x-forwarded-for", b"1.1.1.1")]);
        assert_eq!(trusted().extract(&parts).as_deref(), Some("203.0.113.9"));
    }

    #[test]
    fn walks_from_the_right_past_trusted_hops() {
        let parts = parts_from(
            "10.0.0.1:1",
            &[
                ("x-forwarded-for", b"9.9.9.9, 198.51.100.4"),
                ("x-forwarded-for", b"10.2.2.2,10.3.3.3"),
            ],
        );
        assert_eq!(trusted().extract(&parts).as_deref(), Some("198.51.100.4"));
    }

    #[test]
    fn all_trusted_uses_the_left_most_hop() {
        let parts = parts_from("10.0.0.1:1", &[("x-forwarded-for", b"10.9.9.9, 10.2.2.2")]);
        assert_eq!(trusted().extract(&parts).as_deref(), Some("10.9.9.9"));
        let parts = parts_from("10.0.0.1:1", &[]);
        assert_eq!(trusted().extract(&parts).as_deref(), Some("10.0.0.1"));
    }

    #[test]
    fn garbage_stops_at_the_last_good_hop() {
        for bad in [
            &b"unknown"[..],
            b"",
            b"1.2.3",
            b"\xff\xfe",
            b"::::::",
            b"[::1",
        ] {
            let parts = parts_from("10.0.0.1:1", &[("x-forwarded-for", bad)]);
            assert_eq!(
                trusted().extract(&parts).as_deref(),
                Some("10.0.0.1"),
                "{bad:?}"
            );
        }
        let parts = parts_from("10.0.0.1:1", &[("x-forwarded-for", b"garbage, 10.0.0.7")]);
        assert_eq!(trusted().extract(&parts).as_deref(), Some("10.0.0.7"));
    }

    #[test]
    fn ports_brackets_and_mapped_addresses() {
        let parts = parts_from(
            "[::ffff:10.0.0.1]:1",
            &[("x-forwarded-for", b"[2001:db8::1]:443, 198.51.100.4:80")],
        );
        assert_eq!(trusted().extract(&parts).as_deref(), Some("198.51.100.4"));
        let parts = parts_from(
            "10.0.0.1:1",
            &[("x-forwarded-for", b"2001:db8::1, ::ffff:10.1.1.1")],
        );
        assert_eq!(trusted().extract(&parts).as_deref(), Some("2001:db8::/56"));
    }

    #[test]
    fn forwarded_header() {
        let extractor = trusted().header(ProxyHeader::Forwarded);
        let parts = parts_from(
            "10.0.0.1:1",
            &[(
                "forwarded",
                b"for=6.6.6.6, For=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.1.1.1;by=\"a,b\"",
            )],
        );
        assert_eq!(
            extractor.extract(&parts).as_deref(),
            Some("2001:db8:cafe::/56")
        );
        let parts = parts_from(
            "10.0.0.1:1",
            &[("forwarded", b"proto=http;for=192.0.2.60;by=10.0.0.1")],
        );
        assert_eq!(extractor.extract(&parts).as_deref(), Some("192.0.2.60"));
        // X-Forwarded-For is not read when Forwarded is chosen.
        let parts = parts_from("10.0.0.1:1", &[("x-forwarded-for", b"192.0.2.1")]);
        assert_eq!(extractor.extract(&parts).as_deref(), Some("10.0.0.1"));
        for bad in [
            &b"for=unknown"[..],
            b"for=_hidden",
            b"for=\"unterminated",
            b"proto=http",
            b"=;=;",
            b"for",
        ] {
            let parts = parts_from("10.0.0.1:1", &[("forwarded", bad)]);
            assert_eq!(
                extractor.extract(&parts).as_deref(),
                Some("10.0.0.1"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn hop_walk_is_bounded() {
        let long = vec!["10.1.1.1"; 10_000].join(",");
        let parts = parts_from("10.0.0.1:1", &[("x-forwarded-for", long.as_bytes())]);
        assert_eq!(trusted().extract(&parts).as_deref(), Some("10.1.1.1"));
    }

    #[test]
    fn no_peer_no_key() {
        let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        assert_eq!(PeerIp::new().extract(&parts), None);
        assert_eq!(trusted().extract(&parts), None);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_header_bytes(bytes in proptest::collection::vec(32u8..=255, 0..200)) {
            let Ok(value) = http::HeaderValue::from_bytes(&bytes) else { return Ok(()); };
            for header in [ProxyHeader::XForwardedFor, ProxyHeader::Forwarded] {
                let name = match header { ProxyHeader::XForwardedFor => "x-forwarded-for", ProxyHeader::Forwarded => "forwarded" };
                let (mut parts, ()) = Request::get("/").extension("10.0.0.1:9".parse::<SocketAddr>().unwrap()).body(()).unwrap().into_parts();
                parts.headers.insert(name, value.clone());
                let key = trusted().header(header).extract(&parts);
                proptest::prop_assert!(key.is_some());
            }
        }

        #[test]
        fn client_from_untrusted_peer_is_the_peer(a in proptest::prelude::any::<[u8; 4]>(), xff in "[0-9., a-f:]{0,40}") {
            let peer = Ipv4Addr::from(a);
            proptest::prop_assume!(peer.octets()[0] != 10);
            let Ok(value) = http::HeaderValue::from_str(&xff) else { return Ok(()); };
            let (mut parts, ()) = Request::get("/").extension(SocketAddr::new(peer.into(), 1)).body(()).unwrap().into_parts();
            parts.headers.insert("x-forwarded-for", value);
            proptest::prop_assert_eq!(trusted().extract(&parts), Some(peer.to_string()));
        }
    }
}
