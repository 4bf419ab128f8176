//! The long-running commands, kept out of `cargo xtask test`:
//!
//! - `cargo xtask soak [ARGS]`: a standalone server, then
//!   `cargo run --release -p portcullis-tests --bin soak -- ARGS` (mixed
//!   traffic across 100 000 subjects on the memory and Redis stores, memory
//!   figures printed; see `tests/src/bin/soak.rs` for its options).
//! - `cargo xtask reliability [ARGS]`: a standalone server and a Cluster of
//!   3 masters with 1 replica each, then
//!   `cargo run --release -p portcullis-tests --bin reliability -- ARGS`,
//!   which kills and stalls servers, fails over and migrates slots under
//!   load, fails a Sentinel-managed primary over (its own servers), and
//!   prints the reliability table with the recovery times.
//!
//! Servers are announced with the variables the test runner uses
//! (`PORTCULLIS_REDIS_URL`, `PORTCULLIS_REDIS_CLUSTER_URLS`, the tool paths),
//! plus `PORTCULLIS_REDIS_CLUSTER_NODE_URLS` (every Cluster node, replicas
//! included), and stopped when the command ends, however it ends.

use std::process::ExitCode;

use crate::redis::{Cluster, Standalone, Tools};
use crate::{run_cargo, Result};

/// Runs `soak`, `reliability`, `public-api` or `doc-examples` when `args` name one of them; `None` for
/// every other command (parsed by [`crate::args`]).
pub(crate) fn dispatch(args: &[String]) -> Option<ExitCode> {
    let (command, rest) = args.split_first()?;
    let result = match command.as_str() {
        "soak" => soak(rest),
        "reliability" => reliability(rest),
        "public-api" => crate::public_api::command(rest),
        "doc-examples" if rest.is_empty() => crate::doc_examples::check(),
        _ => return None,
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("\nerror: {error}");
            ExitCode::FAILURE
        }
    })
}

/// `cargo run --release -p portcullis-tests --bin <bin> -- <rest>` with `env`.
fn run_bin(bin: &str, rest: &[String], env: &[(&str, String)]) -> Result<()> {
    let mut args = vec!["run", "--release", "-p", "portcullis-tests", "--bin", bin];
    let rest: Vec<&str> = rest
        .iter()
        .map(String::as_str)
        .filter(|arg| *arg != "--")
        .collect();
    if !rest.is_empty() {
        args.push("--");
        args.extend(rest);
    }
    run_cargo(
        &args,
        env,
        &format!("`{bin}` reported a failure (see above)"),
    )
}

/// `cargo xtask soak`.
fn soak(rest: &[String]) -> Result<()> {
    let tools = Tools::discover()?;
    let server = Standalone::start(&tools)?;
    eprintln!("xtask: standalone server {}", server.url());
    let mut env = server.env();
    env.extend(tools.env());
    let result = run_bin("soak", rest, &env);
    drop(server);
    result
}

/// `cargo xtask reliability`.
fn reliability(rest: &[String]) -> Result<()> {
    let tools = Tools::discover()?;
    let standalone = Standalone::start(&tools)?;
    eprintln!("xtask: standalone server {}", standalone.url());
    let cluster = Cluster::start(&tools, 3, 1)?;
    eprintln!("xtask: Cluster nodes {}", cluster.node_urls().join(" "));
    let mut env = standalone.env();
    env.extend(cluster.env());
    env.push((
        "PORTCULLIS_REDIS_CLUSTER_NODE_URLS",
        cluster.node_urls().join(","),
    ));
    env.extend(tools.env());
    let result = run_bin("reliability", rest, &env);
    drop(cluster);
    drop(standalone);
    result
}
