//! Command-line parsing for `cargo xtask`.

use std::fmt;

/// The usage text printed by `cargo xtask help` and on bad arguments.
pub(crate) const USAGE: &str = "\
Usage: cargo xtask <command> [options]

Commands:
  test [--no-lint] [-- <cargo test args>]
        The project's test command (README and CI), in order:
        cargo fmt --check; cargo clippy -D warnings; rustdoc; the public API
        against api/portcullis.txt; start Redis (a standalone
        server and a 3-master Cluster on free ports); cargo test --workspace
        with PORTCULLIS_REDIS_* set; stop Redis.
        --no-lint     skip fmt and clippy (quick local runs)
        -- <args>     passed to cargo test, e.g. `-- -p portcullis-redis`
                      or `-- -p portcullis-redis --test store -- --nocapture`
  ci    Same as test.
  redis [--masters N] [--replicas N] [--no-stdin]
        Start a standalone server and a Cluster (3 masters, 0 replicas by
        default), print the `export PORTCULLIS_REDIS_...` lines for your shell,
        and keep them running until Ctrl-C or until stdin closes (Ctrl-D).
        --masters N   Cluster masters (default 3)
        --replicas N  replicas per master (default 0)
        --no-stdin    ignore stdin: run until interrupted or killed
  bench <core|redis|http|envoy|scale|all> [-- <criterion args>]
        Run the benches (redis and http against a fresh local
        redis-server): core = portcullis-core memory_cost (MemoryStore vs
        governor: instructions per check under callgrind, resident bytes
        per key, interleaved wall-clock ratios; needs valgrind),
        redis = portcullis-redis redis_throughput (starts its own
        redis-server pinned to core 0: server instructions per check by
        callgrind and checks/s, portcullis vs the peer scripts of
        ../shared/bench; needs valgrind and taskset; about 4 minutes),
        http = portcullis-tower http_throughput,
        envoy = portcullis-envoy rls_redis (starts its own redis-server
        pinned to core 0: server instructions per descriptor of
        ShouldRateLimit by callgrind and requests/s, portcullis vs
        envoyproxy/ratelimit's INCRBY/EXPIRE pipeline; needs valgrind and
        taskset; about 3 minutes),
        scale = three app instances on one Redis, loaded out of process
        (MemoryStore, Redis exact, Redis with a local budget: req/s against
        the bare app, Redis calls and server instructions per request,
        overshoot against the stated bound; needs valgrind and taskset;
        about 3 minutes; not part of `all`).
  reliability
        Fault and abuse scenarios against a standalone server and a Cluster
        of 3 masters with 1 replica each (Redis killed, slow, pool exhausted,
        failover, slot migration, hot subject); prints a table and fails if
        any decision was wrong. RELIABILITY_ONLY=killed,slow,pool,cluster,abuse
        runs some groups only.
  public-api [--bless]
        Print the public items of the portcullis facade (all features), one
        a line, with their counts; --bless writes them to api/portcullis.txt,
        which `test` checks (commit it with a change of the public API).
  doc-examples
        Compile every Rust block of the family's doc comments and READMEs
        in a generated crate (target/doc-examples) whose dependencies are
        the README quick start's: portcullis (feature axum), axum, tokio
        (feature full). An example may name more crates on its first line
        (`// Also add: cargo add http`). Also a stage of `test`.
  soak [-- --seconds N --subjects N --store memory|redis|both]
        Mixed traffic over 100,000 subjects on both stores; prints memory
        figures and fails if memory grows or a subject exceeds its limit.
  help  Print this text.

Needs redis-server on PATH (apt-get install redis-server) for test, ci,
redis, reliability, soak and the redis/http benches.
";

/// A parsed `cargo xtask` invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Invocation {
    /// `test` / `ci`.
    Test(TestOptions),
    /// `redis`.
    Redis(RedisOptions),
    /// `bench`.
    Bench {
        /// Which benches.
        target: BenchTarget,
        /// Arguments after `--`, passed to the bench binaries.
        bench_args: Vec<String>,
    },
    /// `help`, `--help`, `-h`.
    Help,
}

/// Options of `cargo xtask test`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestOptions {
    /// Run `cargo fmt --check` and `cargo clippy` before the tests.
    pub(crate) lint: bool,
    /// Arguments after `--`, appended to `cargo test`.
    pub(crate) cargo_args: Vec<String>,
}

impl TestOptions {
    /// The full `cargo test` argument list: `test --workspace` plus the
    /// pass-through arguments; `--workspace` is dropped when those select
    /// packages themselves (`-p` / `--package`).
    pub(crate) fn cargo_test_args(&self) -> Vec<String> {
        let before_separator = self.cargo_args.iter().take_while(|arg| *arg != "--");
        let selects_packages = before_separator.clone().any(|arg| {
            arg == "-p"
                || arg == "--package"
                || arg.starts_with("--package=")
                || (arg.starts_with("-p") && arg.len() > 2)
        });
        // One failing test binary must not hide the others' results.
        let mut args = vec!["test".to_owned(), "--no-fail-fast".to_owned()];
        if !selects_packages {
            args.push("--workspace".to_owned());
        }
        args.extend(self.cargo_args.iter().cloned());
        args
    }
}

/// Options of `cargo xtask redis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RedisOptions {
    /// Masters of the Cluster.
    pub(crate) masters: usize,
    /// Replicas per master.
    pub(crate) replicas_per_master: usize,
    /// Stop when stdin closes (the default), or only when killed.
    pub(crate) watch_stdin: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            masters: 3,
            replicas_per_master: 0,
            watch_stdin: true,
        }
    }
}

/// What `cargo xtask bench` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BenchTarget {
    /// `portcullis-core`'s `memory_cost` (callgrind, RSS, wall-clock ratios).
    Core,
    /// `portcullis-redis`'s `redis_throughput` (needs a server).
    Redis,
    /// `portcullis-tower`'s `http_throughput` (needs a server).
    Http,
    /// `portcullis-envoy`'s `rls_redis` (starts its own servers).
    Envoy,
    /// `portcullis-tests`' `scale` binary (starts its own servers).
    Scale,
    /// All of the above, in that order.
    All,
}

impl BenchTarget {
    /// The single targets this one stands for.
    pub(crate) fn expand(self) -> &'static [BenchTarget] {
        match self {
            BenchTarget::Core => &[BenchTarget::Core],
            BenchTarget::Redis => &[BenchTarget::Redis],
            BenchTarget::Http => &[BenchTarget::Http],
            BenchTarget::Envoy => &[BenchTarget::Envoy],
            BenchTarget::Scale => &[BenchTarget::Scale],
            BenchTarget::All => &[
                BenchTarget::Core,
                BenchTarget::Redis,
                BenchTarget::Http,
                BenchTarget::Envoy,
            ],
        }
    }
}

/// A command line `cargo xtask` does not understand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses the arguments after `cargo xtask`.
pub(crate) fn parse(args: &[String]) -> Result<Invocation, UsageError> {
    let Some((command, rest)) = args.split_first() else {
        return Err(UsageError("missing command".to_owned()));
    };
    let (options, passthrough) = match rest.iter().position(|arg| arg == "--") {
        Some(index) => (&rest[..index], Some(rest[index + 1..].to_vec())),
        None => (rest, None),
    };
    match command.as_str() {
        "test" | "ci" => {
            let mut lint = true;
            for option in options {
                match option.as_str() {
                    "--no-lint" => lint = false,
                    other => {
                        return Err(unknown(command, other, "--no-lint, -- <cargo test args>"))
                    }
                }
            }
            Ok(Invocation::Test(TestOptions {
                lint,
                cargo_args: passthrough.unwrap_or_default(),
            }))
        }
        "redis" => {
            if passthrough.is_some() {
                return Err(UsageError("`redis` takes no `--` arguments".to_owned()));
            }
            let mut redis = RedisOptions::default();
            let mut options = options.iter();
            while let Some(option) = options.next() {
                match option.as_str() {
                    "--no-stdin" => redis.watch_stdin = false,
                    "--masters" => redis.masters = count(option, options.next(), 1)?,
                    "--replicas" => redis.replicas_per_master = count(option, options.next(), 0)?,
                    other => {
                        return Err(unknown(
                            command,
                            other,
                            "--masters N, --replicas N, --no-stdin",
                        ))
                    }
                }
            }
            Ok(Invocation::Redis(redis))
        }
        "bench" => {
            let target = match options {
                [] => {
                    return Err(UsageError(
                        "`bench` needs a target: core, redis, http, envoy, scale or all".to_owned(),
                    ))
                }
                [target] => match target.as_str() {
                    "core" => BenchTarget::Core,
                    "redis" => BenchTarget::Redis,
                    "http" => BenchTarget::Http,
                    "envoy" => BenchTarget::Envoy,
                    "scale" => BenchTarget::Scale,
                    "all" => BenchTarget::All,
                    other => {
                        return Err(UsageError(format!(
                            "unknown bench target `{other}`: use core, redis, http, envoy, scale or all"
                        )))
                    }
                },
                [_, extra, ..] => {
                    return Err(unknown(command, extra, "one target, -- <criterion args>"))
                }
            };
            Ok(Invocation::Bench {
                target,
                bench_args: passthrough.unwrap_or_default(),
            })
        }
        "help" | "--help" | "-h" => Ok(Invocation::Help),
        other => Err(UsageError(format!("unknown command `{other}`"))),
    }
}

/// The value of a count option (`--masters 3`): a number from `min` to 100.
fn count(option: &str, value: Option<&String>, min: usize) -> Result<usize, UsageError> {
    value
        .and_then(|value| value.parse::<usize>().ok())
        .filter(|n| (min..=100).contains(n))
        .ok_or_else(|| UsageError(format!("`{option}` needs a number from {min} to 100")))
}

/// The error for an option `command` does not take.
fn unknown(command: &str, option: &str, accepted: &str) -> UsageError {
    UsageError(format!(
        "`{command}` does not take `{option}` (accepted: {accepted})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Invocation, UsageError> {
        let args: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        parse(&args)
    }

    fn test_options(line: &str) -> TestOptions {
        match parse_str(line) {
            Ok(Invocation::Test(options)) => options,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn test_and_ci_parse_lint_and_passthrough() {
        let plain = test_options("test");
        assert!(plain.lint);
        assert!(plain.cargo_args.is_empty());
        assert_eq!(test_options("ci"), plain);

        let quick = test_options("test --no-lint -- -p portcullis-redis -- --nocapture");
        assert!(!quick.lint);
        assert_eq!(
            quick.cargo_args,
            ["-p", "portcullis-redis", "--", "--nocapture"]
        );
    }

    #[test]
    fn cargo_test_args_keep_workspace_unless_packages_are_selected() {
        let args = |line: &str| test_options(line).cargo_test_args().join(" ");
        assert_eq!(args("test"), "test --no-fail-fast --workspace");
        assert_eq!(
            args("test -- --lib"),
            "test --no-fail-fast --workspace --lib"
        );
        assert_eq!(
            args("test -- -p portcullis-core"),
            "test --no-fail-fast -p portcullis-core"
        );
        assert_eq!(
            args("test -- -pportcullis-core"),
            "test --no-fail-fast -pportcullis-core"
        );
        assert_eq!(
            args("test -- --package=portcullis-core"),
            "test --no-fail-fast --package=portcullis-core"
        );
        // `-p` after the test binaries' `--` is not a package selection.
        assert_eq!(
            args("test -- -- -p"),
            "test --no-fail-fast --workspace -- -p"
        );
    }

    #[test]
    fn redis_and_bench_parse() {
        assert_eq!(
            parse_str("redis"),
            Ok(Invocation::Redis(RedisOptions {
                masters: 3,
                replicas_per_master: 0,
                watch_stdin: true
            }))
        );
        assert_eq!(
            parse_str("redis --no-stdin --replicas 1 --masters 4"),
            Ok(Invocation::Redis(RedisOptions {
                masters: 4,
                replicas_per_master: 1,
                watch_stdin: false
            }))
        );
        assert_eq!(
            parse_str("bench all -- --quick"),
            Ok(Invocation::Bench {
                target: BenchTarget::All,
                bench_args: vec!["--quick".to_owned()]
            })
        );
        assert_eq!(BenchTarget::All.expand().len(), 4);
        assert_eq!(parse_str("--help"), Ok(Invocation::Help));
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        for line in [
            "",
            "tset",
            "test --lint",
            "redis --bogus",
            "redis -- x",
            "redis --masters",
            "redis --masters 0",
            "redis --replicas x",
            "redis --replicas 101",
            "bench",
            "bench gpu",
            "bench core redis",
        ] {
            assert!(parse_str(line).is_err(), "{line:?} should be rejected");
        }
    }
}
