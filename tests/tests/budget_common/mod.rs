//! A second OS process with a local budget, for the `redis_budget*` tests
//! (a module, not a test target): drives the `budget_worker` binary, a
//! `RedisStore` with `LocalBudget` on a client clock the test sets at each
//! step, checking one subject under a policy named `budget`.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// What a worker checks, and its budget.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) prefix: String,
    pub(crate) subject: String,
    pub(crate) limit: u64,
    pub(crate) period_ms: u64,
    pub(crate) burst: u64,
    pub(crate) max_permits: u64,
    pub(crate) lease_ms: u64,
}

/// One `budget_worker` process.
pub(crate) struct Worker {
    pub(crate) child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Worker {
    pub(crate) fn start(setup: &Setup) -> Self {
        Self::start_on(&portcullis_tests::redis_url(), setup)
    }

    /// [`Worker::start`] on the server at `url`.
    pub(crate) fn start_on(url: &str, setup: &Setup) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_budget_worker"))
            .args(["--url", url])
            .args(["--prefix", &setup.prefix, "--subject", &setup.subject])
            .args(["--limit", &setup.limit.to_string()])
            .args(["--period-ms", &setup.period_ms.to_string()])
            .args(["--burst", &setup.burst.to_string()])
            .args(["--max-permits", &setup.max_permits.to_string()])
            .args(["--lease-ms", &setup.lease_ms.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the budget_worker binary should start");
        let input = child.stdin.take().expect("piped stdin");
        let output = BufReader::new(child.stdout.take().expect("piped stdout"));
        Self {
            child,
            input,
            output,
        }
    }

    /// Sends one step: `checks` checks of cost 1 at `now` (µs of the
    /// client clock); [`Worker::admitted`] reads its answer.
    pub(crate) fn send(&mut self, now: u64, checks: u64) {
        self.send_line(&format!("{now} {checks}"));
    }

    /// Like [`Worker::send`], under a policy of `limit` and `burst` (same
    /// name and period) from this step on: a plan changed in place.
    pub(crate) fn send_plan(&mut self, now: u64, checks: u64, limit: u64, burst: u64) {
        self.send_line(&format!("{now} {checks} {limit} {burst}"));
    }

    fn send_line(&mut self, line: &str) {
        writeln!(self.input, "{line}")
            .and_then(|()| self.input.flush())
            .expect("the worker reads its steps");
    }

    /// How many checks of the step sent last were admitted (none failed).
    pub(crate) fn admitted(&mut self) -> u64 {
        let mut line = String::new();
        self.output
            .read_line(&mut line)
            .expect("the worker answers");
        let mut words = line.split_whitespace().map(|w| w.parse::<u64>());
        match (words.next(), words.next()) {
            (Some(Ok(admitted)), Some(Ok(0))) => admitted,
            _ => panic!("the worker answered {line:?} (errors are on stderr)"),
        }
    }

    /// One step, sent and answered.
    pub(crate) fn step(&mut self, now: u64, checks: u64) -> u64 {
        self.send(now, checks);
        self.admitted()
    }
}
