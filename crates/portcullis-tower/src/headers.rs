//! Header values: `Retry-After`, the IETF `RateLimit` / `RateLimit-Policy`
//! structured fields, and the legacy `X-RateLimit-*` headers.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::Duration;

use arrayvec::ArrayVec;
use bytes::{Bytes, BytesMut};
use http::header::{Entry, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use portcullis_core::{Decision, Policy, Verdict};

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
/// One rule for a burst, the same in `RateLimit-Policy`, `RateLimit` and
/// `X-RateLimit-Limit`: the quota `q` is the policy's
/// [capacity](Policy::capacity) (the most a client may send at once, so the
/// remaining `r` never exceeds it, as the IETF draft's quota units
/// require), and the window `w` is the time that capacity takes to refill
/// at the policy's rate, in whole seconds rounded up. Without a burst that
/// is the policy's own limit and period (`per_minute(100)`: `q=100;w=60`);
/// `per_second(10).burst(20)` is `q=20;w=2`, the same rate.
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
            policy.capacity(),
            refill_secs(policy)
        );
    }
    HeaderValue::from_str(&out).ok()
}

/// Seconds (rounded up, at least 1) for `policy`'s capacity to refill at
/// its rate: `capacity × period / limit`.
fn refill_secs(policy: &Policy) -> u64 {
    let micros = (u128::from(policy.period_micros()) * u128::from(policy.capacity()))
        .div_ceil(u128::from(policy.limit().max(1)));
    u64::try_from(micros.div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The `t` of a decision: its retry-after when denied, else the time until
/// the quota is back to full.
fn reset_secs(decision: &Decision) -> u64 {
    ceil_secs(decision.retry_after().unwrap_or(decision.reset_after()))
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
    // Digits by `itoa` (no `core::fmt`: this runs on every request) into a
    // stack buffer, then one allocation of the exact length; a value too
    // long for the buffer (many policies with long names) goes to the heap.
    let mut stack = ArrayVec::<u8, 160>::new();
    if write_ratelimit(prefixes, verdict, |part| {
        stack.try_extend_from_slice(part).is_ok()
    }) {
        return HeaderValue::from_maybe_shared(arena_bytes(&stack)).ok();
    }
    let mut heap = Vec::new();
    write_ratelimit(prefixes, verdict, |part| {
        heap.extend_from_slice(part);
        true
    });
    HeaderValue::from_maybe_shared(Bytes::from(heap)).ok()
}

/// Bytes of a chunk of this thread's arena, so that values built on every
/// request share one allocation per [`ARENA_CHUNK`] bytes instead of one
/// each (a value costs a reference count; the chunk is freed when its last
/// value is dropped). A value holds at most its chunk alive, so a
/// response kept for long keeps at most one chunk.
fn arena_bytes(data: &[u8]) -> Bytes {
    thread_local! {
        static ARENA: RefCell<BytesMut> = RefCell::new(BytesMut::new());
    }
    ARENA
        .try_with(|arena| {
            let mut arena = arena.try_borrow_mut().ok()?;
            if arena.capacity() < data.len() {
                *arena = BytesMut::with_capacity(ARENA_CHUNK.max(data.len()));
            }
            arena.extend_from_slice(data);
            Some(arena.split().freeze())
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| Bytes::copy_from_slice(data))
}

/// The size of an arena chunk: room for some 40 `RateLimit` values.
const ARENA_CHUNK: usize = 1024;

/// Writes the `RateLimit` value part by part through `push`, stopping
/// (and returning `false`) when `push` does.
fn write_ratelimit(
    prefixes: &[Box<str>],
    verdict: &Verdict,
    mut push: impl FnMut(&[u8]) -> bool,
) -> bool {
    let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
    for (i, (prefix, decision)) in prefixes.iter().zip(verdict.decisions()).enumerate() {
        if !((i == 0 || push(b", "))
            && push(prefix.as_bytes())
            && push(r.format(decision.remaining()).as_bytes())
            && push(b";t=")
            && push(t.format(reset_secs(decision)).as_bytes()))
        {
            return false;
        }
    }
    true
}

/// The headers a response gets, computed once per request. Small, since
/// an admitted request's future carries it: the fields only limited
/// responses (`Retry-After`) or the legacy option need are boxed.
#[derive(Debug, Clone, Default)]
pub(crate) struct RateLimitHeaders {
    pub(crate) policy: Option<HeaderValue>,
    pub(crate) ratelimit: Option<HeaderValue>,
    rare: Option<Box<Rare>>,
}

/// The fields of [`RateLimitHeaders`] an admitted response usually lacks.
#[derive(Debug, Clone, Default)]
struct Rare {
    legacy: Option<[HeaderValue; 3]>,
    retry_after: Option<HeaderValue>,
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
                [
                    HeaderValue::from(binding.limit()),
                    HeaderValue::from(binding.remaining()),
                    HeaderValue::from(reset_secs(binding)),
                ]
            });
        // An admitted verdict has no `retry_after`: skip the walk.
        let retry_after = if verdict.is_allowed() {
            None
        } else {
            verdict.retry_after()
        };
        let mut headers = Self {
            policy: policy_header.cloned(),
            ratelimit: ratelimit_value(prefixes, verdict),
            rare: None,
        };
        if legacy.is_some() || retry_after.is_some() {
            headers.rare = Some(Box::new(Rare {
                legacy,
                retry_after: retry_after.map(|d| HeaderValue::from(ceil_secs(d))),
            }));
        }
        headers
    }

    /// Sets (or clears) `Retry-After`.
    pub(crate) fn set_retry_after(&mut self, value: Option<HeaderValue>) {
        match (&mut self.rare, value) {
            (Some(rare), value) => rare.retry_after = value,
            (None, None) => {}
            (rare @ None, Some(value)) => {
                *rare = Some(Box::new(Rare {
                    legacy: None,
                    retry_after: Some(value),
                }));
            }
        }
    }

    /// The `Retry-After` value, if any.
    #[cfg(test)]
    pub(crate) fn retry_after(&self) -> Option<&HeaderValue> {
        self.rare.as_ref()?.retry_after.as_ref()
    }

    /// Whether there is nothing to add.
    pub(crate) fn is_empty(&self) -> bool {
        self.policy.is_none()
            && self.ratelimit.is_none()
            && self
                .rare
                .as_ref()
                .is_none_or(|rare| rare.legacy.is_none() && rare.retry_after.is_none())
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
        if let Some(value) = self.policy {
            append_list(headers, &RATELIMIT_POLICY, value);
        }
        if let Some(value) = self.ratelimit {
            append_list(headers, &RATELIMIT, value);
        }
        let Some(rare) = self.rare else {
            return;
        };
        if let Some([limit, remaining, reset]) = rare.legacy {
            for (name, value) in [
                (&X_RATELIMIT_LIMIT, limit),
                (&X_RATELIMIT_REMAINING, remaining),
                (&X_RATELIMIT_RESET, reset),
            ] {
                headers.entry(name.clone()).or_insert(value);
            }
        }
        if let Some(value) = rare.retry_after {
            match headers.entry(RETRY_AFTER) {
                Entry::Vacant(entry) => {
                    entry.insert(value);
                }
                Entry::Occupied(mut entry) => {
                    if let (Some(theirs), Some(ours)) =
                        (delta_seconds(entry.get()), delta_seconds(&value))
                        && ours > theirs
                    {
                        entry.insert(value);
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
fn append_list(headers: &mut HeaderMap, name: &'static HeaderName, value: HeaderValue) {
    // One lookup in the common case (no such field yet): `append` says
    // whether there was one.
    if !headers.append(name, value) {
        return;
    }
    let mut entry = match headers.entry(name) {
        Entry::Occupied(entry) => entry,
        Entry::Vacant(_) => return,
    };
    let len: usize = entry.iter().map(|v| v.len() + 2).sum();
    let mut joined = Vec::with_capacity(len);
    for existing in entry.iter() {
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
    fn a_burst_is_advertised_as_its_capacity_over_its_refill_time() {
        let burst = Policy::per_second(10)
            .burst(20)
            .name("api")
            .build()
            .unwrap();
        assert_eq!(policy_value(&[burst]).unwrap(), "\"api\";q=20;w=2");
        // 7 per minute in bursts of 3: 3 × 60 / 7 = 25.7 s, rounded up.
        let odd = Policy::per_minute(7).burst(3).name("odd").build().unwrap();
        assert_eq!(policy_value(&[odd]).unwrap(), "\"odd\";q=3;w=26");
        let windowed = Policy::per_day(1_000)
            .algorithm(portcullis_core::Algorithm::FixedWindow)
            .name("daily")
            .build()
            .unwrap();
        assert_eq!(
            policy_value(&[windowed]).unwrap(),
            "\"daily\";q=1000;w=86400"
        );
    }

    #[test]
    fn large_numbers_are_written_exactly() {
        let verdict = Verdict::from_iter([Decision::allowed(
            u64::MAX,
            u64::MAX,
            Duration::from_secs(1_000_000_007),
        )]);
        let value = ratelimit_value(&ratelimit_prefixes(&policies()[..1]), &verdict).unwrap();
        assert_eq!(
            value,
            format!("\"burst\";r={};t=1000000007", u64::MAX).as_str()
        );
        assert_eq!(value.len(), value.as_bytes().len());
    }

    #[test]
    fn arena_values_stay_intact_across_chunks() {
        let prefixes = ratelimit_prefixes(&policies()[..1]);
        // Far more than one chunk's worth, all alive at once, plus one
        // longer than a chunk.
        let values: Vec<(u64, HeaderValue)> = (0..500u64)
            .map(|r| {
                let verdict =
                    Verdict::from_iter([Decision::allowed(1000, r * 7919, Duration::from_secs(1))]);
                (r * 7919, ratelimit_value(&prefixes, &verdict).unwrap())
            })
            .collect();
        for (remaining, value) in &values {
            assert_eq!(value, format!("\"burst\";r={remaining};t=1").as_str());
        }
        let long = vec![b'x'; ARENA_CHUNK * 2];
        assert_eq!(arena_bytes(&long), long);
        assert_eq!(values[0].1, "\"burst\";r=0;t=1");
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
        assert_eq!(headers.retry_after().unwrap(), "2");
        let [limit, remaining, reset] = headers.rare.unwrap().legacy.unwrap();
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
