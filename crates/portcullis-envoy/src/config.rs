//! The service's configuration ([`Config`]): domains, each a tree of
//! descriptor entries (key, optional value) whose nodes may carry a rule
//! (a portcullis [`Policy`], shadow mode); how a request's descriptor
//! finds its rule ([`Config::rule_for`]); and the errors of reading it
//! ([`ConfigError`]). The TOML format is parsed in `config/parse.rs`.

mod parse;

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};

use portcullis_core::Policy;

type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// What the service limits: a set of domains (Envoy's `domain` of a
/// `ratelimit` filter), each a tree of descriptor entries whose nodes may
/// hold a limit, read from TOML with [`Config::parse`] (or
/// [`ConfigFile`](crate::ConfigFile) for a file reloaded live).
///
/// The format follows envoyproxy/ratelimit's tree: each `descriptors`
/// node matches one entry of a request's descriptor, by `key` and,
/// optionally, `value` (a node with a value matches only that value; one
/// without matches any value and limits **each value on its own**). A
/// descriptor whose entries walk the tree down to a node with a limit is
/// limited by it; any other descriptor is not limited (answered `OK`). A
/// limit is a portcullis policy: `limit`, `period` (a whole number and a
/// unit: `ms`, `s`, `m`, `h`, `d`), and optionally `algorithm` (`gcra`,
/// the default, `token_bucket`, `leaky_meter`, `leaky_queue`,
/// `fixed_window`, `sliding_window`, `sliding_log`), `burst`, `name` (the
/// policy's name; by default one derived from the node's place in the
/// tree) and `shadow_mode` (checked and counted, never denies).
///
/// ```
/// use portcullis_envoy::Config;
///
/// let config = Config::parse("limits.toml", r#"
/// [[domains]]
/// name = "edge"
///
/// [[domains.descriptors]]
/// key = "remote_address"
/// limit = 100
/// period = "1m"
///
/// [[domains.descriptors]]
/// key = "path"
/// value = "/login"
/// limit = 5
/// period = "1m"
/// algorithm = "sliding_window"
///
/// [[domains.descriptors.descriptors]]
/// key = "user"
/// limit = 2
/// period = "1s"
/// "#)?;
/// let rule = config.rule_for("edge", &[("path", "/login"), ("user", "alice")]).unwrap();
/// assert_eq!(rule.policy().limit(), 2);
/// assert!(config.rule_for("edge", &[("path", "/other")]).is_none());
/// assert!(config.has_domain("edge"));
///
/// let err = Config::parse("limits.toml", "[[domains]]\nname = \"edge\"\n[[domains.descriptors]]\nkey = \"k\"\nlimit = 5\nperiod = \"soon\"\n").unwrap_err();
/// assert!(err.to_string().contains("limits.toml:6"), "{err}");
/// # Ok::<(), portcullis_envoy::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Config {
    domains: HashMap<String, Level>,
}

/// One level of a domain's tree: the nodes by key, each by value.
#[derive(Debug, Clone, Default)]
struct Level {
    keys: HashMap<String, Keyed>,
}

/// The nodes of one key at one level.
#[derive(Debug, Clone, Default)]
struct Keyed {
    by_value: HashMap<String, Node>,
    any_value: Option<Box<Node>>,
}

#[derive(Debug, Clone, Default)]
struct Node {
    rule: Option<Rule>,
    children: Level,
}

/// The limit a descriptor is checked against: its policy and whether it
/// is in shadow mode.
#[derive(Debug, Clone)]
pub struct Rule {
    policy: Policy,
    shadow: bool,
}

impl Rule {
    /// The policy (its name is the name Envoy receives in `current_limit`).
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether the rule is in shadow mode: checked and counted, but its
    /// denials are answered `OK` (and logged).
    #[must_use]
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
}

impl Config {
    /// Parses a configuration from TOML text; `name` is the file name its
    /// errors give.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`], naming the line, column and field.
    pub fn parse(name: impl AsRef<Path>, text: &str) -> Result<Self, ConfigError> {
        parse::parse(name.as_ref(), text)
    }

    /// Whether `domain` is configured.
    #[must_use]
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rule a descriptor's entries (key, value pairs, in order) reach
    /// in `domain`, if any. At each level a node with the entry's exact
    /// value is preferred to one that takes any value.
    #[must_use]
    pub fn rule_for(&self, domain: &str, entries: &[(&str, &str)]) -> Option<&Rule> {
        let mut level = self.domains.get(domain)?;
        let mut found = None;
        for (key, value) in entries {
            let keyed = level.keys.get(*key)?;
            let node = keyed.by_value.get(*value).or(keyed.any_value.as_deref())?;
            found = Some(node);
            level = &node.children;
        }
        found?.rule.as_ref()
    }

    /// The domains, sorted (for logs).
    #[must_use]
    pub fn domains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

/// Why a configuration was refused. The configuration in force (if any)
/// stays; the message says where and what to change.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not a valid configuration.
    Invalid {
        /// The file (or the name given to [`Config::parse`]).
        path: PathBuf,
        /// 1-based line (0 when unknown).
        line: usize,
        /// 1-based column (0 when unknown).
        column: usize,
        /// The field, e.g. `domains[0].descriptors[1].period`.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
        /// The underlying error (a policy's), if any.
        source: Option<BoxError>,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, .. } => write!(
                f,
                "cannot read the rate-limit configuration {}: check the path and its permissions",
                path.display()
            ),
            Self::Invalid {
                path,
                line,
                column,
                field,
                message,
                ..
            } => write!(f, "{}:{line}:{column}: {field}: {message}", path.display()),
        }
    }
}

impl Error for ConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Invalid { source, .. } => source
                .as_deref()
                .map(|source| source as &(dyn Error + 'static)),
        }
    }
}
