//! The limits file's format: TOML read into a [`LimitSet`], with errors
//! that name the file, line, column and field and say what is allowed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{BoxError, LimitsFileError};
use crate::{Algorithm, LimitSet, Policy};

/// The algorithms a file may name, as [`Algorithm::as_str`] writes them.
const ALGORITHMS: &str =
    "gcra, token_bucket, leaky_meter, leaky_queue, fixed_window, sliding_window, sliding_log";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    default: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    policies: BTreeMap<String, Spanned<PolicySpec>>,
    #[serde(default)]
    tiers: BTreeMap<String, Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    overrides: BTreeMap<String, Spanned<OverrideSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySpec {
    limit: Spanned<u64>,
    period: Spanned<String>,
    algorithm: Option<Spanned<String>>,
    burst: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideSpec {
    tier: Option<Spanned<String>>,
    policies: Option<Spanned<Vec<Spanned<String>>>>,
}

/// Builds errors that point into `text`.
struct Locator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    fn error(
        &self,
        at: Option<usize>,
        field: impl Into<String>,
        message: impl Into<String>,
        source: Option<BoxError>,
    ) -> LimitsFileError {
        let (line, column) = at.map_or((0, 0), |offset| line_column(self.text, offset));
        LimitsFileError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            field: field.into(),
            message: message.into(),
            source,
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

pub(super) fn parse(path: &Path, text: &str) -> Result<LimitSet, LimitsFileError> {
    let at = Locator { path, text };
    let deserializer = toml::Deserializer::parse(text)
        .map_err(|e| at.error(e.span().map(|s| s.start), "(syntax)", e.message(), None))?;
    let spec: FileSpec = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let field = field_path(e.path());
        let inner = e.into_inner();
        at.error(inner.span().map(|s| s.start), field, inner.message(), None)
    })?;

    let mut policies = BTreeMap::new();
    for (name, spec) in &spec.policies {
        let field = format!("policies.{name}");
        let policy = build_policy(&at, &field, name, spec)?;
        policies.insert(name.as_str(), policy);
    }
    let pick = |field: &str,
                names: &Spanned<Vec<Spanned<String>>>|
     -> Result<Vec<Policy>, LimitsFileError> {
        names
            .get_ref()
            .iter()
            .map(|name| {
                policies.get(name.get_ref().as_str()).cloned().ok_or_else(|| {
                    let defined: Vec<&str> = policies.keys().copied().collect();
                    at.error(
                        Some(name.span().start),
                        field,
                        format!(
                            "no policy is named {:?}: define it under [policies], or use one of: {}",
                            name.get_ref(),
                            if defined.is_empty() { "(none defined)".to_owned() } else { defined.join(", ") }
                        ),
                        None,
                    )
                })
            })
            .collect()
    };

    let mut builder = LimitSet::builder().policies(pick("default", &spec.default)?);
    for (name, names) in &spec.tiers {
        builder = builder.tier(name.clone(), pick(&format!("tiers.{name}"), names)?);
    }
    for (subject, value) in &spec.overrides {
        let field = format!("overrides.{subject}");
        let subject = &hashed_subject(subject)
            .map_err(|message| at.error(Some(value.span().start), field.clone(), message, None))?;
        builder = match (&value.get_ref().tier, &value.get_ref().policies) {
            (Some(tier), None) => {
                if !spec.tiers.contains_key(tier.get_ref()) {
                    let defined: Vec<&str> = spec.tiers.keys().map(String::as_str).collect();
                    return Err(at.error(
                        Some(tier.span().start),
                        format!("{field}.tier"),
                        format!(
                            "no tier is named {:?}: define it under [tiers], or use one of: {}",
                            tier.get_ref(),
                            if defined.is_empty() { "(none defined)".to_owned() } else { defined.join(", ") }
                        ),
                        None,
                    ));
                }
                builder.override_tier(subject.clone(), tier.get_ref().clone())
            }
            (None, Some(names)) => builder.override_policies(
                subject.clone(),
                pick(&format!("{field}.policies"), names)?,
            ),
            _ => {
                return Err(at.error(
                    Some(value.span().start),
                    field,
                    "give either `tier = \"<tier>\"` or `policies = [\"<policy>\", ...]`, not both or neither",
                    None,
                ))
            }
        };
    }
    builder.build().map_err(|error| {
        // Locate the set the error names.
        let span = match &error {
            crate::LimitsError::InvalidPolicies { of, .. }
            | crate::LimitsError::NoPolicies { of } => locate_owner(&spec, of),
            crate::LimitsError::InvalidTierName { tier }
            | crate::LimitsError::DuplicateTier { tier } => {
                spec.tiers.get(tier).map(|t| t.span().start)
            }
            _ => None,
        };
        at.error(
            span,
            "(limits)",
            "the limits do not validate: fix what the cause names",
            Some(Box::new(error)),
        )
    })
}

/// An override's subject as the layer's key has it: a hashed one (`#` and
/// 64 hex digits, as `ApiKey`, `BearerToken` and `Header` make it) in
/// lowercase; anything else as written.
fn hashed_subject(subject: &str) -> Result<String, String> {
    let Some(hex) = subject.strip_prefix(crate::subject::HASHED_SUBJECT_PREFIX) else {
        return Ok(subject.to_owned());
    };
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(subject.to_ascii_lowercase());
    }
    Err(format!(
        "{subject:?} starts with '#' but is not '#' and the 64 hex digits of a SHA-256: write the key of a hashed credential (ApiKey, BearerToken) as '#' and its SHA-256, for example from `printf '%s' \"$API_KEY\" | sha256sum`"
    ))
}

/// The dotted path of a field, without the segments of `Spanned`'s own
/// representation.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        let part = match segment {
            Segment::Map { key } if key.starts_with("$__serde_spanned") => continue,
            Segment::Map { key } | Segment::Enum { variant: key } => key.clone(),
            Segment::Seq { index } => index.to_string(),
            Segment::Unknown => "?".to_owned(),
        };
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(&part);
    }
    if out.is_empty() {
        out.push_str("(top level)");
    }
    out
}

fn locate_owner(spec: &FileSpec, of: &str) -> Option<usize> {
    if of.starts_with("the default") {
        return Some(spec.default.span().start);
    }
    let quoted = of.split('"').nth(1)?;
    if of.starts_with("tier") {
        spec.tiers.get(quoted).map(|t| t.span().start)
    } else {
        spec.overrides.get(quoted).map(|o| o.span().start)
    }
}

fn build_policy(
    at: &Locator<'_>,
    field: &str,
    name: &str,
    spec: &Spanned<PolicySpec>,
) -> Result<Policy, LimitsFileError> {
    let PolicySpec {
        limit,
        period,
        algorithm,
        burst,
    } = spec.get_ref();
    let duration = parse_duration(period.get_ref()).ok_or_else(|| {
        at.error(
            Some(period.span().start),
            format!("{field}.period"),
            format!(
                "{:?} is not a period: write a whole number and a unit (us, ms, s, m, h, d), for example \"500ms\", \"1s\", \"1m\", \"1h\" or \"1d\"",
                period.get_ref()
            ),
            None,
        )
    })?;
    let mut builder = Policy::per(*limit.get_ref(), duration).name(name);
    if let Some(algorithm) = algorithm {
        let parsed = Algorithm::from_name(algorithm.get_ref()).ok_or_else(|| {
            at.error(
                Some(algorithm.span().start),
                format!("{field}.algorithm"),
                format!(
                    "unknown algorithm {:?}: use one of {ALGORITHMS}",
                    algorithm.get_ref()
                ),
                None,
            )
        })?;
        builder = builder.algorithm(parsed);
    }
    if let Some(burst) = burst {
        builder = builder.burst(*burst.get_ref());
    }
    builder.build().map_err(|error| {
        // Point at the field the policy error is about, where it has one.
        let (sub, span) = match &error {
            crate::PolicyError::ZeroLimit | crate::PolicyError::SlidingLogLimit { .. } => {
                ("limit", limit.span())
            }
            crate::PolicyError::TooLarge { field: "burst", .. }
            | crate::PolicyError::ZeroBurst
            | crate::PolicyError::BurstNotSupported { .. } => (
                "burst",
                burst.as_ref().map_or_else(|| spec.span(), Spanned::span),
            ),
            crate::PolicyError::TooLarge { field: "limit", .. } => ("limit", limit.span()),
            crate::PolicyError::InvalidName { .. } => ("", spec.span()),
            _ => ("period", period.span()),
        };
        let field = if sub.is_empty() {
            field.to_owned()
        } else {
            format!("{field}.{sub}")
        };
        at.error(
            Some(span.start),
            field,
            "not a valid policy: change the value as the cause says",
            Some(Box::new(error)),
        )
    })
}

/// `<whole number><unit>`, unit one of `us`, `ms`, `s`, `m`, `h`, `d`
/// ([`LimitsFile::parse_duration`](crate::LimitsFile::parse_duration)).
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let micros_per = match unit.trim() {
        "us" | "µs" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" | "min" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return None,
    };
    number.checked_mul(micros_per).map(Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits_file::with_sources;

    const GOOD: &str = r#"
default = ["free"]

[policies]
free = { limit = 10, period = "1m" }
pro = { limit = 100, period = "1m", burst = 20 }
day = { limit = 1000, period = "1d", algorithm = "fixed_window" }
own = { limit = 5, period = "500ms" }

[tiers]
pro = ["pro", "day"]

[overrides]
acme = { tier = "pro" }
globex = { policies = ["own"] }
"#;

    fn err(text: &str) -> String {
        parse(Path::new("limits.toml"), text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_good_file_parses() {
        let set = parse(Path::new("limits.toml"), GOOD).unwrap();
        assert_eq!(set.defaults()[0].name(), "free");
        let pro = set.tier("pro").unwrap();
        assert_eq!(pro[0].capacity(), 20);
        assert_eq!(pro[1].algorithm(), Algorithm::FixedWindow);
        assert_eq!(set.select("acme", None).name(), "pro");
        let own = set.select("globex", None);
        assert_eq!(own.policies()[0].period(), Duration::from_millis(500));
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        assert_eq!(
            err("default = [\"a\"]\n[policies]\na = { limit = 10, period = \"1 minute\" }\n"),
            "limits.toml:3:28: policies.a.period: \"1 minute\" is not a period: write a whole number and a unit (us, ms, s, m, h, d), for example \"500ms\", \"1s\", \"1m\", \"1h\" or \"1d\""
        );
        assert_eq!(
            err("default = [\"a\"]\n[policies]\na = { limit = \"ten\", period = \"1m\" }\n"),
            "limits.toml:3:15: policies.a.limit: invalid type: string \"ten\", expected u64"
        );
        let e = err("default = [\"a\"]\n[policies]\na = { limit = 10, period = \"1m\", algorithm = \"gcrA\" }\n");
        assert!(e.starts_with("limits.toml:3:46: policies.a.algorithm: unknown algorithm \"gcrA\": use one of gcra, token_bucket"), "{e}");
        let e = err("default = [\"b\"]\n[policies]\na = { limit = 10, period = \"1m\" }\n");
        assert_eq!(e, "limits.toml:1:12: default: no policy is named \"b\": define it under [policies], or use one of: a");
        let e = err("default = [\"a\"]\n[policies]\na = { limit = 0, period = \"1m\" }\n");
        assert!(
            e.starts_with("limits.toml:3:15: policies.a.limit: not a valid policy"),
            "{e}"
        );
        let e = err("default = [\"a\"]\n[policies]\na = { limit = 1, period = \"1m\" }\n[overrides]\nx = { tier = \"gold\" }\n");
        assert!(
            e.starts_with("limits.toml:5:14: overrides.x.tier: no tier is named \"gold\""),
            "{e}"
        );
        let e = parse(
            Path::new("limits.toml"),
            "default = [\"a\", \"a\"]\n[policies]\na = { limit = 1, period = \"1m\" }\n",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "limits.toml:1:11: (limits): the limits do not validate: fix what the cause names"
        );
        assert!(
            with_sources(&e).contains(": the default policies has two policies named \"a\": give each policy of a set its own name"),
            "{}",
            with_sources(&e)
        );
        let e = err("default = [\"a\"\n");
        assert!(e.starts_with("limits.toml:1:"), "{e}");
        let e = err("[policies]\na = { limit = 1, period = \"1m\" }\n");
        assert!(e.contains("missing field `default`"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(
            parse_duration("30d"),
            Some(Duration::from_secs(30 * 86_400))
        );
        assert_eq!(parse_duration("1.5s"), None);
        assert_eq!(parse_duration("s"), None);
        assert_eq!(parse_duration("10"), None);
    }
}
