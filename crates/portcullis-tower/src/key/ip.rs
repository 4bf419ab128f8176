//! Keys from IP addresses: the connection's peer address ([`PeerIp`]),
//! and how an address becomes a key (IPv6 grouped by prefix, IPv4-mapped
//! addresses unwrapped, written without allocating), which `ClientIp`
//! (`client_ip.rs`, above this file) shares.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use arrayvec::ArrayString;

use super::buf::KeyBuf;
use super::extractor::KeyExtractor;
use super::head::RequestHead;

/// The peer address of the connection, as the server recorded it in the
/// request extensions: Axum's `ConnectInfo<SocketAddr>` (feature `axum`),
/// Tonic's `TcpConnectInfo` (feature `tonic`), or a plain [`SocketAddr`] or
/// [`IpAddr`] that a Hyper server inserted.
pub(crate) fn peer_ip(request: &RequestHead<'_>) -> Option<IpAddr> {
    let ext = request.extensions();
    #[cfg(feature = "axum")]
    if let Some(info) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = ext
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
    {
        return Some(addr.ip());
    }
    ext.get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| ext.get::<IpAddr>().copied())
}

/// How addresses become keys: IPv6 grouped by prefix, IPv4 by prefix
/// (whole address by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Grouping {
    pub(super) v4_prefix: u8,
    pub(super) v6_prefix: u8,
}

impl Default for Grouping {
    fn default() -> Self {
        Self {
            v4_prefix: 32,
            v6_prefix: 56,
        }
    }
}

impl Grouping {
    /// Writes the key of `ip` into `out`: no `String`, and for a whole IPv4
    /// address (the default) no `core::fmt` either.
    pub(super) fn write_key(self, ip: IpAddr, out: &mut KeyBuf) {
        match ip.to_canonical() {
            IpAddr::V4(v4) if self.v4_prefix >= 32 => push_ipv4(v4, out),
            IpAddr::V4(v4) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.v4_prefix))
                    .unwrap_or(0);
                push_ipv4(Ipv4Addr::from(u32::from(v4) & mask), out);
                push_prefix_len(self.v4_prefix, out);
            }
            // Writing to a `KeyBuf` cannot fail.
            IpAddr::V6(v6) if self.v6_prefix >= 128 => {
                let _ = write!(out, "{v6}");
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.v6_prefix))
                    .unwrap_or(0);
                let _ = write!(out, "{}", Ipv6Addr::from(u128::from(v6) & mask));
                push_prefix_len(self.v6_prefix, out);
            }
        }
    }
}

/// `a.b.c.d`, as `Ipv4Addr`'s `Display` writes it: each octet's digits
/// from a table, straight into `out` when it is inline with room (else
/// into a stack buffer, then one copy): no `core::fmt`, no per-digit
/// division. `Ipv4Addr`'s own `Display` goes through `core::fmt`, which
/// costs several times this on every request.
#[inline]
fn push_ipv4(ip: Ipv4Addr, out: &mut KeyBuf) {
    const LONGEST: usize = "255.255.255.255".len();
    match out.inline_with_room(LONGEST) {
        Some(inline) => write_ipv4(ip, inline),
        None => {
            let mut text = ArrayString::<LONGEST>::new();
            write_ipv4(ip, &mut text);
            out.push_str(&text);
        }
    }
}

/// `a.b.c.d` appended to `text`, which has room for 15 bytes more.
#[inline]
fn write_ipv4<const N: usize>(ip: Ipv4Addr, text: &mut ArrayString<N>) {
    // Pushed char by char: turning a byte buffer into a `str` would check
    // it for UTF-8, which costs more than these pushes.
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            let _ = text.try_push('.');
        }
        let [digits @ .., count] = OCTET_TEXT[usize::from(octet)];
        for &digit in digits.iter().take(usize::from(count)) {
            let _ = text.try_push(char::from(digit));
        }
    }
}

/// For every octet value: its decimal digits, left-aligned in three bytes,
/// and how many there are.
static OCTET_TEXT: [[u8; 4]; 256] = {
    let mut table = [[0u8; 4]; 256];
    let mut n = 0;
    while n < 256 {
        // `n < 256`, so each digit fits a `u8`.
        #[allow(clippy::cast_possible_truncation)]
        let (hundreds, tens, ones) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        table[n] = if n >= 100 {
            [b'0' + hundreds, b'0' + tens, b'0' + ones, 3]
        } else if n >= 10 {
            [b'0' + tens, b'0' + ones, 0, 2]
        } else {
            [b'0' + ones, 0, 0, 1]
        };
        n += 1;
    }
    table
};

/// `/bits`.
fn push_prefix_len(bits: u8, out: &mut KeyBuf) {
    let mut text = ArrayString::<4>::new();
    let _ = text.try_push('/');
    push_decimal(bits, &mut text);
    out.push_str(&text);
}

/// `n` in decimal. The callers' buffers have room for every octet (15
/// bytes for an address, 4 for `/bits`), so no push fails.
fn push_decimal<const N: usize>(n: u8, text: &mut ArrayString<N>) {
    let digit = |d: u8| char::from(b'0' + d);
    if n >= 100 {
        let _ = text.try_push(digit(n / 100));
    }
    if n >= 10 {
        let _ = text.try_push(digit(n / 10 % 10));
    }
    let _ = text.try_push(digit(n % 10));
}

/// Keys on the IP address of the connection's peer.
///
/// Reads the address the server put in the request extensions: Axum's
/// `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`, feature `axum`),
/// Tonic's `TcpConnectInfo` (feature `tonic`), or a [`SocketAddr`] or
/// [`IpAddr`] a Hyper server inserted itself. Without one the request has no
/// key.
///
/// IPv6 clients usually own a whole prefix, so IPv6 addresses are grouped by
/// their first 56 bits (one key per `/56`; change with
/// [`PeerIp::ipv6_prefix`]). IPv4-mapped IPv6 addresses count as the IPv4
/// address. Behind a reverse proxy every request comes from the proxy: use
/// [`ClientIp`](crate::ClientIp) there.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::http::Request;
/// use portcullis::tower::{KeyExtractor, PeerIp};
///
/// let peer: SocketAddr = "[2001:db8:aa:bbcc::1]:4711".parse().unwrap();
/// let request = Request::get("/").extension(peer).body(()).unwrap();
/// assert_eq!(PeerIp::new().extract(&request).as_deref(), Some("2001:db8:aa:bb00::/56"));
/// assert_eq!(
///     PeerIp::new().ipv6_prefix(128).extract(&request).as_deref(),
///     Some("2001:db8:aa:bbcc::1")
/// );
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp {
    grouping: Grouping,
}

impl PeerIp {
    /// Keys on the peer address, IPv6 grouped by `/56`.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Groups IPv6 addresses by their first `bits` bits (at most 128: one
    /// key per address).
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.grouping.v6_prefix = bits.min(128);
        self
    }

    /// Groups IPv4 addresses by their first `bits` bits (default and at most
    /// 32: one key per address).
    #[must_use]
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.grouping.v4_prefix = bits.min(32);
        self
    }
}

/// Why a request may have no peer address, for the operator's log.
pub(super) const NO_PEER_HINT: &str = "the request had no peer address: serve Axum with `app.into_make_service_with_connect_info::<SocketAddr>()`, or insert the peer's SocketAddr (or axum's ConnectInfo) into the request extensions before this layer; or choose MissingKey::Skip or MissingKey::fallback";

impl KeyExtractor for PeerIp {
    fn extract_into(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> bool {
        match peer_ip(request) {
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

#[cfg(test)]
mod tests {
    use super::*;

    impl Grouping {
        fn key(self, ip: IpAddr) -> String {
            let mut key = KeyBuf::new();
            self.write_key(ip, &mut key);
            assert!(key.is_inline(), "{key}: an IP key fits inline");
            key.into_string()
        }
    }

    #[test]
    fn grouping_masks_and_unwraps() {
        let g = Grouping::default();
        assert_eq!(g.key("192.0.2.1".parse().unwrap()), "192.0.2.1");
        assert_eq!(g.key("::ffff:192.0.2.1".parse().unwrap()), "192.0.2.1");
        assert_eq!(
            g.key("2001:db8:1:2ff:1::1".parse().unwrap()),
            "2001:db8:1:200::/56"
        );
        let g = Grouping {
            v4_prefix: 24,
            v6_prefix: 0,
        };
        assert_eq!(g.key("192.0.2.77".parse().unwrap()), "192.0.2.0/24");
        assert_eq!(g.key("2001:db8::1".parse().unwrap()), "::/0");
        let g = Grouping {
            v4_prefix: 0,
            v6_prefix: 64,
        };
        assert_eq!(g.key("192.0.2.77".parse().unwrap()), "0.0.0.0/0");
    }

    #[test]
    fn ipv4_keys_are_written_as_display_writes_them() {
        for ip in [
            Ipv4Addr::new(0, 0, 0, 0),
            Ipv4Addr::new(192, 0, 2, 1),
            Ipv4Addr::new(10, 99, 100, 255),
            Ipv4Addr::new(255, 255, 255, 255),
            Ipv4Addr::new(1, 20, 203, 9),
        ] {
            let mut key = KeyBuf::new();
            push_ipv4(ip, &mut key);
            assert_eq!(key.as_str(), ip.to_string());
        }
        let widest = Grouping {
            v4_prefix: 32,
            v6_prefix: 128,
        };
        let ip: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe".parse().unwrap();
        assert_eq!(widest.key(ip), ip.to_string());
    }

    #[test]
    fn decimals_are_every_octet() {
        for n in 0..=255u8 {
            let mut text = ArrayString::<3>::new();
            push_decimal(n, &mut text);
            assert_eq!(text.as_str(), n.to_string());
            // And every table entry, in each position of an address.
            let ip = Ipv4Addr::new(n, 255 - n, n / 2, n);
            let mut key = KeyBuf::new();
            push_ipv4(ip, &mut key);
            assert_eq!(key.as_str(), ip.to_string());
        }
    }

    proptest::proptest! {
        #[test]
        fn every_ipv4_key_is_its_display_form(bits: u32, prefix in 0u8..=32) {
            let ip = Ipv4Addr::from(bits);
            let g = Grouping { v4_prefix: prefix, v6_prefix: 56 };
            let expected = if prefix == 32 {
                ip.to_string()
            } else {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                format!("{}/{prefix}", Ipv4Addr::from(bits & mask))
            };
            proptest::prop_assert_eq!(g.key(IpAddr::V4(ip)), expected);
        }
    }
}
