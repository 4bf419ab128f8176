//! `cargo xtask`: the project's task runner (see `cargo xtask help`).
//!
//! - `cargo xtask test` (alias `ci`) is the one test command of the README
//!   and CI: the checks of [`lint`] (formatting, clippy, rustdoc under both
//!   feature sets, the facade's public API against `api/portcullis.txt`
//!   ([`public_api`]), each feature alone, packaging, rust-version), then
//!   `cargo test --no-fail-fast --workspace` against real
//!   `redis-server` processes (a standalone server and a Redis Cluster)
//!   started on free ports and announced through `PORTCULLIS_REDIS_*`
//!   environment variables.
//! - `cargo xtask redis` starts the same servers for a local shell.
//! - `cargo xtask bench <core|redis|http|scale|all>` runs the benches.
//! - `cargo xtask public-api [--bless]` prints (or writes) the facade's
//!   public items.
//! - `cargo xtask doc-examples` compiles every doc example in a project
//!   with only the README quick start's dependencies ([`doc_examples`]).
//!
//! The server management lives in [`redis`] (plain servers) and
//! [`secure`] (TLS, ACL and Sentinel) so that later commands can reuse it.
//! xtask's only dependency is rcgen (test certificates), so it compiles in
//! seconds once ring is built.

mod args;
mod doc_examples;
mod envoy;
mod lint;
mod long;
mod public_api;
mod redis;
mod resp;
mod secure;
mod sentinel;

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use args::{BenchTarget, Invocation, RedisOptions, TestOptions, USAGE};
use redis::{Cluster, Standalone, Tools};
use secure::{Secure, TlsCluster};
use sentinel::SentinelSet;

/// Masters of the Cluster that `test` and `redis` start.
const CLUSTER_MASTERS: usize = 3;

/// A failure of an xtask command: a message saying what went wrong and
/// what to do.
#[derive(Debug)]
pub(crate) struct Error {
    /// The message, printed as `error: <message>`.
    message: String,
}

impl Error {
    /// An error with `message`.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The result type of xtask's fallible functions.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = long::dispatch(&args) {
        return code;
    }
    let invocation = match args::parse(&args) {
        Ok(invocation) => invocation,
        Err(error) => {
            eprintln!("error: {error}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match invocation {
        Invocation::Help => {
            print!("{USAGE}");
            Ok(())
        }
        Invocation::Test(options) => test(&options),
        Invocation::Redis(options) => serve_redis(options),
        Invocation::Bench { target, bench_args } => bench(target, &bench_args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("\nerror: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of xtask's own directory, taken from
/// `CARGO_MANIFEST_DIR` as `cargo run` sets it at run time (so a binary
/// built from another checkout sharing the target directory still works on
/// this one), else as it was at compile time.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.clone(), Path::to_path_buf)
}

/// `cargo xtask test` / `ci`.
fn test(options: &TestOptions) -> Result<()> {
    let tools = Tools::discover()?;
    println!(
        "xtask: using {} ({})",
        tools.server.display(),
        tools.server_version()
    );
    if tools.promtool.is_none() {
        eprintln!(
            "xtask: WARNING: promtool not found on PATH: the metrics export test \
             (metrics-dashboard) will FAIL; install it with `apt-get install prometheus` \
             (Debian's package provides promtool)"
        );
    }
    let evalsha_stage = usize::from(options.cargo_args.is_empty());
    let mut stages = Stages::new(if options.lint { lint::STAGES } else { 0 } + 3 + evalsha_stage);
    let result = run_test_stages(options, &tools, &mut stages);
    stages.print_summary();
    result
}

/// The stages of `test`, in order; servers are stopped when this returns,
/// whether a stage failed or not (and on panic: they are dropped while
/// unwinding).
fn run_test_stages(options: &TestOptions, tools: &Tools, stages: &mut Stages) -> Result<()> {
    if options.lint {
        lint::run(stages)?;
    }
    let servers = stages.run(
        "start Redis (standalone, Cluster, TLS + ACL, TLS Cluster, Sentinel, TLS Sentinel)",
        || Servers::start(tools, CLUSTER_MASTERS, 0),
    )?;
    let mut env = servers.env();
    env.extend(tools.env());
    env.extend(envoy::env());
    for (name, value) in &env {
        println!("    {name}={value}");
    }
    let mut test_args = options.cargo_test_args();
    let skips = version_skips(&tools.server_version());
    add_skips(&mut test_args, &skips);
    let shown = format!("cargo {}", test_args.join(" "));
    let test_result = stages.run(&shown, || {
        let args: Vec<&str> = test_args.iter().map(String::as_str).collect();
        run_cargo(
            &args,
            &env,
            "tests failed (see above); rerun one crate quickly with \
             `cargo xtask test --no-lint -- -p <crate>`",
        )
    });
    // The full run also decides the Redis correctness suites on the EVALSHA
    // fallback (Redis Functions are the default path above).
    let evalsha_result = if options.cargo_args.is_empty() {
        let mut evalsha_env = env.clone();
        evalsha_env.push(("PORTCULLIS_REDIS_CALL_PATH", "evalsha".to_owned()));
        // `--workspace`, as the stage above: selecting the tests package
        // alone unifies the dependencies' features differently and rebuilds
        // Tokio, Axum and the tests (about a minute of CI's 2 cores); the
        // two binaries are the tests package's only.
        let mut args: Vec<String> = [
            "test",
            "--no-fail-fast",
            "--workspace",
            "--test",
            EVALSHA_BINARY,
            "--test",
            EVALSHA_TOKENS,
        ]
        .map(str::to_owned)
        .to_vec();
        add_skips(&mut args, &skips);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let title = format!(
            "cargo {} (EVALSHA path: {}, and the token reservations)",
            args.join(" "),
            EVALSHA_SUITES.join(", ")
        );
        stages.run(&title, || {
            run_cargo(
                &args,
                &evalsha_env,
                "the Redis suites failed on the EVALSHA path (see above); rerun with \
                 PORTCULLIS_REDIS_CALL_PATH=evalsha after `cargo xtask redis`",
            )
        })
    } else {
        Ok(())
    };
    stages.run("stop Redis", || {
        servers.stop();
        Ok(())
    })?;
    test_result.and(evalsha_result)
}

/// Tests that need what a server older than Redis 7 lacks (Redis Functions,
/// `allow-oom` scripts), each with the reason, for the server whose
/// `--version` line is `version`; empty for Redis 7, Valkey and anything
/// whose version is not read. Printed by name when skipped.
fn version_skips(version: &str) -> Vec<&'static str> {
    let major = version
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok());
    match major {
        Some(major) if major < 7 => {
            let skipped = FUNCTIONS_ONLY.to_vec();
            println!(
                "xtask: {version}: no Redis Functions and no allow-oom scripts before Redis 7; \
                 skipping {} tests that need them: {}",
                skipped.len(),
                skipped.join(", ")
            );
            skipped
        }
        _ => Vec::new(),
    }
}

/// The tests of Redis Functions and of `allow-oom` scripts (Redis 7): the
/// ones a Redis 6.2 run skips, by their full names (`<module>::<test>` for
/// a suite that is a module of a merged test binary such as
/// `tests/tests/redis_paths/`; `test_names_exist` holds each one real).
const FUNCTIONS_ONLY: [&str; 26] = [
    "functions_are_the_default_and_the_library_is_loaded",
    "an_acl_user_granted_the_documented_function_rules_runs_on_functions",
    "an_acl_without_functions_falls_back_to_evalsha",
    "function_flush_mid_run_is_survived",
    "function_flush_on_the_cluster_is_survived",
    "a_failover_to_a_node_without_the_library_is_survived",
    "out_of_memory_on_both_paths",
    "the_fast_gcra_function_agrees_with_the_general_check",
    "redis_full_start::a_store_builds_on_a_full_redis_and_loads_the_library_once_there_is_room",
    "redis_full_start::a_cluster_node_full_before_it_ever_loaded_the_library",
    "concurrency_limit::out_of_memory_keeps_held_subjects_and_refuses_new_ones",
    "coalesced_checks_decide_as_checks_sent_one_by_one",
    "redis_coalesce_timeout::a_waiting_check_gets_its_batch_answer_or_is_not_charged",
    "redis_budget::three_processes_with_leases_stay_within_the_stated_bound",
    "redis_budget_evalsha::the_grant_script_answers_as_the_grant_function",
    "redis_budget_evalsha::a_store_refused_functions_mid_life_keeps_its_budget_on_scripts",
    "redis_budget_evalsha::at_maxmemory_the_grant_script_s_twin_serves_held_subjects",
    "the_fast_token_bucket_function_agrees_with_the_general_check",
    "the_fast_fixed_window_function_agrees_with_the_general_check",
    "the_fast_leaky_meter_function_agrees_with_the_general_check",
    "the_fast_sliding_window_function_agrees_with_the_general_check",
    "the_fast_leaky_queue_function_agrees_with_the_general_check",
    "the_fast_sliding_log_function_agrees_with_the_general_check",
    "redis_budget_reset::a_reset_is_obeyed_at_once_here_and_within_one_lease_period_by_another_process",
    "redis_budget_reset::a_plan_raised_a_hundredfold_under_the_same_name_is_obeyed_by_both_processes",
    "redis_budget_reset::a_daily_quota_leased_for_an_hour_takes_no_more_than_an_hour_of_it",
];

/// Appends `--skip <name>` for each of `skips` to a `cargo test` command
/// line (after its `--`, added if missing), matching names exactly.
fn add_skips(args: &mut Vec<String>, skips: &[&str]) {
    if skips.is_empty() {
        return;
    }
    if !args.iter().any(|arg| arg == "--") {
        args.push("--".to_owned());
    }
    for name in skips {
        args.extend(["--skip".to_owned(), (*name).to_owned()]);
    }
    args.push("--exact".to_owned());
}

/// The test binary of the Redis suites that `test` runs a second time on
/// the `EVALSHA` path (`PORTCULLIS_REDIS_CALL_PATH=evalsha`: their stores
/// log in as an ACL user without Redis Functions): `tests/tests/redis_paths/`,
/// whose modules are [`EVALSHA_SUITES`].
const EVALSHA_BINARY: &str = "redis_paths";

/// The token reservations' test binary (`tests/tests/tokens/`), also run
/// on the `EVALSHA` path: reservations take the library's function by
/// default and the script where Redis refuses Functions.
const EVALSHA_TOKENS: &str = "tokens";

/// The suites of [`EVALSHA_BINARY`], one module each
/// (`evalsha_suites_are_the_modules_of_their_binary` holds the two equal).
const EVALSHA_SUITES: [&str; 11] = [
    "charge_after_response",
    "redis_differential",
    "redis_compat",
    "redis_ttl",
    "redis_policy_change",
    "redis_magnitudes",
    "redis_bad_input",
    "redis_concurrency",
    "redis_restart",
    "concurrency_limit",
    "redis_options",
];

/// The servers `test` and `redis` start; dropping them stops them.
#[derive(Debug)]
struct Servers {
    /// The standalone server.
    standalone: Option<Standalone>,
    /// The Cluster.
    cluster: Option<Cluster>,
    /// The TLS Cluster (dropped before `secure`: it reads its certificates).
    tls_cluster: Option<TlsCluster>,
    /// The TLS servers with their ACL user.
    secure: Option<Secure>,
    /// The Sentinel-managed primary.
    sentinel: Option<SentinelSet>,
    /// The same over TLS (dropped before `secure`: it reads its
    /// certificates).
    tls_sentinel: Option<SentinelSet>,
}

impl Servers {
    /// Starts a standalone server and a Cluster.
    fn start(tools: &Tools, masters: usize, replicas_per_master: usize) -> Result<Self> {
        let standalone = Standalone::start(tools)?;
        eprintln!("    standalone server: {}", standalone.url());
        let cluster = Cluster::start(tools, masters, replicas_per_master)?;
        eprintln!("    Cluster masters:   {}", cluster.urls().join(" "));
        if replicas_per_master > 0 {
            eprintln!("    Cluster nodes:     {}", cluster.node_urls().join(" "));
        }
        let mut servers = Self {
            standalone: Some(standalone),
            cluster: Some(cluster),
            tls_cluster: None,
            secure: None,
            sentinel: None,
            tls_sentinel: None,
        };
        let secure = Secure::start(tools)?;
        eprintln!(
            "    TLS + ACL servers: started (PORTCULLIS_REDIS_TLS_URL, PORTCULLIS_REDIS_MTLS_URL)"
        );
        let tls_cluster = TlsCluster::start(tools, &secure)?;
        eprintln!("    TLS Cluster:       3 masters (PORTCULLIS_REDIS_TLS_CLUSTER_URLS)");
        servers.tls_cluster = Some(tls_cluster);
        let tls_sentinel = SentinelSet::start_tls(tools, secure.certs())?;
        eprintln!(
            "    TLS Sentinel set:  primary + replica + 3 Sentinels (PORTCULLIS_REDIS_TLS_SENTINEL_URLS)"
        );
        servers.tls_sentinel = Some(tls_sentinel);
        servers.secure = Some(secure);
        let sentinel = SentinelSet::start(tools)?;
        eprintln!("    Sentinel set:      primary + replica + 3 Sentinels");
        servers.sentinel = Some(sentinel);
        Ok(servers)
    }

    /// `PORTCULLIS_REDIS_URL` and `PORTCULLIS_REDIS_CLUSTER_URLS`.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(standalone) = &self.standalone {
            env.extend(standalone.env());
        }
        if let Some(cluster) = &self.cluster {
            env.extend(cluster.env());
        }
        if let Some(secure) = &self.secure {
            env.extend(secure.env());
            if let Some(tls_cluster) = &self.tls_cluster {
                env.extend(tls_cluster.env(secure));
            }
        }
        if let Some(sentinel) = &self.sentinel {
            env.extend(sentinel.env());
        }
        if let Some(sentinel) = &self.tls_sentinel {
            env.extend(sentinel.tls_env());
        }
        env
    }

    /// Stops every server (the same as dropping, said out loud).
    fn stop(self) {
        drop(self);
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if self.standalone.is_some() || self.cluster.is_some() {
            eprintln!("xtask: stopping the Redis servers");
        }
        drop(self.sentinel.take());
        drop(self.tls_sentinel.take());
        drop(self.tls_cluster.take());
        drop(self.secure.take());
        drop(self.standalone.take());
        drop(self.cluster.take());
    }
}

/// `cargo xtask redis`: start servers, print exports, wait.
fn serve_redis(options: RedisOptions) -> Result<()> {
    let tools = Tools::discover()?;
    eprintln!(
        "xtask: starting {} ({})",
        tools.server.display(),
        tools.server_version()
    );
    let servers = Servers::start(&tools, options.masters, options.replicas_per_master)?;
    let mut env = servers.env();
    env.extend(tools.env());
    redis::write_exports(&mut io::stdout().lock(), &env)
        .map_err(|e| Error::new(format!("could not write to stdout: {e}")))?;
    if options.watch_stdin {
        eprintln!(
            "xtask: Redis is running; paste the export lines above into your shell. \
             Stop with Ctrl-C or Ctrl-D (end of stdin)."
        );
        // Discard input until EOF; a read error also ends the wait.
        let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
    } else {
        eprintln!("xtask: Redis is running; stop with Ctrl-C or by killing this process.");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    servers.stop();
    eprintln!("xtask: stopped");
    Ok(())
}

/// One criterion bench `cargo xtask bench` knows.
#[derive(Debug, Clone, Copy)]
struct Bench {
    /// The package.
    package: &'static str,
    /// The package's directory, relative to the workspace root.
    dir: &'static str,
    /// The bench target name (`benches/<name>.rs`).
    name: &'static str,
    /// Whether it needs a Redis server.
    needs_redis: bool,
}

impl Bench {
    /// The bench for a single target.
    fn of(target: BenchTarget) -> Self {
        match target {
            // `All` never reaches here (`BenchTarget::expand` splits it).
            BenchTarget::Core | BenchTarget::All => Self {
                package: "portcullis-core",
                dir: "crates/portcullis-core",
                name: "memory_cost",
                needs_redis: false,
            },
            BenchTarget::Redis => Self {
                package: "portcullis-redis",
                dir: "crates/portcullis-redis",
                name: "redis_throughput",
                needs_redis: true,
            },
            BenchTarget::Http => Self {
                package: "portcullis-tower",
                dir: "crates/portcullis-tower",
                name: "http_throughput",
                needs_redis: true,
            },
            // Starts its own servers; the tools' environment names the
            // redis-server binary.
            BenchTarget::Envoy => Self {
                package: "portcullis-envoy",
                dir: "crates/portcullis-envoy",
                name: "rls_redis",
                needs_redis: true,
            },
            // A binary, not a criterion bench: it starts its own servers.
            BenchTarget::Scale => Self {
                package: "portcullis-tests",
                dir: "tests",
                name: "scale",
                needs_redis: false,
            },
        }
    }

    /// Whether it is a binary (`src/bin/<name>.rs`, run with `cargo run
    /// --release`) rather than a criterion bench.
    fn is_binary(self) -> bool {
        self.dir == "tests"
    }

    /// The bench's source file, relative to the workspace root.
    fn source(self) -> String {
        if self.is_binary() {
            format!("{}/src/bin/{}.rs", self.dir, self.name)
        } else {
            format!("{}/benches/{}.rs", self.dir, self.name)
        }
    }
}

/// `cargo xtask bench <target>`.
fn bench(target: BenchTarget, bench_args: &[String]) -> Result<()> {
    let benches: Vec<Bench> = target.expand().iter().map(|t| Bench::of(*t)).collect();
    // Check every file first: `all` should not run for minutes, then fail.
    for bench in &benches {
        if !workspace_root().join(bench.source()).is_file() {
            return Err(Error::new(format!(
                "the bench {} does not exist yet: add it (with a `[[bench]] name = \"{}\" \
                 harness = false` entry in {}/Cargo.toml), or pick another target",
                bench.source(),
                bench.name,
                bench.dir
            )));
        }
    }
    let tools = if benches.iter().any(|b| b.needs_redis) {
        Some(Tools::discover()?)
    } else {
        None
    };
    let mut stages = Stages::new(benches.len());
    let result = benches.iter().try_for_each(|bench| {
        let mut args = if bench.is_binary() {
            vec!["run", "--release", "-p", bench.package, "--bin", bench.name]
        } else {
            vec!["bench", "-p", bench.package, "--bench", bench.name]
        };
        if !bench_args.is_empty() {
            args.push("--");
            args.extend(bench_args.iter().map(String::as_str));
        }
        let shown = format!("cargo {}", args.join(" "));
        stages.run(&shown, || {
            // A fresh server per bench, so one bench's keys never affect another.
            let server = match (&tools, bench.needs_redis) {
                (Some(tools), true) => Some(Standalone::start(tools)?),
                _ => None,
            };
            let mut env = Vec::new();
            if let (Some(tools), Some(server)) = (&tools, &server) {
                println!("    redis-server: {}", server.url());
                env.extend(server.env());
                env.extend(tools.env());
            }
            run_cargo(&args, &env, "the bench failed (see above)")
        })
    });
    stages.print_summary();
    result
}

/// Runs `cargo <args>` in the workspace root with `env` added, failing with
/// `hint` when cargo does not succeed.
pub(crate) fn run_cargo(args: &[&str], env: &[(&str, String)], hint: &str) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let shown = format!("cargo {}", args.join(" "));
    println!("$ {shown}");
    let _ = io::stdout().flush();
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .current_dir(workspace_root())
        .status()
        .map_err(|e| {
            Error::new(format!(
                "could not run `{shown}` ({}): {e}",
                cargo.to_string_lossy()
            ))
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::new(format!("`{shown}` failed ({status}): {hint}")))
    }
}

/// Numbered stages with a header, the elapsed time of each, and a summary.
#[derive(Debug)]
pub(crate) struct Stages {
    /// How many stages the command has.
    total: usize,
    /// Finished stages: title, elapsed time, whether it succeeded.
    finished: Vec<(String, Duration, bool)>,
}

impl Stages {
    /// A command with `total` stages.
    fn new(total: usize) -> Self {
        Self {
            total,
            finished: Vec::new(),
        }
    }

    /// Runs one stage: prints its header, runs `body`, prints the outcome
    /// and elapsed time.
    pub(crate) fn run<T>(&mut self, title: &str, body: impl FnOnce() -> Result<T>) -> Result<T> {
        let number = self.finished.len() + 1;
        println!("\n==> [{number}/{}] {title}", self.total);
        let _ = io::stdout().flush();
        let started = Instant::now();
        let result = body();
        let elapsed = started.elapsed();
        let outcome = if result.is_ok() { "ok" } else { "FAILED" };
        println!(
            "<== [{number}/{}] {title}: {outcome} in {}",
            self.total,
            seconds(elapsed)
        );
        self.finished
            .push((title.to_owned(), elapsed, result.is_ok()));
        result
    }

    /// Prints every finished stage with its time, and the total.
    fn print_summary(&self) {
        println!("\nxtask summary:");
        for (title, elapsed, ok) in &self.finished {
            let outcome = if *ok { "ok    " } else { "FAILED" };
            println!("  {outcome} {:>8}  {title}", seconds(*elapsed));
        }
        let total: Duration = self.finished.iter().map(|(_, elapsed, _)| *elapsed).sum();
        println!("  total  {:>8}", seconds(total));
        let _ = io::stdout().flush();
    }
}

/// A duration as `12.3s`.
fn seconds(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_record_outcomes_and_pass_results_through() {
        let mut stages = Stages::new(2);
        assert_eq!(stages.run("one", || Ok(7)).unwrap(), 7);
        let failed: Result<()> = stages.run("two", || Err(Error::new("boom")));
        assert_eq!(failed.unwrap_err().to_string(), "boom");
        let outcomes: Vec<(&str, bool)> = stages
            .finished
            .iter()
            .map(|(title, _, ok)| (title.as_str(), *ok))
            .collect();
        assert_eq!(outcomes, [("one", true), ("two", false)]);
    }

    #[test]
    fn bench_sources_point_into_their_crates() {
        assert_eq!(
            Bench::of(BenchTarget::Redis).source(),
            "crates/portcullis-redis/benches/redis_throughput.rs"
        );
        assert_eq!(
            Bench::of(BenchTarget::Core).source(),
            "crates/portcullis-core/benches/memory_cost.rs"
        );
        assert!(!Bench::of(BenchTarget::Core).needs_redis);
        assert!(Bench::of(BenchTarget::Http).needs_redis);
        assert_eq!(
            Bench::of(BenchTarget::Envoy).source(),
            "crates/portcullis-envoy/benches/rls_redis.rs"
        );
    }

    #[test]
    fn only_servers_before_redis_7_skip_tests_and_by_exact_name() {
        assert!(version_skips("Redis server v=7.0.15 sha=00000000:0").is_empty());
        assert!(version_skips("Valkey server v=8.0.1 sha=00000000:1").is_empty());
        assert!(version_skips("unknown version").is_empty());
        let skips = version_skips("Redis server v=6.2.16 sha=00000000:0");
        assert_eq!(skips.len(), FUNCTIONS_ONLY.len());
        let mut args = vec!["test".to_owned(), "--workspace".to_owned()];
        add_skips(&mut args, &skips[..1]);
        assert_eq!(
            args.join(" "),
            format!("test --workspace -- --skip {} --exact", FUNCTIONS_ONLY[0])
        );
        let mut args = vec!["test".to_owned(), "--".to_owned(), "--nocapture".to_owned()];
        add_skips(&mut args, &[]);
        assert_eq!(args.join(" "), "test -- --nocapture");
    }

    /// The suite modules `tests/tests/<binary>/main.rs` declares.
    fn modules_of(binary: &str) -> Vec<String> {
        let main = workspace_root()
            .join("tests/tests")
            .join(binary)
            .join("main.rs");
        let text = std::fs::read_to_string(&main).unwrap();
        let mut modules = Vec::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.starts_with("#[path") {
                lines.next(); // a shared helper module, not a suite
            } else if let Some(name) = line.strip_prefix("mod ") {
                modules.push(name.trim_end_matches(';').to_owned());
            }
        }
        modules
    }

    #[test]
    fn evalsha_suites_are_the_modules_of_their_binary() {
        let mut listed: Vec<String> = EVALSHA_SUITES.iter().map(|s| (*s).to_owned()).collect();
        listed.sort();
        let mut modules = modules_of(EVALSHA_BINARY);
        modules.sort();
        assert_eq!(listed, modules);
    }

    #[test]
    fn test_names_exist() {
        let tests = workspace_root().join("tests/tests");
        for name in FUNCTIONS_ONLY {
            let (module, function) = name.split_once("::").unwrap_or(("", name));
            let files: Vec<PathBuf> = if module.is_empty() {
                std::fs::read_dir(&tests)
                    .unwrap()
                    .map(|entry| entry.unwrap().path())
                    .filter(|path| path.extension().is_some_and(|e| e == "rs"))
                    .collect()
            } else {
                std::fs::read_dir(&tests)
                    .unwrap()
                    .map(|entry| entry.unwrap().path().join(format!("{module}.rs")))
                    .filter(|path| path.is_file())
                    .collect()
            };
            let defined = files.iter().any(|file| {
                std::fs::read_to_string(file)
                    .unwrap()
                    .contains(&format!("fn {function}("))
            });
            assert!(defined, "{name}: no such test in {}", tests.display());
        }
    }

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(workspace_root().join("xtask").is_dir());
    }
}
