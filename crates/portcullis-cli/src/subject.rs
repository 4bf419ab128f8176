//! How a subject given on the command line becomes the key the service's
//! layer checks: by running the layer's own key extractors (`ApiKey`,
//! `BearerToken`, `Header`, `PeerIp`) on a request that carries it, so
//! the mapping cannot drift from the service's. The store then encodes
//! that key (`portcullis::subject::encode_subject`) as it always does.

use std::net::IpAddr;

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use portcullis::tower::{ApiKey, BearerToken, Header, KeyExtractor, PeerIp};

use crate::args::{SubjectArgs, SubjectKind};
use crate::failure::Failure;

/// The longest subject accepted, in bytes: more than any HTTP server
/// accepts in a header, and bounded so a mistaken paste is refused
/// rather than hashed.
pub(crate) const MAX_SUBJECT_BYTES: usize = 64 * 1024;

/// The header an operator's `--as header` value is placed in: the name is
/// not part of the key, only the value.
const HEADER: HeaderName = HeaderName::from_static("x-portcullis-subject");

/// A subject as the layer keys it.
#[derive(Debug, Clone)]
pub(crate) struct LayerKey {
    /// The key the layer passes to the store.
    pub(crate) key: String,
    /// Whether the subject given was a secret (an API key, a token): it
    /// is then never printed.
    pub(crate) secret: bool,
    /// The subject as given (read from stdin for `-`).
    pub(crate) given: String,
}

/// One line of stdin, without its line ending: a subject kept out of the
/// shell's history and the process list. Reads at most one byte more than
/// a subject may hold.
fn read_stdin_line() -> Result<String, Failure> {
    use std::io::{BufRead as _, Read as _};
    let limit = u64::try_from(MAX_SUBJECT_BYTES)
        .unwrap_or(u64::MAX)
        .saturating_add(3);
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .take(limit)
        .read_line(&mut line)
        .map_err(|error| {
            Failure::usage(format!(
                "cannot read the subject from stdin (`-`): {error}; give one line of UTF-8 text"
            ))
        })?;
    if line.ends_with('\n') {
        line.pop();
        if line.ends_with('\r') {
            line.pop();
        }
    }
    Ok(line)
}

/// The layer's key for the subject in `args`.
pub(crate) fn layer_key(args: &SubjectArgs) -> Result<LayerKey, Failure> {
    let from_stdin;
    let raw = if args.subject == "-" {
        from_stdin = read_stdin_line()?;
        from_stdin.as_str()
    } else {
        args.subject.as_str()
    };
    if raw.len() > MAX_SUBJECT_BYTES {
        return Err(Failure::usage(format!(
            "the subject is {} bytes; at most {MAX_SUBJECT_BYTES} are accepted: check what was pasted",
            raw.len()
        )));
    }
    if raw.is_empty() {
        return Err(Failure::usage(
            "the subject is empty: the layer never checks an empty key; give the key, API key, token, header value or IP address",
        ));
    }
    let secret = matches!(args.kind, SubjectKind::ApiKey | SubjectKind::Bearer);
    let key = match args.kind {
        SubjectKind::Key => Some(raw.to_owned()),
        SubjectKind::ApiKey => {
            let header = ApiKey::header(HEADER);
            header.extract(&with_header(HEADER, header_value(raw, "an API key")?))
        }
        SubjectKind::Bearer => {
            let value = header_value(&format!("Bearer {raw}"), "a bearer token")?;
            BearerToken::new().extract(&with_header(AUTHORIZATION, value))
        }
        SubjectKind::Header => {
            Header::new(HEADER).extract(&with_header(HEADER, header_value(raw, "a header value")?))
        }
        SubjectKind::Ip => {
            let ip = parse_ip(raw)?;
            let (mut parts, ()) = http::Request::new(()).into_parts();
            parts.extensions.insert(ip);
            PeerIp::new()
                .ipv4_prefix(args.ipv4_prefix)
                .ipv6_prefix(args.ipv6_prefix)
                .extract(&parts)
        }
    };
    match key {
        Some(key) => Ok(LayerKey {
            key,
            secret,
            given: raw.to_owned(),
        }),
        None => Err(Failure::usage(
            "the layer keys no request with this subject (only blanks?): give the value the client sends",
        )),
    }
}

/// `raw` as a header value, or why a client could not send it.
fn header_value(raw: &str, what: &str) -> Result<HeaderValue, Failure> {
    HeaderValue::from_str(raw).map_err(|_| {
        Failure::usage(format!(
            "{what} cannot hold control characters such as newlines: no client can send it in a header; check what was pasted"
        ))
    })
}

fn with_header(name: HeaderName, value: HeaderValue) -> http::request::Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.headers.insert(name, value);
    parts
}

/// An IP address, also written `[v6]`, or with a port (`1.2.3.4:5678`,
/// `[::1]:80`) as logs show peers.
fn parse_ip(raw: &str) -> Result<IpAddr, Failure> {
    let trimmed = raw.trim();
    trimmed
        .parse::<IpAddr>()
        .ok()
        .or_else(|| trimmed.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            trimmed
                .strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inner| inner.parse().ok())
        })
        .ok_or_else(|| {
            Failure::usage(
                "with --as ip the subject is an IPv4 or IPv6 address (a port may follow); it does not parse as one",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis::subject::hash_subject;

    fn key(kind: SubjectKind, subject: &str) -> Result<String, Failure> {
        layer_key(&SubjectArgs {
            subject: subject.to_owned(),
            kind,
            ipv4_prefix: 32,
            ipv6_prefix: 56,
        })
        .map(|k| k.key)
    }

    #[test]
    fn secrets_are_hashed_as_the_extractors_hash_them() {
        assert_eq!(
            key(SubjectKind::ApiKey, " k-1 ").unwrap(),
            hash_subject(b"k-1")
        );
        assert_eq!(
            key(SubjectKind::Bearer, "tok").unwrap(),
            hash_subject(b"tok")
        );
        assert_eq!(key(SubjectKind::Header, "acme").unwrap(), "acme");
        assert_eq!(
            key(SubjectKind::Header, "a b").unwrap(),
            hash_subject(b"a b")
        );
        assert_eq!(key(SubjectKind::Key, "a b").unwrap(), "a b");
    }

    #[test]
    fn addresses_are_grouped_as_the_layer_groups_them() {
        assert_eq!(key(SubjectKind::Ip, "203.0.113.7").unwrap(), "203.0.113.7");
        assert_eq!(
            key(SubjectKind::Ip, "203.0.113.7:443").unwrap(),
            "203.0.113.7"
        );
        assert_eq!(
            key(SubjectKind::Ip, "::ffff:203.0.113.7").unwrap(),
            "203.0.113.7"
        );
        assert_eq!(
            key(SubjectKind::Ip, "2001:db8:1:2ff:3::1").unwrap(),
            "2001:db8:1:200::/56"
        );
        assert_eq!(
            key(SubjectKind::Ip, "[2001:db8::1]:80").unwrap(),
            "2001:db8::/56"
        );
        assert!(key(SubjectKind::Ip, "not-an-ip").is_err());
    }

    #[test]
    fn odd_subjects_are_refused_with_a_reason() {
        assert!(key(SubjectKind::Key, "").is_err());
        assert!(key(SubjectKind::ApiKey, "   ").is_err());
        let newline = key(SubjectKind::ApiKey, "k\n1").unwrap_err().to_string();
        assert!(newline.contains("control characters"), "{newline}");
        let huge = key(SubjectKind::Key, &"x".repeat(MAX_SUBJECT_BYTES + 1)).unwrap_err();
        assert!(huge.to_string().contains("at most"), "{huge}");
        // Up to the bound, any text is a key (the store hashes it).
        assert!(key(SubjectKind::Key, &"é}{".repeat(1000)).is_ok());
    }
}
