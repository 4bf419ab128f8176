//! The test kit's response side (feature `testing`): [`RateLimitFields`]
//! reads back what a response's `RateLimit`, `RateLimit-Policy` and
//! `Retry-After` headers say, so a test asserts on numbers rather than on
//! header strings. Parsed as RFC 9651 structured fields with the `sfv`
//! crate.

use std::fmt;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::HeaderMap;

use crate::headers::{RATELIMIT, RATELIMIT_POLICY};

/// One policy's item in a response's `RateLimit` field, with its quota and
/// window from `RateLimit-Policy` when the response carries that too.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitField {
    /// The policy's name (`"default"` for an unnamed policy).
    pub policy: String,
    /// The quota units left (`r`).
    pub remaining: u64,
    /// When the quota is whole again, in whole seconds rounded up (`t`).
    pub reset: Duration,
    /// The policy's quota (`q` of `RateLimit-Policy`), if given.
    pub quota: Option<u64>,
    /// The time the quota takes to refill (`w` of `RateLimit-Policy`), if
    /// given.
    pub window: Option<Duration>,
}

/// What a response's rate-limit headers say.
///
/// ```
/// use std::time::Duration;
/// use axum::http::HeaderMap;
/// use portcullis::testing::RateLimitFields;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit", "\"api\";r=0;t=42".parse()?);
/// headers.insert("ratelimit-policy", "\"api\";q=5;w=60".parse()?);
/// headers.insert("retry-after", "42".parse()?);
///
/// let fields = RateLimitFields::read(&headers)?;
/// assert_eq!(fields.remaining(), Some(0));
/// assert_eq!(fields.retry_after(), Some(Duration::from_secs(42)));
/// assert_eq!(fields.get("api").and_then(|f| f.quota), Some(5));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RateLimitFields {
    fields: Vec<RateLimitField>,
    retry_after: Option<Duration>,
}

impl RateLimitFields {
    /// Reads `headers` (every `RateLimit` and `RateLimit-Policy` line, as
    /// one list each). A response without them reads as empty.
    ///
    /// # Errors
    ///
    /// [`FieldError`] when a field is not a structured-field list of the
    /// form the layer writes, or `Retry-After` is not whole seconds.
    pub fn read(headers: &HeaderMap) -> Result<Self, FieldError> {
        let mut fields = Vec::new();
        for (name, r, t) in items(headers, &RATELIMIT, "r", "t")? {
            let (Some(remaining), Some(reset)) = (r, t) else {
                return Err(FieldError::new(format!(
                    "the RateLimit item {name:?} lacks its r or t parameter"
                )));
            };
            fields.push(RateLimitField {
                policy: name,
                remaining,
                reset: Duration::from_secs(reset),
                quota: None,
                window: None,
            });
        }
        for (name, q, w) in items(headers, &RATELIMIT_POLICY, "q", "w")? {
            if let Some(field) = fields.iter_mut().find(|f| f.policy == name) {
                field.quota = q;
                field.window = w.map(Duration::from_secs);
            }
        }
        let retry_after = match headers.get(RETRY_AFTER) {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs)
                    .ok_or_else(|| {
                        FieldError::new(format!("Retry-After {value:?} is not a number of seconds"))
                    })?,
            ),
        };
        Ok(Self {
            fields,
            retry_after,
        })
    }

    /// Every policy's item, in the order of the `RateLimit` field.
    #[must_use]
    pub fn fields(&self) -> &[RateLimitField] {
        &self.fields
    }

    /// The item of the policy named `policy`.
    #[must_use]
    pub fn get(&self, policy: &str) -> Option<&RateLimitField> {
        self.fields.iter().find(|f| f.policy == policy)
    }

    /// The least `remaining` of any policy: how many more requests of cost
    /// 1 the response says will pass. `None` without a `RateLimit` field.
    #[must_use]
    pub fn remaining(&self) -> Option<u64> {
        self.fields.iter().map(|f| f.remaining).min()
    }

    /// `Retry-After`, present on a refused response.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// An item of a rate-limit list: the policy's name and two integer
/// parameters.
type Item = (String, Option<u64>, Option<u64>);

/// Each item of the list in `name`: its string, and its integer parameters
/// `first` and `second`.
fn items(
    headers: &HeaderMap,
    name: &http::HeaderName,
    first: &str,
    second: &str,
) -> Result<Vec<Item>, FieldError> {
    let mut out = Vec::new();
    for value in headers.get_all(name) {
        let text = value
            .to_str()
            .map_err(|_| FieldError::new(format!("{name} is not visible ASCII")))?;
        let list = sfv::Parser::new(text)
            .parse::<sfv::List>()
            .map_err(|error| FieldError::new(format!("{name} {text:?}: {error}")))?;
        for entry in list {
            let sfv::ListEntry::Item(item) = entry else {
                return Err(FieldError::new(format!(
                    "{name} {text:?} holds an inner list"
                )));
            };
            let Some(policy) = item.bare_item.as_string() else {
                return Err(FieldError::new(format!(
                    "{name} {text:?}: an item is not a string"
                )));
            };
            let param = |key: &str| -> Result<Option<u64>, FieldError> {
                match item.params.get(key) {
                    None => Ok(None),
                    Some(value) => value
                        .as_integer()
                        .and_then(|i| u64::try_from(i64::from(i)).ok())
                        .map(Some)
                        .ok_or_else(|| {
                            FieldError::new(format!(
                                "{name} {text:?}: {key} is not a non-negative integer"
                            ))
                        }),
                }
            };
            out.push((policy.as_str().to_owned(), param(first)?, param(second)?));
        }
    }
    Ok(out)
}

/// A rate-limit header that [`RateLimitFields::read`] could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    detail: String,
}

impl FieldError {
    fn new(detail: String) -> Self {
        Self { detail }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unreadable rate-limit header ({}); was the response written by a RateLimitLayer?",
            self.detail
        )
    }
}

impl std::error::Error for FieldError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(lines: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn reads_several_policies_over_several_lines() {
        let fields = RateLimitFields::read(&headers(&[
            ("ratelimit", "\"burst\";r=3;t=1"),
            ("ratelimit", "\"daily\";r=998;t=86400"),
            (
                "ratelimit-policy",
                "\"burst\";q=10;w=1, \"daily\";q=1000;w=86400",
            ),
        ]))
        .unwrap();
        assert_eq!(fields.fields().len(), 2);
        assert_eq!(fields.remaining(), Some(3));
        let daily = fields.get("daily").unwrap();
        assert_eq!((daily.remaining, daily.quota), (998, Some(1000)));
        assert_eq!(daily.window, Some(Duration::from_secs(86_400)));
        assert_eq!(fields.retry_after(), None);
    }

    #[test]
    fn malformed_fields_are_errors_not_panics() {
        for (name, value) in [
            ("ratelimit", "\"a\";r=-1;t=1"),
            ("ratelimit", "\"a\";r=1"),
            ("ratelimit", "a;r=1;t=1"),
            ("ratelimit", "(\"a\");r=1;t=1"),
            ("ratelimit", "\"a\";r=1.5;t=1"),
            ("retry-after", "soon"),
        ] {
            let error = RateLimitFields::read(&headers(&[(name, value)])).unwrap_err();
            assert!(error.to_string().contains("rate-limit header"), "{error}");
        }
        assert_eq!(
            RateLimitFields::read(&HeaderMap::new()).unwrap(),
            RateLimitFields::default()
        );
    }
}
