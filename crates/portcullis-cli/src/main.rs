//! `portcullis`, the operator's tool: reads a subject's rate-limit state
//! in Redis as the service's layer sees it, answers what a check would
//! answer without charging, resets a subject when asked, and validates and
//! compares limits files. This file owns the entry point: parsing the
//! command line, running the command, printing its report (for people or
//! as JSON) and the exit code.
//!
//! The modules, top-down (each uses only the ones below it): `commands`
//! (what each command does) → `limits` (validate, diff), `store` (the
//! store and raw reads of its keys) and `top` (the apps' most-denied
//! tables, fetched and merged) → `subject` (how an operator's subject
//! becomes the layer's key) → `report` (what is printed) → `failure`
//! (errors and exit codes) → `args` (the command line, a leaf).

// Never a panic on a caller's input or a server's reply: no `unwrap`,
// `expect`, `panic!` or `unreachable!` outside tests (clippy, which
// `cargo xtask test` runs with `-D warnings`).
#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

mod args;
mod commands;
mod failure;
mod limits;
mod report;
mod store;
mod subject;
mod top;

use std::io::Write as _;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser as _;

use crate::args::Cli;
use crate::failure::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    let json = cli.json;
    let outcome = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(commands::run(cli.command)),
        Err(error) => Err(Failure::runtime(&error)),
    };
    match outcome {
        Ok(report) => {
            let text = if json {
                report.to_json()
            } else {
                report.to_text()
            };
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`| head`) is no failure of the command.
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            report.exit_code()
        }
        Err(failure) => {
            let mut stderr = std::io::stderr().lock();
            if json {
                let _ = writeln!(stderr, "{}", failure.to_json());
            } else {
                let _ = writeln!(stderr, "error: {failure}");
            }
            failure.exit_code()
        }
    }
}

/// A command line clap refused (or `--help`, `--version`): as clap prints
/// it, or with `--json` as the JSON error the other failures give.
fn usage_error(error: &clap::Error) -> ExitCode {
    let asked = matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    );
    if asked || !std::env::args_os().any(|arg| arg == "--json") {
        // To stdout or stderr, and with the exit code, that clap chooses.
        let _ = error.print();
        return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
    }
    let message = error.render().to_string();
    let json = serde_json::json!({ "error": message.trim_end(), "exit_code": 2 });
    let _ = writeln!(std::io::stderr().lock(), "{json}");
    ExitCode::from(2)
}
