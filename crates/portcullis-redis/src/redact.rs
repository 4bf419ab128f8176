//! Passwords out of sight: URLs as they appear in errors, `Debug` output
//! and logs.
//!
//! The URLs that reach an error are often the ones that did not parse, so
//! redaction cannot lean on a URL parser: a password may hold any of
//! `: / ? # @`, which a parser would read as the end of the password. What
//! is certain is that a host holds no `@`: the user-info runs up to the
//! *last* `@`, and its password from the first `:` of it. A `pass=` query
//! parameter (`redis+unix:///path?pass=…`) is hidden from its `=` to the
//! end of the URL, since its value, too, may hold `&` or `#`. When the two
//! overlap (an `@` inside a `pass=` value), everything from the earlier
//! start is hidden: a URL may lose more than its password, never keep part
//! of it.

use std::ops::Range;

/// `url` with its password (in the user part, or a `pass=` query
/// parameter) replaced by `***`, for messages and logs. The store redacts
/// every URL it prints; use this for the ones an application prints.
///
/// The password is hidden whatever characters it holds, percent-encoded or
/// not, even in a URL that does not parse: the user-info is taken up to the
/// last `@`.
///
/// ```
/// use portcullis::redis::redact_url;
///
/// assert_eq!(
///     redact_url("rediss://app:s3cret@cache.internal:6380/0"),
///     "rediss://app:***@cache.internal:6380/0"
/// );
/// // Not percent-encoded, so not a valid URL: still hidden.
/// assert_eq!(redact_url("redis://app:Ab#9/x@y@host"), "redis://app:***@host");
/// assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    let (rest_start, has_authority) = match url.find("://") {
        // `redis+unix:///path` has an empty authority: no user-info.
        Some(at) => (at + 3, !url[at + 3..].starts_with('/')),
        None => (0, false),
    };
    let rest = &url[rest_start..];
    let user_password = if has_authority {
        rest.rfind('@').and_then(|at| {
            let colon = rest[..at].find(':')?;
            Some(rest_start + colon + 1..rest_start + at)
        })
    } else {
        None
    };
    let query_password = query_password_start(rest).map(|start| rest_start + start..url.len());
    // In order: a user-info's password comes before a query's, unless they
    // overlap, and then one span hides both.
    let hidden: [Option<Range<usize>>; 2] = match (user_password, query_password) {
        (Some(user), Some(query)) if query.start <= user.end => {
            [Some(user.start.min(query.start)..url.len()), None]
        }
        (user, query) => [user, query],
    };
    let mut redacted = String::with_capacity(url.len());
    let mut shown_from = 0;
    for range in hidden.into_iter().flatten() {
        redacted.push_str(&url[shown_from..range.start]);
        redacted.push_str("***");
        shown_from = range.end;
    }
    redacted.push_str(&url[shown_from..]);
    redacted
}

/// Where the value of the first `pass=` parameter starts in `rest` (a
/// `pass=` right after a `?` or `&`).
fn query_password_start(rest: &str) -> Option<usize> {
    rest.match_indices("pass=")
        .find(|(at, _)| *at > 0 && matches!(rest.as_bytes()[at - 1], b'?' | b'&'))
        .map(|(at, key)| at + key.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://app:s3cret@10.0.0.1:6379/2"),
            "redis://app:***@10.0.0.1:6379/2"
        );
        assert_eq!(redact_url("rediss://:s3cret@host"), "rediss://:***@host");
        assert_eq!(redact_url("redis://app@host"), "redis://app@host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            redact_url("rediss://u:p%40ss@h#insecure"),
            "rediss://u:***@h#insecure"
        );
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?user=a&pass=s3cret"),
            "redis+unix:///tmp/r.sock?user=a&pass=***"
        );
    }

    /// Each password holds characters a URL parser would end it at; none of
    /// its characters may survive, and the host stays readable.
    #[test]
    fn passwords_with_url_delimiters_are_redacted_whole() {
        for (url, expected) in [
            ("redis://app:Ab#9xy@host", "redis://app:***@host"),
            ("redis://app:Ab?9xy@host:6379", "redis://app:***@host:6379"),
            ("redis://app:Ab/9xy@host/0", "redis://app:***@host/0"),
            ("redis://app:Ab@9xy@host", "redis://app:***@host"),
            ("redis://app:Ab:9xy@host", "redis://app:***@host"),
            ("redis://:#?/@:pw@host:6379/1", "redis://:***@host:6379/1"),
            ("rediss://app:x#y@h#insecure", "rediss://app:***@h#insecure"),
        ] {
            let redacted = redact_url(url);
            assert_eq!(redacted, expected, "{url}");
            assert!(
                !redacted.contains("9xy") && !redacted.contains("pw"),
                "{url}"
            );
        }
    }

    /// A user name may hold the same characters (a `:` ends it: what
    /// follows is password).
    #[test]
    fn user_names_with_url_delimiters_keep_the_password_hidden() {
        for (url, expected) in [
            ("redis://a#b:pw@host", "redis://a#b:***@host"),
            ("redis://a?b:pw@host", "redis://a?b:***@host"),
            ("redis://a/b:pw@host", "redis://a/b:***@host"),
            ("redis://a@b:pw@host", "redis://a@b:***@host"),
            ("redis://a:b:pw@host", "redis://a:***@host"),
            ("redis://a@b@host", "redis://a@b@host"),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }

    #[test]
    fn query_passwords_are_redacted_whatever_they_hold() {
        for (url, expected) in [
            (
                "redis+unix:///tmp/r.sock?pass=a#b&db=1",
                "redis+unix:///tmp/r.sock?pass=***",
            ),
            (
                "redis+unix:///tmp/r.sock?user=u&pass=a@b:c/d",
                "redis+unix:///tmp/r.sock?user=u&pass=***",
            ),
            ("unix:///s?db=2&pass=a?b", "unix:///s?db=2&pass=***"),
            // An `@` inside the query value: what looked like a user-info
            // overlaps it, and both are hidden from the earlier start.
            ("redis://host:6379/0?pass=a@b", "redis://host:***"),
            ("redis://u:p@host/0?pass=q", "redis://u:***@host/0?pass=***"),
            // Not a parameter: a user name that happens to end in `pass=`.
            ("redis://bypass=x@host", "redis://bypass=x@host"),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }

    #[test]
    fn text_that_is_not_a_url_is_returned_as_is_unless_it_has_a_password_query() {
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("x?pass=s3cret"), "x?pass=***");
    }
}
