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
//! This file holds the entry point, the error type and the numbered
//! [`Stages`] every command prints. `test`'s stages after the lint are
//! [`test_stages`]; the servers it and `cargo xtask redis` start are
//! [`servers`], built from [`redis`] (plain servers), [`secure`] (TLS and
//! ACL) and [`sentinel`]; `cargo xtask bench` is [`bench`](mod@bench).
//! xtask's only dependency is rcgen (test certificates), so it compiles in
//! seconds once ring is built.

mod args;
mod bench;
mod doc_examples;
mod envoy;
mod lint;
mod long;
mod public_api;
mod redis;
mod resp;
mod secure;
mod sentinel;
mod servers;
mod test_stages;

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use args::{Invocation, USAGE};

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
        Invocation::Test(options) => test_stages::test(&options),
        Invocation::Redis(options) => servers::serve_redis(options),
        Invocation::Bench { target, bench_args } => bench::bench(target, &bench_args),
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
    fn workspace_root_holds_the_workspace_manifest() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(workspace_root().join("xtask").is_dir());
    }
}
