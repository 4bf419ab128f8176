//! The `portcullis` binary, run as an operator runs it: `with_redis.rs`
//! against the real Redis that `cargo xtask test` starts
//! (`PORTCULLIS_REDIS_URL`; missing, those tests fail loudly),
//! `deployments.rs` against its Cluster, TLS and Sentinel servers,
//! `offline.rs` what needs no server (limits files, bad input, the
//! tool's README's help), `top.rs` the apps' most-denied tables merged.
//! This file owns the helpers they share.

mod deployments;
mod offline;
mod top;
mod with_redis;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The binary, with no Redis from the environment and stdin closed (not
/// a terminal).
fn portcullis(args: &[&str]) -> Output {
    run(args, None)
}

/// The binary with `PORTCULLIS_REDIS_URL` set to `url`.
fn portcullis_with_env(args: &[&str], url: &str) -> Output {
    run(args, Some(url))
}

/// The binary reading `input` on stdin (a pipe, not a terminal).
fn portcullis_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .env_remove("PORTCULLIS_REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary should start");
    let mut stdin = child.stdin.take().expect("piped stdin");
    // The binary may stop reading early (it reads a bounded line).
    if let Err(error) = stdin.write_all(input.as_bytes()) {
        assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe, "{error}");
    }
    drop(stdin);
    finished(
        args,
        child.wait_with_output().expect("the binary should run"),
    )
}

fn run(args: &[&str], env_url: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_portcullis"));
    command
        .args(args)
        .env_remove("PORTCULLIS_REDIS_URL")
        .stdin(Stdio::null());
    if let Some(url) = env_url {
        command.env("PORTCULLIS_REDIS_URL", url);
    }
    finished(args, command.output().expect("the binary should start"))
}

fn finished(args: &[&str], output: Output) -> Output {
    // A panic exits with 101: never an answer to any input.
    assert_ne!(
        output.status.code(),
        Some(101),
        "portcullis {args:?} panicked: {}",
        stderr(&output)
    );
    output
}

fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .expect("the binary should exit, not be killed")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The JSON report on stdout.
fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "stdout is not JSON ({error}); exit {:?}\nstdout: {}\nstderr: {}",
            output.status.code(),
            stdout(output),
            stderr(output)
        )
    })
}

/// A file of `text` in a directory of this test run.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("portcullis-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).expect("temp file");
    file.write_all(text.as_bytes()).expect("write temp file");
    path
}

fn path_str(path: &std::path::Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// The test server's URL.
///
/// # Panics
///
/// When it is not set: never skip silently.
fn redis_url() -> String {
    required("PORTCULLIS_REDIS_URL")
}

/// A variable `cargo xtask test` sets.
///
/// # Panics
///
/// When it is not set: never skip silently.
fn required(name: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => value,
        _ => panic!(
            "{name} is not set: these tests need the Redis servers that `cargo xtask test` \
             starts; run `cargo xtask test`, or `cargo xtask redis` and export what it prints"
        ),
    }
}

/// A prefix no other test (or run) uses, inside the keys the test
/// servers' ACL user may touch (`pc-test*`).
fn prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("pc-test-cli-{test}-{}-{nanos}", std::process::id())
}
