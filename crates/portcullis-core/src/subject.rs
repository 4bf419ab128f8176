//! How a subject becomes the text a store keys it by: plain subjects stay
//! readable, anything else (long, secret, or with characters a Redis
//! Cluster hash tag or a log line would misread) becomes a SHA-256 hash.
//! Stores do this themselves; a custom key extractor uses [`hash_subject`]
//! for a secret it reads (as the built-in token extractors do), and
//! [`encode_subject`] shows the key a subject is stored under.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

/// Longest subject stored as it is; longer subjects are hashed.
pub const MAX_PLAIN_SUBJECT_LEN: usize = 128;

/// Prefix of a hashed subject. `#` never appears in a plain subject, so a
/// hashed subject cannot collide with a plain one.
pub const HASHED_SUBJECT_PREFIX: &str = "#";

/// Maps a subject to the key stores use for it.
///
/// A subject of 1 to [`MAX_PLAIN_SUBJECT_LEN`] bytes made only of ASCII
/// letters, digits and `. _ - : / @ + = ,` stays as it is (so IPv4 and IPv6
/// addresses, user ids and e-mail addresses stay readable in `redis-cli`).
/// Anything else, including empty, long, non-ASCII subjects and subjects with
/// braces, spaces, `#` or control characters, becomes `#` followed by the
/// hex SHA-256 of its bytes: bounded in length, safe inside a Redis Cluster
/// hash tag, and never equal to another subject's key. Pass `hash_always` for
/// secrets such as API tokens.
///
/// ```
/// use portcullis::subject::encode_subject;
///
/// assert_eq!(encode_subject("2001:db8::1", false), "2001:db8::1");
/// let hashed = encode_subject("evil}{key with spaces", false);
/// assert!(hashed.starts_with('#') && hashed.len() == 65);
/// assert_ne!(encode_subject("user-1", true), "user-1");
/// ```
#[must_use]
pub fn encode_subject(subject: &str, hash_always: bool) -> Cow<'_, str> {
    if !hash_always && is_plain(subject) {
        Cow::Borrowed(subject)
    } else {
        Cow::Owned(hash_subject(subject.as_bytes()))
    }
}

/// Whether [`encode_subject`] keeps `subject` as it is.
#[must_use]
#[inline]
pub fn is_plain(subject: &str) -> bool {
    // A table lookup per byte: the memory store runs this on every check.
    !subject.is_empty()
        && subject.len() <= MAX_PLAIN_SUBJECT_LEN
        && subject.bytes().all(|b| PLAIN_BYTES[usize::from(b)])
}

/// The bytes a plain subject may hold: ASCII letters, digits and
/// `. _ - : / @ + = ,`.
const PLAIN_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        // `byte < 256`, so the cast is exact.
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'.' | b'_' | b'-' | b':' | b'/' | b'@' | b'+' | b'=' | b','
            );
        byte += 1;
    }
    table
};

/// `#` followed by the lowercase hex SHA-256 of `bytes`.
#[must_use]
pub fn hash_subject(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(HASHED_SUBJECT_PREFIX.len() + 64);
    out.push_str(HASHED_SUBJECT_PREFIX);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_subjects_are_the_documented_characters_up_to_the_length_cap() {
        for c in (0..=0x7f_u8).map(char::from).chain(['é', '€', '🦀']) {
            let documented = c.is_ascii_alphanumeric() || ".-_:/@+=,".contains(c);
            assert_eq!(is_plain(&c.to_string()), documented, "{c:?}");
            assert_eq!(is_plain(&format!("a{c}b")), documented, "{c:?}");
        }
        for (len, plain) in [
            (0, false),
            (1, true),
            (128, true),
            (129, false),
            (1000, false),
        ] {
            assert_eq!(is_plain(&"x".repeat(len)), plain, "{len}");
        }
    }

    #[test]
    fn hashed_subjects_are_the_lowercase_hex_sha256() {
        // FIPS 180-2 test vectors.
        assert_eq!(
            hash_subject(b""),
            "#e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hash_subject(b"abc"),
            "#ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
