//! Requests per second with the load generator out of process: the bench
//! re-runs itself as a server (`PORTCULLIS_HTTP_SERVE=<config>,...`, one
//! Tokio thread, pinned to CPU 0 with `taskset`) serving every
//! configuration on its own port, and `wrk` (one thread, pinned to CPU 1)
//! loads one configuration at a time, the configurations taking turns
//! round after round (bare, portcullis, tower_governor, ...). Reported: the
//! median and range over rounds, the median of per-round ratios to the
//! bare server, and the server's CPU time per request (from
//! `/proc/<pid>/stat`), which other load on the machine disturbs less than
//! throughput.
//!
//! Tune with `PORTCULLIS_BENCH_SECS` (seconds per measurement, default 3),
//! `PORTCULLIS_BENCH_ROUNDS` (default 5) and `PORTCULLIS_BENCH_CONCURRENCY`
//! (connections, default 32).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The environment variable that makes the bench a server.
pub(crate) const SERVE: &str = "PORTCULLIS_HTTP_SERVE";

/// Whether `wrk` and `taskset` can be run.
pub(crate) fn available() -> bool {
    let runs = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    runs("wrk", "--version") && runs("taskset", "--version")
}

/// One wrk run.
struct Sample {
    per_second: f64,
    requests: u64,
    /// The server's CPU time (user + system) per request, in microseconds.
    cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

/// A wrk latency figure (`812.00us`, `1.20ms`, `2.01s`) in microseconds.
fn micros(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    Some(match unit {
        "us" => number,
        "ms" => number * 1e3,
        "s" => number * 1e6,
        _ => return None,
    })
}

fn parse(output: &str) -> Option<Sample> {
    let mut sample = Sample {
        per_second: f64::NAN,
        requests: 0,
        cpu_us: f64::NAN,
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        errors: 0,
    };
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", value] => sample.per_second = value.parse().ok()?,
            [n, "requests", "in", ..] => sample.requests = n.parse().ok()?,
            ["50%", value] => sample.p50_us = micros(value)?,
            ["99%", value] => sample.p99_us = micros(value)?,
            ["Non-2xx", "or", "3xx", "responses:", n] => sample.errors += n.parse::<u64>().ok()?,
            ["Socket", "errors:", ..] => sample.errors += 1,
            _ => {}
        }
    }
    sample.per_second.is_finite().then_some(sample)
}

/// CPU time (user + system) process `pid` has used, in clock ticks (100
/// per second on Linux).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split(' ').skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn wrk(server: u32, port: u16, connections: usize, secs: f64) -> Sample {
    let before = cpu_ticks(server);
    let output = Command::new("taskset")
        .args(["-c", "1", "wrk", "-t1", "--latency"])
        .arg(format!("-c{connections}"))
        .arg(format!("-d{}s", secs.max(1.0).round()))
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .expect("run wrk");
    let after = cpu_ticks(server);
    let text = String::from_utf8_lossy(&output.stdout);
    let mut sample = parse(&text).unwrap_or_else(|| panic!("cannot read wrk's output: {text}"));
    if let (Some(before), Some(after)) = (before, after)
        && sample.requests > 0
    {
        sample.cpu_us = (after - before) as f64 * 1e4 / sample.requests as f64;
    }
    sample
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The server child, started pinned to CPU 0; killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the comparison over `configs` (the first is the bare server) and
/// prints its table.
pub(crate) fn report(configs: &[&str]) {
    let secs: f64 = super::env_or("PORTCULLIS_BENCH_SECS", 3.0);
    let rounds: usize = super::env_or("PORTCULLIS_BENCH_ROUNDS", 5).max(1);
    let connections: usize = super::env_or("PORTCULLIS_BENCH_CONCURRENCY", 32).max(1);
    let exe = std::env::current_exe().expect("the bench's own path");
    let mut child = Command::new("taskset")
        .args(["-c", "0"])
        .arg(&exe)
        .env(SERVE, configs.join(","))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server");
    let stdout = child.stdout.take().expect("the server's stdout");
    let pid = child.id();
    let _server = Server(child);
    // The server prints `<config> <port>` per configuration, then `ready`.
    let mut ports = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("the server's output");
        if line == "ready" {
            break;
        }
        let (config, port) = line.split_once(' ').expect("<config> <port>");
        ports.push((config.to_owned(), port.parse::<u16>().expect("a port")));
    }
    assert_eq!(ports.len(), configs.len(), "the server did not start");

    println!();
    println!(
        "requests per second, wrk out of process: server on CPU 0 (one Tokio thread), \
         wrk -t1 -c{connections} on CPU 1, {secs} s per run, {rounds} rounds taking turns"
    );
    for (_, port) in &ports {
        let _ = wrk(pid, *port, connections, 1.0);
    }
    let mut samples: Vec<Vec<Sample>> = ports.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for ((config, port), runs) in ports.iter().zip(&mut samples) {
            let sample = wrk(pid, *port, connections, secs);
            eprintln!(
                "  round {} {config:<24} {:>9.0} req/s  server CPU {:>5.2} µs/request  p50 {:>7.0} µs  p99 {:>7.0} µs",
                round + 1,
                sample.per_second,
                sample.cpu_us,
                sample.p50_us,
                sample.p99_us
            );
            runs.push(sample);
        }
    }
    println!(
        "| configuration | req/s (median) | range | vs bare (median of rounds) | server CPU µs/request (median, range) | p50 | p99 | errors |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for ((config, _), runs) in ports.iter().zip(&samples) {
        let rates: Vec<f64> = runs.iter().map(|s| s.per_second).collect();
        let (low, high) = rates
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
        let ratios: Vec<f64> = runs
            .iter()
            .zip(&samples[0])
            .map(|(s, bare)| s.per_second / bare.per_second)
            .collect();
        let (rlow, rhigh) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
        let cpu: Vec<f64> = runs.iter().map(|s| s.cpu_us).collect();
        let (clow, chigh) = cpu
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), c| (l.min(*c), h.max(*c)));
        println!(
            "| {config} | {:.0} | {low:.0}–{high:.0} | {:.3} ({rlow:.3}–{rhigh:.3}) | {:.2} ({clow:.2}–{chigh:.2}) | {:.0} µs | {:.0} µs | {} |",
            median(rates.clone()),
            median(ratios),
            median(cpu.clone()),
            median(runs.iter().map(|s| s.p50_us).collect()),
            median(runs.iter().map(|s| s.p99_us).collect()),
            runs.iter().map(|s| s.errors).sum::<u64>()
        );
    }
}
