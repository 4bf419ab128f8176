//! Passwords out of sight: URLs as they appear in errors, `Debug` output
//! and logs.

/// `url` with its password (in the user part, or a `pass=` query
/// parameter) replaced by `***`, for messages and logs. The store redacts
/// every URL it prints; use this for the ones an application prints.
///
/// ```
/// use portcullis::redis::redact_url;
///
/// assert_eq!(
///     redact_url("rediss://app:s3cret@cache.internal:6380/0"),
///     "rediss://app:***@cache.internal:6380/0"
/// );
/// assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
#[must_use]
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    // `redis+unix:///path?user=..&pass=..` keeps its password in the query.
    format!("{scheme}://{authority}{}", redact_query(tail))
}

fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("pass", _)) => "pass=***".to_owned(),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{path}?{}", query.join("&"))
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
}
