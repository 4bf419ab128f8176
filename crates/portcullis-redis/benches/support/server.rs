//! A redis-server that a bench starts and owns: on a free port, pinned to
//! core 0 with `taskset`, optionally under valgrind's callgrind, with the
//! instructions it ran between two reads (`callgrind_control -d`) and its
//! CPU time. Shared by `redis_throughput` and portcullis-envoy's
//! `rls_redis` (included with `#[path]`): each uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A redis-server the bench owns (killed on drop), pinned to core 0.
pub(crate) struct Server {
    child: Child,
    port: u16,
    callgrind_out: Option<PathBuf>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(out) = &self.callgrind_out {
            let _ = std::fs::remove_file(out);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Server {
    /// Starts `$PORTCULLIS_REDIS_SERVER` (else `redis-server` on the
    /// path) on a free port, under callgrind when `callgrind`.
    pub(crate) fn start(callgrind: bool) -> Self {
        let bin =
            std::env::var("PORTCULLIS_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let port = free_port();
        let out = std::env::temp_dir().join(format!("portcullis-bench-callgrind.{port}"));
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0"]);
        if callgrind {
            cmd.args([
                "valgrind",
                "--tool=callgrind",
                "--dump-instr=no",
                &format!("--callgrind-out-file={}", out.display()),
            ]);
        }
        cmd.arg(&bin).args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--hz",
            "1",
        ]);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {bin} under taskset: {e}"));
        let server = Self {
            child,
            port,
            callgrind_out: callgrind.then_some(out),
        };
        let client = redis::Client::open(server.url()).expect("a URL");
        for _ in 0..300 {
            if let Ok(mut c) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{bin} did not answer within 30 s");
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Instructions the server ran since the last call (callgrind dumps
    /// and zeroes its counters).
    pub(crate) fn instructions(&self) -> u64 {
        let out = self.callgrind_out.as_ref().expect("a callgrind server");
        let dumped = Command::new("callgrind_control")
            .args(["-d", &self.child.id().to_string()])
            .output()
            .expect("callgrind_control runs");
        assert!(dumped.status.success(), "callgrind_control -d failed");
        // Each dump is a file `<out>.<n>`; the newest holds the counts.
        let dir = out.parent().expect("a directory");
        let stem = out
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let newest = std::fs::read_dir(dir)
            .expect("temp dir")
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{stem}."))
            })
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .expect("a callgrind dump");
        let text = std::fs::read_to_string(newest.path()).expect("a readable dump");
        let _ = std::fs::remove_file(newest.path());
        text.lines()
            .find_map(|l| {
                l.strip_prefix("summary: ")
                    .or_else(|| l.strip_prefix("totals: "))
            })
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
            .expect("a summary line in the dump")
    }

    /// CPU seconds (user and system) the server has used so far
    /// (`taskset` execs the server in its own process); `None` where
    /// there is no `/proc`.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds_of(&self.child.id().to_string())
    }
}

/// CPU seconds (user and system) process `pid` (or `self`) has used so
/// far, from `/proc/<pid>/stat`; `None` where there is no `/proc`.
pub(crate) fn cpu_seconds_of(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces): the
    // state is the first, utime the 12th, stime the 13th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(100);
    Some(ticks as f64 / per_second as f64)
}
