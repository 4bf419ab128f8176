//! The command line (clap, derived): the commands and the options they
//! share (which subject, which store, which policies). `--help` is the
//! reference; the tool's README repeats the top-level help and
//! `inspect -h`, and a test holds them equal.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Exit codes, as `--help` lists them.
const EXIT_CODES: &str = "\
Exit codes:
  0  done (check: the request would be admitted; diff: the files are equal)
  1  check: the request would be denied; diff: the files differ
  2  bad usage or input (an unknown option, a subject or policy name refused)
  3  a limits file is invalid (file:line:column: field: reason)
  4  the store failed (unreachable, timed out, refused the credentials)
  5  reset refused: not confirmed (needs --yes when stdin is not a terminal)
  6  top: an endpoint is unreachable, timed out, or not a top-denied table";

/// How a subject given on the command line becomes the layer's key.
const SUBJECTS: &str = "\
Subjects are given as the operator knows them and turned into the key the
service's layer uses, by the layer's own extractors (--as):
  key      the layer's key as it is (a User id, a tuple's joined key, `global`)
  api-key  a raw API key, as ApiKey keys it: `#` + SHA-256 of the trimmed key
  bearer   a raw bearer token, as BearerToken keys it: `#` + SHA-256
  header   a header value, as Header keys it: as it is when plain, else hashed
  ip       an IP address, as PeerIp and ClientIp key it: IPv4-mapped addresses
           unwrapped, IPv6 grouped by --ipv6-prefix (56), IPv4 by --ipv4-prefix (32)
The store then keys `<prefix>:{<subject>}:<policy>`, hashing a subject that is
not plain (see portcullis::subject::encode_subject) or every subject with
--hash-subjects. Raw API keys and tokens are never printed, only their hashes.";

/// Inspect and reset rate-limit state, and check limits files.
#[derive(Debug, Parser)]
#[command(
    name = "portcullis",
    version,
    about = "Inspect and reset portcullis rate-limit state; validate and compare limits files",
    after_help = EXIT_CODES,
    term_width = 100
)]
pub(crate) struct Cli {
    /// Print the report as JSON, errors as {"error", "exit_code"} on stderr
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show a subject's state (writes nothing)
    ///
    /// For each policy: remaining, reset, retry-after, the policy the state
    /// was written under; held concurrency leases (--lease) and open token
    /// reservations (--budget), each with its expiry.
    #[command(after_help = SUBJECTS)]
    Inspect(Inspect),
    /// What a check would answer now (--dry-run: charges nothing)
    ///
    /// A check of cost 1 against every policy, as a peek: `--dry-run` is
    /// required, this tool never charges. Exits 1 when it would be denied.
    #[command(after_help = SUBJECTS)]
    Check(Check),
    /// Forget a subject's state (asks first, or needs --yes)
    ///
    /// Deletes the subject's state under its policies: its next check, on
    /// every instance, sees full capacity. Concurrency leases are left to
    /// expire. Without --yes it asks on the terminal, and refuses (exit 5,
    /// nothing written) when stdin is not a terminal.
    #[command(after_help = SUBJECTS)]
    Reset(Reset),
    /// The most denied subjects, merged from the apps' endpoints
    ///
    /// Fetches each URL (one per app instance: the route where the app
    /// serves `TopDenied::to_json`), merges the counts by subject and
    /// policy, and lists the most denied first. Each count comes with its
    /// bounds: at least (each table's error taken off) and at most (a
    /// full table's smallest count added where the subject is absent).
    Top(Top),
    /// Validate or compare limits files
    #[command(subcommand)]
    Limits(LimitsCommand),
}

#[derive(Debug, Args)]
pub(crate) struct Inspect {
    #[command(flatten)]
    pub(crate) subject: SubjectArgs,
    #[command(flatten)]
    pub(crate) policies: PolicyArgs,
    /// Concurrency policies whose live leases to count (repeatable).
    #[arg(long = "lease", value_name = "NAME")]
    pub(crate) leases: Vec<String>,
    /// Token budgets whose open reservations to list, with the tokens
    /// they hold (repeatable). A budget without max_in_flight keeps no
    /// index of them: they are found by SCAN (grant the ACL user +scan).
    #[arg(long = "budget", value_name = "NAME")]
    pub(crate) budgets: Vec<String>,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct Check {
    /// Required: answer without charging.
    #[arg(long, required = true)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) subject: SubjectArgs,
    #[command(flatten)]
    pub(crate) policies: PolicyArgs,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct Reset {
    /// Reset without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
    #[command(flatten)]
    pub(crate) subject: SubjectArgs,
    #[command(flatten)]
    pub(crate) policies: PolicyArgs,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

#[derive(Debug, Args)]
pub(crate) struct Top {
    /// The endpoints, as http://10.0.0.5:9000/admin/top-denied (one per
    /// instance; repeat or separate by commas).
    #[arg(required = true, value_name = "URL", value_delimiter = ',')]
    pub(crate) urls: Vec<String>,
    /// List this many (subject, policy) pairs, most denied first.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub(crate) limit: usize,
    /// The most each request may take (`500ms`, `5s`).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub(crate) enum LimitsCommand {
    /// Check limits files; errors as file:line:column: field: reason
    Validate {
        /// The files (TOML, as `LimitsFile` reads them).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// What changes from OLD to NEW (exits 1 when they differ)
    ///
    /// Policies, defaults, tiers and overrides added, removed or changed.
    Diff {
        /// The limits in force.
        old: PathBuf,
        /// The limits to compare them with.
        new: PathBuf,
    },
}

/// Which subject, as the operator knows it.
#[derive(Debug, Args)]
pub(crate) struct SubjectArgs {
    /// The subject: a key, a raw API key or token, a header value or an IP
    /// address (see --as); `-` reads it from stdin, keeping a secret out of
    /// the shell's history.
    #[arg(value_name = "SUBJECT")]
    pub(crate) subject: String,
    /// What SUBJECT is, and so how the layer keys it.
    #[arg(long = "as", value_enum, default_value_t = SubjectKind::Key, value_name = "KIND")]
    pub(crate) kind: SubjectKind,
    /// With --as ip: the IPv4 prefix the layer groups by.
    #[arg(long, default_value_t = 32, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=32))]
    pub(crate) ipv4_prefix: u8,
    /// With --as ip: the IPv6 prefix the layer groups by.
    #[arg(long, default_value_t = 56, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pub(crate) ipv6_prefix: u8,
}

/// What a subject given on the command line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SubjectKind {
    /// The layer's key as it is.
    Key,
    /// A raw API key (ApiKey).
    ApiKey,
    /// A raw bearer token (BearerToken).
    Bearer,
    /// A header value (Header).
    Header,
    /// An IP address (PeerIp, ClientIp).
    Ip,
}

/// Which policies: from a limits file, as the layer selects them, or by
/// name.
#[derive(Debug, Args)]
pub(crate) struct PolicyArgs {
    /// The service's limits file: the subject's policies are those it
    /// selects for the subject's key (its override, else --tier, else the
    /// defaults).
    #[arg(long, value_name = "FILE")]
    pub(crate) limits: Option<PathBuf>,
    /// With --limits: the tier the service picks for this subject.
    #[arg(long, value_name = "TIER", requires = "limits")]
    pub(crate) tier: Option<String>,
    /// Only these policies (repeatable). Without --limits, a state is read
    /// under the policy it was written under.
    #[arg(long = "policy", value_name = "NAME")]
    pub(crate) names: Vec<String>,
}

/// Which store, configured as the service configures its `RedisStore`.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// The Redis URL (redis://, rediss://, redis+unix://; user and
    /// password as in the store); with --cluster or --sentinel, several
    /// (repeat or separate by commas).
    #[arg(
        long = "redis",
        env = "PORTCULLIS_REDIS_URL",
        value_name = "URL",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub(crate) urls: Vec<String>,
    /// The URLs are nodes of a Redis Cluster.
    #[arg(long)]
    pub(crate) cluster: bool,
    /// The URLs are Sentinels monitoring the primary MASTER.
    #[arg(long, value_name = "MASTER", conflicts_with = "cluster")]
    pub(crate) sentinel: Option<String>,
    /// With --sentinel: the primary's credentials, `USER:PASSWORD` or
    /// `:PASSWORD` (the Sentinels' own go in their URLs).
    #[arg(
        long,
        env = "PORTCULLIS_REDIS_PRIMARY_AUTH",
        hide_env_values = true,
        value_name = "USER:PASSWORD"
    )]
    pub(crate) primary_auth: Option<String>,
    /// The store's key prefix.
    #[arg(long, default_value = "portcullis", value_name = "PREFIX")]
    pub(crate) prefix: String,
    /// The store hashes every subject (RedisStoreBuilder::hash_subjects).
    #[arg(long)]
    pub(crate) hash_subjects: bool,
    /// A PEM file of the CA that signed the server's certificate.
    #[arg(long, value_name = "PEM")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// A PEM client certificate (mutual TLS); needs --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The PEM key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The most any store call may take (`500ms`, `5s`).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
}

/// `<whole number><unit>`, the unit one of `ms`, `s`, `m`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = text.get(digits.len()..).unwrap_or_default();
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}`: write a whole number and a unit, as `500ms` or `5s`"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        _ => return Err(format!("`{text}`: the unit is one of ms, s, m")),
    };
    if duration.is_zero() {
        return Err("a timeout of zero would fail every call".to_owned());
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5 s").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
    }
}
