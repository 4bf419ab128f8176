//! [`KeyBuf`]: a rate-limit key written in place, held inline (no heap
//! allocation) up to `KeyBuf::INLINE_CAPACITY` bytes.

use std::fmt;
use std::ops::Deref;

use arrayvec::ArrayString;

/// A rate-limit key being built: inline up to
/// 46 bytes (every IP key the
/// shipped extractors write, IPv6 prefixes included), on the heap beyond.
///
/// [`KeyExtractor::extract_into`](crate::KeyExtractor::extract_into) writes
/// into one, so the layer keys a request without allocating a `String`. It
/// dereferences to `str`, and [`fmt::Write`] appends formatted text.
///
/// ```
/// use std::fmt::Write as _;
/// use portcullis::tower::KeyBuf;
///
/// let mut key = KeyBuf::new();
/// key.push_str("user:");
/// write!(key, "{}", 42).unwrap();
/// assert_eq!(key.as_str(), "user:42");
///
/// // Longer keys move to the heap; nothing is cut off.
/// key.push_str(&"x".repeat(100));
/// assert_eq!(key.len(), 107);
/// ```
#[derive(Clone, Default)]
pub struct KeyBuf {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    Inline(ArrayString<{ KeyBuf::INLINE_CAPACITY }>),
    Heap(String),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Inline(ArrayString::new_const())
    }
}

impl KeyBuf {
    /// Bytes held without a heap allocation: enough for an IPv6 prefix
    /// with its length (`ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128` is 43).
    pub(crate) const INLINE_CAPACITY: usize = 46;

    /// An empty key.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            repr: Repr::Inline(ArrayString::new_const()),
        }
    }

    /// The key as text.
    #[inline]
    #[must_use]
    pub fn as_str(&self) -> &str {
        match &self.repr {
            Repr::Inline(inline) => inline,
            Repr::Heap(string) => string,
        }
    }

    /// Appends `text`, moving to the heap when it no longer fits inline.
    #[inline]
    pub fn push_str(&mut self, text: &str) {
        match &mut self.repr {
            Repr::Inline(inline) => {
                if inline.try_push_str(text).is_err() {
                    let mut string = String::with_capacity(inline.len() + text.len());
                    string.push_str(inline);
                    string.push_str(text);
                    self.repr = Repr::Heap(string);
                }
            }
            Repr::Heap(string) => string.push_str(text),
        }
    }

    /// The inline text, when the key is inline with room for `room` more
    /// bytes: a writer of short keys writes there, with no second copy.
    #[inline]
    pub(crate) fn inline_with_room(
        &mut self,
        room: usize,
    ) -> Option<&mut ArrayString<{ KeyBuf::INLINE_CAPACITY }>> {
        match &mut self.repr {
            Repr::Inline(inline) if inline.remaining_capacity() >= room => Some(inline),
            _ => None,
        }
    }

    /// Appends `string`; when the key is empty, `string` becomes the key
    /// without a copy.
    pub(crate) fn push_string(&mut self, string: String) {
        if matches!(&self.repr, Repr::Inline(inline) if inline.is_empty()) {
            self.repr = Repr::Heap(string);
        } else {
            self.push_str(&string);
        }
    }

    /// Empties the key, keeping a heap buffer it may have.
    pub(crate) fn clear(&mut self) {
        match &mut self.repr {
            Repr::Inline(inline) => inline.clear(),
            Repr::Heap(string) => string.clear(),
        }
    }

    /// Whether the key is held inline (no heap allocation).
    #[cfg(test)]
    pub(crate) fn is_inline(&self) -> bool {
        matches!(self.repr, Repr::Inline(_))
    }

    /// The key as a `String` (allocates when it is inline).
    #[must_use]
    pub(crate) fn into_string(self) -> String {
        match self.repr {
            Repr::Heap(string) => string,
            Repr::Inline(inline) => inline.as_str().to_owned(),
        }
    }
}

impl Deref for KeyBuf {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for KeyBuf {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Write for KeyBuf {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.push_str(text);
        Ok(())
    }
}

impl fmt::Display for KeyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for KeyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for KeyBuf {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for KeyBuf {}

impl PartialEq<str> for KeyBuf {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for KeyBuf {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl From<&str> for KeyBuf {
    fn from(text: &str) -> Self {
        let mut key = Self::new();
        key.push_str(text);
        key
    }
}

impl From<String> for KeyBuf {
    fn from(string: String) -> Self {
        let mut key = Self::new();
        key.push_string(string);
        key
    }
}

impl From<KeyBuf> for String {
    fn from(key: KeyBuf) -> Self {
        key.into_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

    #[test]
    fn fills_inline_then_spills_to_the_heap_intact() {
        let mut key = KeyBuf::new();
        assert!(key.is_empty() && key.is_inline());
        let full = "a".repeat(KeyBuf::INLINE_CAPACITY);
        key.push_str(&full);
        assert!(key.is_inline());
        assert_eq!(key.as_str(), full);
        key.push_str("é");
        assert!(!key.is_inline());
        assert_eq!(key.as_str(), format!("{full}é"));
        key.clear();
        assert_eq!(key, "");
        let two = "two";
        write!(key, "{}-{two}", 1).unwrap();
        assert_eq!(key.into_string(), "1-two");
    }

    #[test]
    fn a_string_moves_in_whole_and_appends_otherwise() {
        let key = KeyBuf::from(String::from("abc"));
        assert!(!key.is_inline());
        assert_eq!(key, "abc");
        let mut key = KeyBuf::from("x,");
        key.push_string(String::from("y"));
        assert!(key.is_inline());
        assert_eq!(String::from(key), "x,y");
    }
}
