//! [`convert_ratelimit_yaml`]: envoyproxy/ratelimit's YAML configuration
//! (one domain per file: `domain`, `descriptors` with `key`, `value`,
//! `rate_limit: {unit, requests_per_unit, unlimited, name}`,
//! `shadow_mode`, nested `descriptors`) written as this crate's TOML, so
//! its users switch without rewriting their limits.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::{Config, ConfigError};

#[derive(Deserialize)]
struct FileSpec {
    domain: Spanned<String>,
    #[serde(default)]
    descriptors: Vec<Spanned<NodeSpec>>,
}

#[derive(Deserialize)]
struct NodeSpec {
    key: Spanned<String>,
    value: Option<Spanned<String>>,
    rate_limit: Option<Spanned<RateLimitSpec>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    descriptors: Vec<Spanned<NodeSpec>>,
    // Refused below: no equivalent. (Other fields, such as
    // `detailed_metric`, change no limit and are ignored.)
    replaces: Option<Spanned<serde::de::IgnoredAny>>,
}

#[derive(Deserialize)]
struct RateLimitSpec {
    unit: Option<Spanned<String>>,
    requests_per_unit: Option<Spanned<u64>>,
    #[serde(default)]
    unlimited: bool,
    name: Option<Spanned<String>>,
}

/// Converts one envoyproxy/ratelimit YAML file (`name` for its errors) to
/// this crate's TOML, one `[[domains]]` table; `algorithm` is the
/// portcullis algorithm every limit gets (`fixed_window` keeps
/// envoyproxy/ratelimit's behaviour; `gcra` spreads the same number
/// evenly). The result parses with [`Config::parse`].
///
/// Units become periods (`second` 1s, `minute` 1m, `hour` 1h, `day` 1d,
/// `week` 7d, `month` 30d, `year` 365d); `unlimited: true` becomes a node
/// without a limit; `shadow_mode` and `name` carry over. Wildcard values
/// (`value: "prefix*"`) and `replaces` have no equivalent and are refused
/// with their line.
///
/// ```
/// use portcullis_envoy::{convert_ratelimit_yaml, Config};
///
/// let toml = convert_ratelimit_yaml("mongo.yaml", "
/// domain: mongo_cps
/// descriptors:
///   - key: database
///     value: users
///     rate_limit:
///       unit: second
///       requests_per_unit: 500
///   - key: database
///     value: default
///     rate_limit:
///       unit: minute
///       requests_per_unit: 50
/// ", "fixed_window")?;
/// let config = Config::parse("mongo.toml", &toml)?;
/// let rule = config.rule_for("mongo_cps", &[("database", "users")]).unwrap();
/// assert_eq!(rule.policy().limit(), 500);
/// # Ok::<(), portcullis_envoy::ConfigError>(())
/// ```
///
/// # Errors
///
/// [`ConfigError::Invalid`] with the file's line and column.
pub fn convert_ratelimit_yaml(
    name: impl AsRef<Path>,
    text: &str,
    algorithm: &str,
) -> Result<String, ConfigError> {
    let path = name.as_ref();
    let invalid = |line: u64, column: u64, field: &str, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        line: usize::try_from(line).unwrap_or(0),
        column: usize::try_from(column).unwrap_or(0),
        field: field.to_owned(),
        message,
        source: None,
    };
    let spec: FileSpec = serde_saphyr::from_str(text).map_err(|error| {
        let (line, column) = error
            .location()
            .map_or((0, 0), |at| (at.line(), at.column()));
        invalid(line, column, "(yaml)", error.to_string())
    })?;
    let mut out = String::new();
    let _ = writeln!(out, "[[domains]]\nname = {}", quote(&spec.domain.value));
    let mut ctx = Writer {
        out,
        algorithm,
        invalid: &invalid,
    };
    ctx.nodes(&spec.descriptors, "domains.descriptors", "descriptors")?;
    let toml = ctx.out;
    // What is written must read back.
    Config::parse(path, &toml)?;
    Ok(toml)
}

struct Writer<'a, F> {
    out: String,
    algorithm: &'a str,
    invalid: &'a F,
}

impl<F> Writer<'_, F>
where
    F: Fn(u64, u64, &str, String) -> ConfigError,
{
    fn nodes(
        &mut self,
        nodes: &[Spanned<NodeSpec>],
        table: &str,
        field: &str,
    ) -> Result<(), ConfigError> {
        for (i, node) in nodes.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let spec = &node.value;
            let at = |s: &serde_saphyr::Location| (s.line(), s.column());
            if let Some(replaces) = &spec.replaces {
                let (line, column) = at(&replaces.referenced);
                return Err((self.invalid)(
                    line,
                    column,
                    &format!("{field}.replaces"),
                    "`replaces` has no equivalent here: a request's limits are all decided together; remove it".to_owned(),
                ));
            }
            if let Some(value) = &spec.value
                && value.value.ends_with('*')
            {
                let (line, column) = at(&value.referenced);
                return Err((self.invalid)(
                    line,
                    column,
                    &format!("{field}.value"),
                    "wildcard values are not supported: list each value, or leave `value` out to limit every value on its own".to_owned(),
                ));
            }
            let _ = writeln!(self.out, "\n[[{table}]]\nkey = {}", quote(&spec.key.value));
            if let Some(value) = &spec.value {
                let _ = writeln!(self.out, "value = {}", quote(&value.value));
            }
            if let Some(limit) = spec.rate_limit.as_ref().filter(|l| !l.value.unlimited) {
                let rate = &limit.value;
                let (line, column) = at(&limit.referenced);
                let (Some(unit), Some(requests)) = (&rate.unit, &rate.requests_per_unit) else {
                    return Err((self.invalid)(
                        line,
                        column,
                        &format!("{field}.rate_limit"),
                        "a rate_limit needs `unit` and `requests_per_unit`".to_owned(),
                    ));
                };
                let period = match unit.value.to_ascii_lowercase().as_str() {
                    "second" => "1s",
                    "minute" => "1m",
                    "hour" => "1h",
                    "day" => "1d",
                    "week" => "7d",
                    "month" => "30d",
                    "year" => "365d",
                    _ => {
                        let (line, column) = at(&unit.referenced);
                        return Err((self.invalid)(
                            line,
                            column,
                            &format!("{field}.rate_limit.unit"),
                            format!(
                                "unknown unit {:?}: use second, minute, hour, day, week, month or year",
                                unit.value
                            ),
                        ));
                    }
                };
                let _ = writeln!(
                    self.out,
                    "limit = {}\nperiod = \"{period}\"\nalgorithm = {}",
                    requests.value,
                    quote(self.algorithm)
                );
                if let Some(name) = &rate.name {
                    let _ = writeln!(self.out, "name = {}", quote(&name.value));
                }
                if spec.shadow_mode {
                    let _ = writeln!(self.out, "shadow_mode = true");
                }
            }
            let child_table = format!("{table}.descriptors");
            self.nodes(
                &spec.descriptors,
                &child_table,
                &format!("{field}.descriptors"),
            )?;
        }
        Ok(())
    }
}

/// A TOML basic string: JSON's escapes are all TOML's.
fn quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_unlimited_shadow_and_names_carry_over() {
        let toml = convert_ratelimit_yaml(
            "rl.yaml",
            r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: path
    value: "/login \"quoted\""
    rate_limit: { unit: hour, requests_per_unit: 5, name: login }
    shadow_mode: true
    descriptors:
      - key: user
        rate_limit: { unit: second, requests_per_unit: 2 }
  - key: internal
    rate_limit: { unlimited: true }
    detailed_metric: true
"#,
            "gcra",
        )
        .unwrap();
        let config = Config::parse("out.toml", &toml).unwrap();
        let ip = config
            .rule_for("edge", &[("remote_address", "1.2.3.4")])
            .unwrap();
        assert_eq!(ip.policy().limit(), 100);
        let login = config
            .rule_for("edge", &[("path", "/login \"quoted\"")])
            .unwrap();
        assert_eq!(login.policy().name(), "login");
        assert!(login.is_shadow());
        let user = config
            .rule_for("edge", &[("path", "/login \"quoted\""), ("user", "u")])
            .unwrap();
        assert_eq!(user.policy().period().as_secs(), 1);
        assert!(config.rule_for("edge", &[("internal", "x")]).is_none());
    }

    #[test]
    fn what_has_no_equivalent_is_refused_with_its_line() {
        let wildcard = convert_ratelimit_yaml(
            "rl.yaml",
            "domain: d\ndescriptors:\n  - key: path\n    value: \"/api/*\"\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
            "gcra",
        )
        .unwrap_err()
        .to_string();
        assert!(wildcard.starts_with("rl.yaml:4:"), "{wildcard}");
        assert!(wildcard.contains("wildcard"), "{wildcard}");
        let unit = convert_ratelimit_yaml(
            "rl.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "gcra",
        )
        .unwrap_err()
        .to_string();
        assert!(unit.contains("unknown unit"), "{unit}");
        let syntax = convert_ratelimit_yaml("rl.yaml", "domain: [", "gcra").unwrap_err();
        assert!(syntax.to_string().starts_with("rl.yaml:"), "{syntax}");
        let algorithm =
            convert_ratelimit_yaml("rl.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n", "magic")
                .unwrap_err();
        assert!(
            algorithm.to_string().contains("unknown algorithm"),
            "{algorithm}"
        );
    }
}
