//! Header values: `Retry-After`, the IETF `RateLimit` / `RateLimit-Policy`
//! structured fields, and the legacy `X-RateLimit-*` headers.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{Entry, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use tollgate_core::{Decision, Policy, Verdict};

pub(crate) static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(crate) static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// The index of the decision that matters most (see
/// [`Verdict::binding`]), or `None` for an empty verdict.
pub(crate) fn binding_index(verdict: &Verdict) -> Option<usize> {
    // An empty verdict's binding is a static outside `decisions`, so no
    // position matches.
    let binding = verdict.binding();
    verdict
        .decisions()
        .iter()
        .position(|d| std::ptr::eq(d, binding))
}

/// `RateLimit-Policy: "burst";q=10;w=1, "daily";q=1000;w=86400`.
///
/// Policy names are ASCII letters, digits, `_`, `-` and `.` (the core
/// refuses others), so they need no escaping inside a string item.
pub(crate) fn policy_value(policies: &[Policy]) -> Option<HeaderValue> {
    let mut out = String::new();
    for policy in policies {
        if !out.is_empty() {
            out.push_str(", ");
        }
        let _ = write!(
            out,
            "\"{}\";q={};w={}",
            policy.name(),
            policy.limit(),
            ceil_secs(policy.period()).max(1)
        );
    }
    HeaderValue::from_str(&out).ok()
}

/// The `t` of a decision: its retry-after when denied, else the time until
/// the quota is back to full.
fn reset_secs(decision: &Decision) -> u64 {
    ceil_secs(decision.retry_after().unwrap_or(decision.reset_after()))
}

/// Appends the decimal digits of `n` (without `core::fmt`: this runs on
/// every request).
fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        // `n % 10` is below 10, so the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation)]
        let digit = (n % 10) as u8;
        digits[i] = b'0' + digit;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The number of decimal digits of `n`.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// `"<name>";r=` for each policy, computed once per tier.
pub(crate) fn ratelimit_prefixes(policies: &[Policy]) -> Box<[Box<str>]> {
    policies
        .iter()
        .map(|policy| format!("\"{}\";r=", policy.name()).into_boxed_str())
        .collect()
}

/// `RateLimit: "burst";r=0;t=1, "daily";r=998;t=86400`, from the tier's
/// [`ratelimit_prefixes`].
pub(crate) fn ratelimit_value(prefixes: &[Box<str>], verdict: &Verdict) -> Option<HeaderValue> {
    // The exact length, so the buffer becomes a `Bytes` without a second
    // allocation.
    let len: usize = prefixes
        .iter()
        .zip(verdict.decisions())
        .map(|(prefix, d)| prefix.len() + digits(d.remaining()) + 3 + digits(reset_secs(d)) + 2)
        .sum();
    let mut out = Vec::with_capacity(len.saturating_sub(2));
    for (prefix, decision) in prefixes.iter().zip(verdict.decisions()) {
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(prefix.as_bytes());
        push_u64(&mut out, decision.remaining());
        out.extend_from_slice(b";t=");
        push_u64(&mut out, reset_secs(decision));
    }
    HeaderValue::from_maybe_shared(Bytes::from(out)).ok()
}

/// The headers a response gets, computed once per request.
#[derive(Debug, Clone, Default)]
pub(crate) struct RateLimitHeaders {
    pub(crate) policy: Option<HeaderValue>,
    pub(crate) ratelimit: Option<HeaderValue>,
    pub(crate) legacy: Option<Box<[HeaderValue; 3]>>,
    pub(crate) retry_after: Option<HeaderValue>,
}

impl RateLimitHeaders {
    /// `policy_header` is the tier's precomputed `RateLimit-Policy` value.
    pub(crate) fn new(
        prefixes: &[Box<str>],
        policy_header: Option<&HeaderValue>,
        verdict: &Verdict,
        legacy: bool,
    ) -> Self {
        let legacy = legacy
            .then(|| binding_index(verdict))
            .flatten()
            .map(|i| &verdict.decisions()[i])
            .map(|binding| {
                Box::new([
                    HeaderValue::from(binding.limit()),
                    HeaderValue::from(binding.remaining()),
                    HeaderValue::from(reset_secs(binding)),
                ])
            });
        Self {
            policy: policy_header.cloned(),
            ratelimit: ratelimit_value(prefixes, verdict),
            legacy,
            retry_after: verdict
                .retry_after()
                .map(|d| HeaderValue::from(ceil_secs(d))),
        }
    }

    /// Adds the headers to a response.
    ///
    /// `RateLimit` and `RateLimit-Policy` are structured-field lists, so
    /// when an inner layer (or the handler) already wrote them this layer
    /// appends its members: with stacked layers the client sees every
    /// policy, innermost first. `Retry-After` becomes the larger of the two
    /// (a value that is not a number of seconds, such as an HTTP date, is
    /// kept). The legacy `X-RateLimit-*` headers describe one policy, so the
    /// innermost layer's stay.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        headers.reserve(3);
        if let Some(value) = self.policy {
            append_list(headers, &RATELIMIT_POLICY, value);
        }
        if let Some(value) = self.ratelimit {
            append_list(headers, &RATELIMIT, value);
        }
        if let Some(legacy) = self.legacy {
            let [limit, remaining, reset] = *legacy;
            for (name, value) in [
                (&X_RATELIMIT_LIMIT, limit),
                (&X_RATELIMIT_REMAINING, remaining),
                (&X_RATELIMIT_RESET, reset),
            ] {
                headers.entry(name.clone()).or_insert(value);
            }
        }
        if let Some(value) = self.retry_after {
            match headers.entry(RETRY_AFTER) {
                Entry::Vacant(entry) => {
                    entry.insert(value);
                }
                Entry::Occupied(mut entry) => {
                    if let (Some(theirs), Some(ours)) =
                        (delta_seconds(entry.get()), delta_seconds(&value))
                    {
                        if ours > theirs {
                            entry.insert(value);
                        }
                    }
                }
            }
        }
    }
}

/// A `Retry-After` in delta-seconds, or `None` for an HTTP date or junk.
fn delta_seconds(value: &HeaderValue) -> Option<u64> {
    std::str::from_utf8(value.as_bytes()).ok()?.parse().ok()
}

/// Sets `name` to `value`, or appends `value`'s members to the list already
/// there (every line of it, joined into one line).
fn append_list(headers: &mut HeaderMap, name: &HeaderName, value: HeaderValue) {
    let mut entry = match headers.entry(name.clone()) {
        Entry::Vacant(entry) => {
            entry.insert(value);
            return;
        }
        Entry::Occupied(entry) => entry,
    };
    let len: usize = entry.iter().map(|v| v.len() + 2).sum::<usize>() + value.len();
    let mut joined = Vec::with_capacity(len);
    for existing in entry.iter().chain(std::iter::once(&value)) {
        let existing = existing.as_bytes().trim_ascii();
        if existing.is_empty() {
            continue;
        }
        if !joined.is_empty() {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(existing);
    }
    // Joined from valid header values with ", ", so it is one too.
    if let Ok(joined) = HeaderValue::from_maybe_shared(Bytes::from(joined)) {
        entry.insert(joined);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies() -> Vec<Policy> {
        vec![
            Policy::per_second(10).name("burst").build().unwrap(),
            Policy::per(5, Duration::from_millis(1500))
                .name("odd.window")
                .build()
                .unwrap(),
        ]
    }

    #[test]
    fn decimal_digits() {
        for n in [0, 7, 10, 99, 1234567890, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            assert_eq!(digits(n), out.len());
        }
    }

    #[test]
    fn rounding_is_upward() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn values_are_structured_field_lists() {
        let verdict = Verdict::from_iter([
            Decision::allowed(10, 0, Duration::from_millis(900)),
            Decision::denied(
                5,
                0,
                Duration::from_millis(1200),
                Duration::from_millis(1500),
            ),
        ]);
        let policy = policy_value(&policies()).unwrap();
        assert_eq!(policy, "\"burst\";q=10;w=1, \"odd.window\";q=5;w=2");
        let rate = ratelimit_value(&ratelimit_prefixes(&policies()), &verdict).unwrap();
        assert_eq!(rate, "\"burst\";r=0;t=1, \"odd.window\";r=0;t=2");
        for value in [policy, rate] {
            let list = sfv::Parser::new(value.to_str().unwrap())
                .parse::<sfv::List>()
                .unwrap();
            assert_eq!(list.len(), 2);
        }
        let headers = RateLimitHeaders::new(&ratelimit_prefixes(&policies()), None, &verdict, true);
        assert_eq!(headers.retry_after.unwrap(), "2");
        let [limit, remaining, reset] = *headers.legacy.unwrap();
        assert_eq!(
            (limit, remaining, reset),
            (
                HeaderValue::from(5),
                HeaderValue::from(0),
                HeaderValue::from(2)
            )
        );
    }

    #[test]
    fn apply_appends_to_existing_lists() {
        let verdict = Verdict::from_iter([Decision::allowed(10, 3, Duration::from_millis(700))]);
        let mut map = HeaderMap::new();
        map.insert(&RATELIMIT, HeaderValue::from_static("\"inner\";r=1;t=5"));
        map.append(&RATELIMIT, HeaderValue::from_static("\"handler\";r=2;t=9"));
        map.insert(&X_RATELIMIT_LIMIT, HeaderValue::from_static("7"));
        RateLimitHeaders::new(
            &ratelimit_prefixes(&policies()[..1]),
            policy_value(&policies()[..1]).as_ref(),
            &verdict,
            true,
        )
        .apply(&mut map);
        assert_eq!(map.get_all(&RATELIMIT).iter().count(), 1);
        assert_eq!(
            map[&RATELIMIT],
            "\"inner\";r=1;t=5, \"handler\";r=2;t=9, \"burst\";r=3;t=1"
        );
        assert_eq!(map[&RATELIMIT_POLICY], "\"burst\";q=10;w=1");
        assert_eq!(map[&X_RATELIMIT_LIMIT], "7");
        assert!(!map.contains_key(RETRY_AFTER));
    }

    #[test]
    fn retry_after_becomes_the_larger() {
        let denied = |secs| {
            Verdict::from_iter([Decision::denied(
                10,
                0,
                Duration::from_secs(secs),
                Duration::from_secs(secs),
            )])
        };
        let prefixes = ratelimit_prefixes(&policies()[..1]);
        for (existing, ours, expected) in [
            ("5", 3, "5"),
            ("5", 8, "8"),
            (
                "Wed, 21 Oct 2015 07:28:00 GMT",
                8,
                "Wed, 21 Oct 2015 07:28:00 GMT",
            ),
        ] {
            let mut map = HeaderMap::new();
            map.insert(RETRY_AFTER, HeaderValue::from_static(existing));
            RateLimitHeaders::new(&prefixes, None, &denied(ours), false).apply(&mut map);
            assert_eq!(map[RETRY_AFTER], expected, "{existing} vs {ours}");
        }
    }
}
