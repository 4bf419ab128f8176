//! The Redis keys of a store: `<prefix>:{<encoded subject>}:<name>`, the
//! braces a Cluster hash tag so every key of one subject shares a slot
//! (the guide's "Key layout"). [`Keys`] holds the prefix and whether
//! subjects are hashed; everything that names a key asks it.

use std::borrow::Cow;
use std::sync::Arc;

use portcullis_core::subject::encode_subject;
use smallvec::SmallVec;

/// A key's bytes, held inline up to 128 (a prefix, a plain subject and a
/// name of common lengths): a lookup that needs no `String`.
pub(crate) type KeyBytes = SmallVec<[u8; 128]>;

/// Longest key prefix accepted by [`RedisStoreBuilder::prefix`](crate::RedisStoreBuilder::prefix).
pub const MAX_PREFIX_LEN: usize = 64;

/// How a store names its keys.
#[derive(Debug)]
pub(crate) struct Keys {
    prefix: Arc<str>,
    hash_subjects: bool,
}

impl Keys {
    pub(crate) fn new(prefix: Arc<str>, hash_subjects: bool) -> Self {
        Self {
            prefix,
            hash_subjects,
        }
    }

    /// The key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether every subject is hashed (not only long or brace-holding
    /// ones).
    pub(crate) fn hash_subjects(&self) -> bool {
        self.hash_subjects
    }

    /// The subject as it appears between the braces.
    pub(crate) fn subject<'a>(&self, subject: &'a str) -> Cow<'a, str> {
        encode_subject(subject, self.hash_subjects)
    }

    /// `<prefix>:{<encoded subject>}:<name>` in parts, to be written
    /// where the key is kept.
    pub(crate) fn parts<'a>(&'a self, encoded_subject: &'a str, name: &'a str) -> [&'a str; 5] {
        [&self.prefix, ":{", encoded_subject, "}:", name]
    }

    /// The bytes of [`Keys::key`], inline when they fit: each part copied
    /// once into a buffer of the inline size. (Built with `SmallVec`'s
    /// `extend_from_slice`, which checks the capacity and moves the tail
    /// for every part, a budget's check cost about 1 000 instructions more
    /// for its two keys: `redis_client`'s local-budget configuration.)
    pub(crate) fn key_bytes(&self, encoded_subject: &str, name: &str) -> KeyBytes {
        let parts = self.parts(encoded_subject, name);
        let len: usize = parts.iter().map(|part| part.len()).sum();
        let mut buf = [0_u8; 128];
        let Some(out) = buf.get_mut(..len) else {
            return KeyBytes::from_vec(self.key(encoded_subject, name).into_bytes());
        };
        let mut rest = out;
        for part in parts {
            let (head, tail) = rest.split_at_mut(part.len());
            head.copy_from_slice(part.as_bytes());
            rest = tail;
        }
        KeyBytes::from_buf_and_len(buf, len)
    }

    /// `<prefix>:{<encoded subject>}:<name>`.
    pub(crate) fn key(&self, encoded_subject: &str, name: &str) -> String {
        let prefix = &*self.prefix;
        let mut key = String::with_capacity(prefix.len() + encoded_subject.len() + name.len() + 4);
        key.push_str(prefix);
        key.push_str(":{");
        key.push_str(encoded_subject);
        key.push_str("}:");
        key.push_str(name);
        key
    }
}
