//! The configuration's TOML format read into a [`Config`], with errors
//! that name the file, line, column and field and say what is allowed.

use std::collections::hash_map::Entry;
use std::path::Path;

use portcullis_core::{Algorithm, LimitsFile, Policy, PolicyError};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use toml::Spanned;

use super::{Config, ConfigError, Keyed, Level, Node, Rule};

/// The algorithms a file may name.
const ALGORITHMS: &str =
    "gcra, token_bucket, leaky_meter, leaky_queue, fixed_window, sliding_window, sliding_log";

/// Deepest descriptor tree accepted (Envoy's descriptors hold a few
/// entries; a deeper request descriptor never matches).
pub(crate) const MAX_DEPTH: usize = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    domains: Vec<Spanned<DomainSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainSpec {
    name: Spanned<String>,
    #[serde(default)]
    descriptors: Vec<Spanned<NodeSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeSpec {
    key: Spanned<String>,
    value: Option<Spanned<String>>,
    limit: Option<Spanned<u64>>,
    period: Option<Spanned<String>>,
    algorithm: Option<Spanned<String>>,
    burst: Option<Spanned<u64>>,
    name: Option<Spanned<String>>,
    shadow_mode: Option<Spanned<bool>>,
    #[serde(default)]
    descriptors: Vec<Spanned<NodeSpec>>,
}

/// Builds errors that point into the text.
struct Locator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    fn error(
        &self,
        at: Option<usize>,
        field: &str,
        message: impl Into<String>,
        source: Option<PolicyError>,
    ) -> ConfigError {
        let (line, column) = at.map_or((0, 0), |offset| line_column(self.text, offset));
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            field: field.to_owned(),
            message: message.into(),
            source: source.map(|e| Box::new(e) as _),
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

pub(super) fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let at = Locator { path, text };
    let deserializer = toml::Deserializer::parse(text)
        .map_err(|e| at.error(e.span().map(|s| s.start), "(syntax)", e.message(), None))?;
    let spec: FileSpec = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        at.error(inner.span().map(|s| s.start), &field, inner.message(), None)
    })?;
    let mut config = Config::default();
    for (i, domain) in spec.domains.iter().enumerate() {
        let field = format!("domains[{i}]");
        let name = &domain.get_ref().name;
        if name.get_ref().is_empty() {
            return Err(at.error(
                Some(name.span().start),
                &format!("{field}.name"),
                "a domain needs a name: the `domain` of Envoy's ratelimit filter",
                None,
            ));
        }
        let mut level = Level::default();
        let mut trail = vec![name.get_ref().clone()];
        add_nodes(
            &at,
            &field,
            &domain.get_ref().descriptors,
            &mut level,
            &mut trail,
        )?;
        match config.domains.entry(name.get_ref().clone()) {
            Entry::Occupied(_) => {
                return Err(at.error(
                    Some(name.span().start),
                    &format!("{field}.name"),
                    format!(
                        "domain {:?} is defined twice: merge its descriptors into one [[domains]] table",
                        name.get_ref()
                    ),
                    None,
                ));
            }
            Entry::Vacant(vacant) => {
                vacant.insert(level);
            }
        }
    }
    Ok(config)
}

/// Adds `nodes` (the tree below `trail`: the domain, then each key and
/// value) to `level`.
fn add_nodes(
    at: &Locator<'_>,
    field: &str,
    nodes: &[Spanned<NodeSpec>],
    level: &mut Level,
    trail: &mut Vec<String>,
) -> Result<(), ConfigError> {
    if trail.len() > MAX_DEPTH {
        let start = nodes.first().map(|n| n.span().start);
        return Err(at.error(
            start,
            field,
            format!("descriptors nest deeper than {MAX_DEPTH} levels: flatten the tree"),
            None,
        ));
    }
    for (i, spanned) in nodes.iter().enumerate() {
        let field = format!("{field}.descriptors[{i}]");
        let spec = spanned.get_ref();
        let key = spec.key.get_ref();
        if key.is_empty() {
            return Err(at.error(
                Some(spec.key.span().start),
                &format!("{field}.key"),
                "a descriptor key cannot be empty: use the key Envoy's rate_limits action sends",
                None,
            ));
        }
        trail.push(key.clone());
        trail.push(
            spec.value
                .as_ref()
                .map_or_else(|| "*".to_owned(), |v| format!("={}", v.get_ref())),
        );
        let rule = build_rule(at, &field, spanned, trail)?;
        let mut node = Node {
            rule,
            children: Level::default(),
        };
        add_nodes(at, &field, &spec.descriptors, &mut node.children, trail)?;
        trail.truncate(trail.len() - 2);
        let keyed: &mut Keyed = level.keys.entry(key.clone()).or_default();
        let duplicate = match &spec.value {
            Some(value) => keyed
                .by_value
                .insert(value.get_ref().clone(), node)
                .is_some(),
            None => keyed.any_value.replace(Box::new(node)).is_some(),
        };
        if duplicate {
            return Err(at.error(
                Some(spanned.span().start),
                &field,
                format!(
                    "key {key:?} with this value is defined twice at this level: merge the two"
                ),
                None,
            ));
        }
    }
    Ok(())
}

/// The rule of a node, if it has a limit.
fn build_rule(
    at: &Locator<'_>,
    field: &str,
    spanned: &Spanned<NodeSpec>,
    trail: &[String],
) -> Result<Option<Rule>, ConfigError> {
    let spec = spanned.get_ref();
    let (limit, period) = match (&spec.limit, &spec.period) {
        (Some(limit), Some(period)) => (limit, period),
        (None, None) => {
            let extra = [
                spec.algorithm
                    .as_ref()
                    .map(|s| ("algorithm", s.span().start)),
                spec.burst.as_ref().map(|s| ("burst", s.span().start)),
                spec.name.as_ref().map(|s| ("name", s.span().start)),
                spec.shadow_mode
                    .as_ref()
                    .map(|s| ("shadow_mode", s.span().start)),
            ];
            if let Some((name, start)) = extra.into_iter().flatten().next() {
                return Err(at.error(
                    Some(start),
                    &format!("{field}.{name}"),
                    "only a descriptor with a `limit` and a `period` takes this field: add them, or remove it",
                    None,
                ));
            }
            return Ok(None);
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(at.error(
                Some(spanned.span().start),
                field,
                "a limit needs both `limit` and `period` (for example limit = 100, period = \"1m\")",
                None,
            ));
        }
    };
    let duration = LimitsFile::parse_duration(period.get_ref()).ok_or_else(|| {
        at.error(
            Some(period.span().start),
            &format!("{field}.period"),
            format!(
                "{:?} is not a period: write a whole number and a unit (us, ms, s, m, h, d), for example \"1s\", \"1m\" or \"1d\"",
                period.get_ref()
            ),
            None,
        )
    })?;
    let name = match &spec.name {
        Some(name) => name.get_ref().clone(),
        None => default_name(trail),
    };
    let mut builder = Policy::per(*limit.get_ref(), duration).name(name);
    if let Some(algorithm) = &spec.algorithm {
        let parsed = Algorithm::from_name(algorithm.get_ref()).ok_or_else(|| {
            at.error(
                Some(algorithm.span().start),
                &format!("{field}.algorithm"),
                format!(
                    "unknown algorithm {:?}: use one of {ALGORITHMS}",
                    algorithm.get_ref()
                ),
                None,
            )
        })?;
        builder = builder.algorithm(parsed);
    }
    if let Some(burst) = &spec.burst {
        builder = builder.burst(*burst.get_ref());
    }
    let policy = builder.build().map_err(|error| {
        let (sub, start) = match &error {
            PolicyError::InvalidName { .. } => (
                "name",
                spec.name
                    .as_ref()
                    .map_or(spanned.span().start, |n| n.span().start),
            ),
            PolicyError::ZeroBurst
            | PolicyError::BurstNotSupported { .. }
            | PolicyError::TooLarge { field: "burst", .. } => (
                "burst",
                spec.burst
                    .as_ref()
                    .map_or(spanned.span().start, |b| b.span().start),
            ),
            PolicyError::ZeroLimit
            | PolicyError::SlidingLogLimit { .. }
            | PolicyError::TooLarge { field: "limit", .. } => ("limit", limit.span().start),
            _ => ("period", period.span().start),
        };
        at.error(
            Some(start),
            &format!("{field}.{sub}"),
            "not a valid limit: change the value as the cause says",
            Some(error),
        )
    })?;
    Ok(Some(Rule {
        policy,
        shadow: spec.shadow_mode.as_ref().is_some_and(|s| *s.get_ref()),
    }))
}

/// `rls-` and 16 hex digits of the SHA-256 of the node's place in the
/// tree: stable across reloads as long as the node stays where it is.
fn default_name(trail: &[String]) -> String {
    let mut hasher = Sha256::new();
    for part in trail {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut name = String::from("rls-");
    for byte in &digest[..8] {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn err(text: &str) -> String {
        Config::parse("envoy.toml", text).unwrap_err().to_string()
    }

    #[test]
    fn the_tree_matches_exact_values_before_any_value() {
        let config = Config::parse(
            "envoy.toml",
            r#"
[[domains]]
name = "d"
[[domains.descriptors]]
key = "k"
limit = 10
period = "1s"
[[domains.descriptors]]
key = "k"
value = "vip"
limit = 100
period = "1s"
[[domains.descriptors.descriptors]]
key = "user"
limit = 1
period = "1m"
shadow_mode = true
"#,
        )
        .unwrap();
        assert_eq!(
            config
                .rule_for("d", &[("k", "x")])
                .unwrap()
                .policy()
                .limit(),
            10
        );
        assert_eq!(
            config
                .rule_for("d", &[("k", "vip")])
                .unwrap()
                .policy()
                .limit(),
            100
        );
        let nested = config
            .rule_for("d", &[("k", "vip"), ("user", "u")])
            .unwrap();
        assert!(nested.is_shadow());
        assert!(config.rule_for("d", &[("k", "x"), ("user", "u")]).is_none());
        assert!(config.rule_for("d", &[("other", "x")]).is_none());
        assert!(config.rule_for("nope", &[("k", "x")]).is_none());
        assert!(config.rule_for("d", &[]).is_none());
        // Default names differ per node and are valid policy names.
        let a = config
            .rule_for("d", &[("k", "x")])
            .unwrap()
            .policy()
            .name()
            .to_owned();
        let b = config
            .rule_for("d", &[("k", "vip")])
            .unwrap()
            .policy()
            .name()
            .to_owned();
        assert_ne!(a, b);
        assert!(a.starts_with("rls-"));
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let bad_period = err("[[domains]]\nname = \"d\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 5\nperiod = \"5 fortnights\"\n");
        assert!(bad_period.starts_with("envoy.toml:6:"), "{bad_period}");
        assert!(
            bad_period.contains("domains[0].descriptors[0].period"),
            "{bad_period}"
        );
        let unknown = err("[[domains]]\nname = \"d\"\nlimits = 3\n");
        assert!(unknown.contains("envoy.toml:3"), "{unknown}");
        let half =
            err("[[domains]]\nname = \"d\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 5\n");
        assert!(half.contains("both `limit` and `period`"), "{half}");
        let twice = err("[[domains]]\nname = \"d\"\n[[domains]]\nname = \"d\"\n");
        assert!(twice.contains("defined twice"), "{twice}");
        let zero = err("[[domains]]\nname = \"d\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 0\nperiod = \"1s\"\n");
        assert!(zero.contains("descriptors[0].limit"), "{zero}");
        let algorithm = err("[[domains]]\nname = \"d\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 1\nperiod = \"1s\"\nalgorithm = \"magic\"\n");
        assert!(algorithm.contains("gcra, token_bucket"), "{algorithm}");
        let stray =
            err("[[domains]]\nname = \"d\"\n[[domains.descriptors]]\nkey = \"k\"\nburst = 3\n");
        assert!(stray.contains("descriptors[0].burst"), "{stray}");
        let dup = err("[[domains]]\nname = \"d\"\n[[domains.descriptors]]\nkey = \"k\"\n[[domains.descriptors]]\nkey = \"k\"\n");
        assert!(dup.contains("defined twice at this level"), "{dup}");
    }

    #[test]
    fn durations() {
        let parse = LimitsFile::parse_duration;
        assert_eq!(parse("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("1d"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse("500us"), Some(Duration::from_micros(500)));
        assert_eq!(parse("s"), None);
        assert_eq!(parse("99999999999999999999d"), None);
    }
}
