//! A subject's key: as looked up ([`Key`], on the stack: a short
//! subject's bytes or the digest of a long one) and as a shard stores it
//! ([`StoredKey`], inline up to [`INLINE_KEY`] bytes). A leaf.

use sha2::{Digest, Sha256};

use crate::subject::MAX_PLAIN_SUBJECT_LEN;

/// The first byte of a hashed subject's key: never a byte of UTF-8.
pub(super) const HASHED_KEY_TAG: u8 = 0xFF;
/// Longest key stored inside the entry.
pub(super) const INLINE_KEY: usize = 22;

/// A subject as stored: its bytes when it is at most
/// [`MAX_PLAIN_SUBJECT_LEN`] long, or the byte `0xFF` and its SHA-256 digest
/// (raw, not hex: `0xFF` never occurs in UTF-8, so the two never collide).
/// Built on the stack: looking a subject up allocates nothing.
pub(super) enum Key<'a> {
    Raw(&'a [u8]),
    Hashed([u8; 33]),
}

impl<'a> Key<'a> {
    #[inline(always)]
    pub(super) fn new(subject: &'a str) -> Self {
        if subject.len() <= MAX_PLAIN_SUBJECT_LEN {
            Self::Raw(subject.as_bytes())
        } else {
            Self::Hashed(Self::hashed(subject))
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn hashed(subject: &str) -> [u8; 33] {
        let mut key = [0; 33];
        key[0] = HASHED_KEY_TAG;
        key[1..].copy_from_slice(&Sha256::digest(subject.as_bytes()));
        key
    }

    #[inline(always)]
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Raw(key) => key,
            Self::Hashed(key) => key,
        }
    }
}

/// A subject as a shard stores it: up to [`INLINE_KEY`] bytes inside the
/// entry (user ids, IPv4 addresses, short e-mail addresses), longer keys
/// (and the 33-byte form of hashed subjects) on the heap. 24 bytes.
pub(super) enum StoredKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl StoredKey {
    pub(super) fn new(key: &[u8]) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..key.len()].copy_from_slice(key);
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(key.into()),
        }
    }

    #[inline(always)]
    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or(&[]),
            Self::Heap(bytes) => bytes,
        }
    }

    /// Whether this is `key`. An inline key is compared by a few
    /// overlapping word loads rather than a call to `memcmp`.
    #[inline(always)]
    pub(super) fn matches(&self, key: &[u8]) -> bool {
        match self {
            Self::Inline { len, bytes } => {
                usize::from(*len) == key.len()
                    && bytes
                        .get(..key.len())
                        .is_some_and(|stored| short_eq(stored, key))
            }
            Self::Heap(bytes) => **bytes == *key,
        }
    }

    /// Bytes held outside the entry.
    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            Self::Heap(bytes) => bytes.len(),
        }
    }
}

/// `a == b` for two slices of the same length, at most [`INLINE_KEY`].
#[inline(always)]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    #[inline(always)]
    fn word(s: &[u8], at: usize) -> u64 {
        s.get(at..at + 8)
            .and_then(|w| w.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    }
    #[inline(always)]
    fn half(s: &[u8], at: usize) -> u32 {
        s.get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .map_or(0, u32::from_ne_bytes)
    }
    let n = b.len();
    if n != a.len() {
        return false;
    }
    if n >= 8 {
        // Words at 0, at n − 8 and (past 16 bytes) at 8 cover every byte.
        word(a, 0) == word(b, 0)
            && word(a, n - 8) == word(b, n - 8)
            && (n <= 16 || word(a, 8) == word(b, 8))
    } else if n >= 4 {
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    } else {
        a == b
    }
}
