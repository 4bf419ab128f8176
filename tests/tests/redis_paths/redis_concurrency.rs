//! Concurrency: two OS processes (the `hammer` binary), each with many
//! tasks, hammer one key whose policy admits N inside one window; together
//! they are admitted exactly N times, for every algorithm, on a standalone
//! server and on the Cluster.

use std::io::{Read as _, Write as _};
use std::process::{Child, Command, Output};

use portcullis_core::Algorithm;
use portcullis_tests::unique_prefix;

const PROCESSES: usize = 2;
const TASKS: u64 = 16;
const ATTEMPTS: u64 = 25;
const LIMIT: u64 = 150;
/// A week: no window rolls and no bucket refills a whole permit
/// (7 days / 150 ≈ 67 minutes) while the test runs.
const PERIOD_SECS: u64 = 7 * 86_400;

struct Counts {
    admitted: u64,
    denied: u64,
    errors: u64,
}

fn parse(output: &Output) -> Counts {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "hammer failed ({}): {stdout} {stderr}",
        output.status
    );
    let field = |name: &str| -> u64 {
        stdout
            .split_whitespace()
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("hammer printed no {name}: {stdout} {stderr}"))
    };
    Counts {
        admitted: field("admitted"),
        denied: field("denied"),
        errors: field("errors"),
    }
}

/// The first line a hammer prints (`ready`, or nothing if it failed first),
/// read a byte at a time so that the rest of its output stays in the pipe
/// for `wait_with_output`.
fn ready_line(child: &mut Child) -> String {
    let stdout = child.stdout.as_mut().expect("stdout is piped");
    let mut line = Vec::new();
    let mut byte = [0_u8; 1];
    while stdout.read(&mut byte).is_ok_and(|n| n == 1) && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).into_owned()
}

fn hammer_everything(target: &[&str], what: &str) {
    for algorithm in Algorithm::ALL {
        let prefix = unique_prefix(what);
        let mut children: Vec<_> = (0..PROCESSES)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_hammer"))
                    .args(target)
                    .args(["--prefix", &prefix, "--subject", "one-hot-key"])
                    .args(["--algorithm", algorithm.as_str()])
                    .args(["--limit", &LIMIT.to_string()])
                    .args(["--period-secs", &PERIOD_SECS.to_string()])
                    .args(["--tasks", &TASKS.to_string()])
                    .args(["--attempts", &ATTEMPTS.to_string()])
                    .args(["--start", "stdin"])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("the hammer binary should start")
            })
            .collect();
        // Both processes start hammering at the same moment, once both have
        // their connections open: one `go` each once both said `ready` (a
        // hammer that failed first says nothing and exits, and `parse`
        // shows why).
        let ready: Vec<String> = children.iter_mut().map(ready_line).collect();
        for child in &mut children {
            if let Some(mut stdin) = child.stdin.take() {
                // A hammer that already exited cannot read it.
                let _ = stdin.write_all(b"go\n");
            }
        }
        let outputs: Vec<Output> = children
            .into_iter()
            .map(|child| child.wait_with_output().expect("hammer should finish"))
            .collect();
        let counts: Vec<Counts> = outputs.iter().map(parse).collect();
        assert!(
            ready.iter().all(|line| line == "ready"),
            "{what} {algorithm}: every hammer says it is ready first: {ready:?}"
        );
        let admitted: u64 = counts.iter().map(|c| c.admitted).sum();
        let denied: u64 = counts.iter().map(|c| c.denied).sum();
        let errors: u64 = counts.iter().map(|c| c.errors).sum();
        assert_eq!(errors, 0, "{what} {algorithm}: calls failed (see stderr)");
        assert_eq!(
            admitted + denied,
            PROCESSES as u64 * TASKS * ATTEMPTS,
            "{what} {algorithm}: every attempt is answered"
        );
        assert_eq!(
            admitted,
            LIMIT,
            "{what} {algorithm}: exactly the limit is admitted (per process: {:?})",
            counts.iter().map(|c| c.admitted).collect::<Vec<_>>()
        );
        println!(
            "{what} {algorithm}: admitted per process {:?}",
            counts.iter().map(|c| c.admitted).collect::<Vec<_>>()
        );
    }
}

#[test]
fn two_processes_admit_exactly_the_limit() {
    let url = portcullis_tests::redis_url();
    hammer_everything(&["--url", &url], "hammer");
}

#[test]
fn two_processes_admit_exactly_the_limit_on_the_cluster() {
    let urls = portcullis_tests::cluster_urls().join(",");
    hammer_everything(&["--cluster", &urls], "hammer-cluster");
}
