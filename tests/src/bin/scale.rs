//! `cargo xtask bench scale`: three instances of the quickstart's app on
//! one Redis, loaded out of process, on one hot subject and on 100 000
//! subjects: requests per second against the bare app, Redis calls and
//! Redis server instructions per request, checks per CPU second of Redis
//! and of the instances, p50 / p99, and the overshoot of a limited hot
//! subject against the bound the local budget states. The same on
//! `MemoryStore` (each instance its own), on Redis exact (one call per
//! check, coalesced) and on Redis with a local budget, the last two also
//! on the `EVALSHA` path (a user without Redis Functions).
//!
//! The app is the quickstart's (Hyper, `GET /` answering `hello`, the
//! `RateLimitLayer` keyed by `ClientIp` behind a trusted proxy, so the load
//! generator names the client in `X-Forwarded-For`), with the bench's
//! policy. Redis is pinned to CPU 0 with `taskset`; the instances and the
//! load generator share CPU 1 (a 2-core machine). Configurations take
//! turns, round after round, and medians over rounds are reported; server
//! instructions come from a second Redis under valgrind's callgrind (two
//! request counts, the difference divided by the difference in requests).
//! Checks per CPU second: the requests decided in a round (admitted or
//! limited) divided by the CPU seconds (user and system, from
//! `/proc/<pid>/stat`, one clock tick of resolution) the redis-server
//! process, and the three instances summed, spent in that round. Unlike
//! requests per wall-clock second it does not count time a process waited
//! for a core that something else on the machine held (it still moves with
//! how checks batch, which follows timing, and with caches and clock
//! speed). Redis' figure includes its own system calls (socket reads and
//! writes). Each round also prints how busy core 0 was with anything but
//! Redis (`/proc/stat`: other processes, interrupts), the interference
//! that figure does still feel.
//!
//! The flood row: one subject offered as much as 4 connections send, far
//! past a policy of 1 000 per second, on Redis exact and with the local
//! budget (Redis calls per request, and the worst window beside the bound).
//!
//! Modes of this binary (the bench runs itself): no argument runs the
//! bench; `flood` runs the flood row alone (`cargo xtask bench scale --
//! flood`); `serve ...` is one app instance; `load ...` is the load
//! generator. Tune with `PORTCULLIS_BENCH_SECS` (default 3) and
//! `PORTCULLIS_BENCH_ROUNDS` (default 3). Needs `redis-server` on PATH (or
//! `PORTCULLIS_REDIS_SERVER`), `taskset`, `valgrind` and
//! `callgrind_control`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use portcullis_core::Policy;
use portcullis_redis::LocalBudget;

#[path = "scale/app.rs"]
mod app;
#[path = "scale/procs.rs"]
mod procs;

use procs::{measured_load, run_load, Instances, Redis, Run};

const INSTANCES: usize = 3;
const CONNECTIONS: usize = 48;
const HOT: &str = "198.51.100.7";
const SUBJECTS: u64 = 100_000;
/// The local budget of the `budget` configuration.
const BUDGET_PERMITS: u64 = 64;
const BUDGET_LEASE_MS: u64 = 100;
/// The limited hot subject of the overshoot run: 2 000 per second, burst
/// 100, offered as much as the load generator sends.
const LIMITED: (u64, u64) = (2_000, 100);
const BUCKET_US: u64 = 10_000;
/// The flood row: one subject offered far past a 1 000-per-second policy
/// (its default burst) by 4 connections, as a new user would try it, on
/// Redis exact (coalesced) and with the local budget.
const FLOOD: (u64, u64) = (1_000, 1_000);
const FLOOD_CONNECTIONS: usize = 4;
const FLOOD_CONFIGS: [&str; 2] = ["redis", "budget"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => {
            portcullis_tests::option_pairs("scale", &args[1..]).and_then(|o| app::serve(&o))
        }
        Some("load") => {
            portcullis_tests::option_pairs("scale", &args[1..]).and_then(|o| app::load(&o))
        }
        None => bench(),
        Some("flood") => flood_only(),
        Some(other) => Err(format!(
            "unknown mode {other:?}: serve, load, flood (the flood row alone), or nothing"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("scale: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `median [low–high]` of per-round figures, `∞` for a round whose CPU
/// time was under one clock tick.
fn median_cell(values: Vec<f64>) -> String {
    let show = |v: f64| {
        if v.is_finite() {
            format!("{v:.0}")
        } else {
            "∞".to_owned()
        }
    };
    let (mid, low, high) = median(values);
    format!("{} [{}–{}]", show(mid), show(low), show(high))
}

fn median(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// The most admitted in any window of buckets beyond the exact policy's
/// envelope (burst plus one permit per emission interval), client-side
/// times.
fn worst_overshoot(buckets: &[u64], limit: u64, burst: u64) -> i64 {
    let interval_us = 1_000_000 / limit;
    let mut worst = i64::MIN;
    for i in 0..buckets.len() {
        let mut sum = 0_i64;
        for (j, n) in buckets.iter().enumerate().skip(i) {
            sum += *n as i64;
            // A window of buckets i..=j spans (j - i + 1) buckets.
            let span = (j - i + 1) as u64 * BUCKET_US;
            let exact = (burst + span / interval_us) as i64;
            worst = worst.max(sum - exact);
        }
    }
    worst
}

/// The configurations; every one from the third calls Redis, the
/// `-evalsha` ones as a user without Redis Functions (the `EVALSHA` path:
/// Redis 6.2, an ACL without `FCALL`, a node without room for the library).
const CONFIGS: [&str; 6] = [
    "bare",
    "memory",
    "redis",
    "budget",
    "redis-evalsha",
    "budget-evalsha",
];

fn bench() -> Result<(), String> {
    let (secs, rounds) = secs_and_rounds();
    let started = Instant::now();
    let open = (1_000_000, 1_000_000);
    println!("scale: {INSTANCES} instances per configuration, {CONNECTIONS} connections, {rounds} rounds of {secs} s");

    // 1. Requests per second, calls per request, latency.
    let redis = Redis::start(false)?;
    let instances: Vec<Instances> = CONFIGS
        .iter()
        .map(|c| Instances::start(c, Some(&redis), open, &format!("scale-{c}")))
        .collect::<Result<_, _>>()?;
    // [config][workload] -> runs
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); 2]; CONFIGS.len()];
    let mut calls: Vec<Vec<u64>> = vec![vec![0; 2]; CONFIGS.len()];
    for round in 0..rounds {
        for (w, hot) in [true, false].into_iter().enumerate() {
            for (c, instance) in instances.iter().enumerate() {
                let before = redis.calls();
                let run = measured_load(&redis, instance, hot, secs, CONNECTIONS)?;
                calls[c][w] += redis.calls() - before;
                println!(
                    "  round {} {:<14} {:<4} {:>8.0} req/s  ok {} limited {} other {}  {}",
                    round + 1,
                    CONFIGS[c],
                    if hot { "hot" } else { "100k" },
                    run.per_second,
                    run.ok,
                    run.limited,
                    run.other,
                    run.busy()
                );
                runs[c][w].push(run);
            }
        }
    }
    drop(instances);
    drop(redis);

    // 2. Redis server instructions per request (callgrind).
    println!("server instructions per request (callgrind on redis-server) ...");
    let redis = Redis::start(true)?;
    let mut instructions: Vec<Vec<f64>> = vec![vec![0.0; 2]; CONFIGS.len()];
    for (c, config) in CONFIGS.iter().enumerate().skip(2) {
        let instance = Instances::start(config, Some(&redis), open, &format!("scale-cg-{config}"))?;
        for (w, hot) in [true, false].into_iter().enumerate() {
            // With a local budget a run makes few calls (about 0.04 a
            // request on the hot subject): ten times the requests, so
            // that the two counts differ by enough calls to measure.
            let (small, large) = if config.starts_with("budget") {
                (15_000_u64, 45_000_u64)
            } else {
                (1_500_u64, 4_500_u64)
            };
            run_load(&instance.ports, hot, "--requests", "300")?;
            redis.instructions();
            run_load(&instance.ports, hot, "--requests", &small.to_string())?;
            let i_small = redis.instructions();
            run_load(&instance.ports, hot, "--requests", &large.to_string())?;
            let i_large = redis.instructions();
            instructions[c][w] = i_large.saturating_sub(i_small) as f64 / large as f64;
        }
    }
    drop(redis);

    // 3. The overshoot of a limited hot subject.
    println!(
        "overshoot of a hot subject limited to {} per second, burst {} ...",
        LIMITED.0, LIMITED.1
    );
    let redis = Redis::start(false)?;
    let policy = Policy::per_second(LIMITED.0)
        .burst(LIMITED.1)
        .name("scale")
        .build()
        .map_err(|e| e.to_string())?;
    let bound = LocalBudget::new()
        .max_permits(BUDGET_PERMITS)
        .grant_period(Duration::from_millis(BUDGET_LEASE_MS))
        .overshoot_bound(&policy, INSTANCES as u64);
    let mut overshoot: Vec<Option<(i64, u64, f64)>> = vec![None; CONFIGS.len()];
    for (c, config) in CONFIGS.iter().enumerate().skip(1) {
        let instance = Instances::start(
            config,
            Some(&redis),
            LIMITED,
            &format!("scale-limited-{config}"),
        )?;
        let run = run_load(&instance.ports, true, "--secs", &secs.to_string())?;
        overshoot[c] = Some((
            worst_overshoot(&run.buckets, LIMITED.0, LIMITED.1),
            run.ok,
            run.per_second,
        ));
    }
    drop(redis);

    // 4. One subject flooding past its limit.
    let flood_table = flood(secs, rounds)?;

    // The table.
    let open_policy = Policy::per_second(open.0)
        .burst(open.1)
        .name("scale")
        .build()
        .map_err(|e| e.to_string())?;
    let open_bound = LocalBudget::new()
        .max_permits(BUDGET_PERMITS)
        .grant_period(Duration::from_millis(BUDGET_LEASE_MS))
        .overshoot_bound(&open_policy, INSTANCES as u64);
    println!();
    println!("| configuration | workload | req/s median [range] | × bare | Redis calls / request | Redis instructions / request | checks / Redis CPU s median [range] | checks / instance CPU s median [range] | stated bound | p50 / p99 µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (c, config) in CONFIGS.iter().enumerate() {
        for (w, workload) in ["hot subject", "100k subjects"].iter().enumerate() {
            let list = &runs[c][w];
            let (rate, low, high) = median(list.iter().map(|r| r.per_second).collect());
            let ratios: Vec<f64> = list
                .iter()
                .zip(&runs[0][w])
                .map(|(r, b)| r.per_second / b.per_second)
                .collect();
            let requests: u64 = list.iter().map(|r| r.requests).sum();
            let p50 = median(list.iter().map(|r| r.p50).collect()).0;
            let p99 = median(list.iter().map(|r| r.p99).collect()).0;
            let redis_cells = if c >= 2 {
                format!(
                    "{:.3} | {:.0}",
                    calls[c][w] as f64 / requests.max(1) as f64,
                    instructions[c][w]
                )
            } else {
                "0 | 0".to_owned()
            };
            let per_cpu: Vec<(f64, f64)> = list.iter().map(Run::per_cpu_second).collect();
            let per_redis = if c >= 2 {
                median_cell(per_cpu.iter().map(|p| p.0).collect())
            } else {
                "— (no Redis call)".to_owned()
            };
            let per_app = median_cell(per_cpu.iter().map(|p| p.1).collect());
            let stated = match *config {
                "bare" => "— (no limiter)".to_owned(),
                "memory" => "none (each instance its own limit)".to_owned(),
                "redis" | "redis-evalsha" => "0".to_owned(),
                _ => open_bound.to_string(),
            };
            println!(
                "| {config} | {workload} | {:.0} [{:.0}–{:.0}] | {:.2} | {redis_cells} | {per_redis} | {per_app} | {stated} | {p50:.0} / {p99:.0} |",
                rate,
                low,
                high,
                median(ratios).0,
            );
        }
    }
    let idle = median(
        runs[..2]
            .iter()
            .flatten()
            .flatten()
            .map(|r| 1_000.0 * r.redis_cpu / r.secs)
            .collect(),
    );
    println!();
    println!(
        "Redis with no calls (the bare and memory rounds): {:.1} ms CPU per s [{:.1}–{:.1}]",
        idle.0, idle.1, idle.2
    );
    let other = median(
        runs.iter()
            .flatten()
            .flatten()
            .map(|r| 100.0 * r.core0_other / r.secs)
            .collect(),
    );
    println!(
        "other work on Redis' core 0 during the rounds: {:.0}% [{:.0}–{:.0}]",
        other.0, other.1, other.2
    );
    println!("(bare: requests, no check, per instance CPU s)");
    println!();
    println!("| configuration | hot subject at {} per second, burst {} | admitted | worst window over the exact policy | stated bound |", LIMITED.0, LIMITED.1);
    println!("|---|---|---|---|---|");
    for (c, config) in CONFIGS.iter().enumerate().skip(1) {
        if let Some((worst, ok, rate)) = overshoot[c] {
            let stated = match *config {
                "budget" | "budget-evalsha" => bound.to_string(),
                "redis" | "redis-evalsha" => "0".to_owned(),
                _ => "none (each instance its own limit)".to_owned(),
            };
            println!("| {config} | {rate:.0} req/s offered | {ok} | {worst} | {stated} |");
        }
    }
    println!();
    for line in &flood_table {
        println!("{line}");
    }
    println!();
    println!(
        "windows of {} ms buckets, times taken by the load generator; took {:.0} s",
        BUCKET_US / 1_000,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `scale flood`: the flood row alone.
fn flood_only() -> Result<(), String> {
    let (secs, rounds) = secs_and_rounds();
    let started = Instant::now();
    println!("scale flood: {INSTANCES} instances per configuration, {FLOOD_CONNECTIONS} connections, {rounds} rounds of {secs} s");
    let table = flood(secs, rounds)?;
    println!();
    for line in &table {
        println!("{line}");
    }
    println!();
    println!(
        "windows of {} ms buckets, times taken by the load generator; took {:.0} s",
        BUCKET_US / 1_000,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `PORTCULLIS_BENCH_SECS` and `PORTCULLIS_BENCH_ROUNDS`.
fn secs_and_rounds() -> (f64, usize) {
    let secs: f64 = std::env::var("PORTCULLIS_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let rounds: usize = std::env::var("PORTCULLIS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    (secs, rounds)
}

/// One subject offered as much as 4 connections send, far past a policy
/// of 1 000 per second: Redis calls per request (the server's
/// `INFO commandstats`, summed over rounds), requests per second, and the
/// worst window over the exact policy beside the stated bound. The
/// configurations take turns, round after round, on one Redis; each
/// configuration's instances keep their own prefix. Returns the table.
fn flood(secs: f64, rounds: usize) -> Result<Vec<String>, String> {
    println!(
        "one subject flooding past {} per second (burst {}), {FLOOD_CONNECTIONS} connections ...",
        FLOOD.0, FLOOD.1
    );
    let redis = Redis::start(false)?;
    let policy = Policy::per_second(FLOOD.0)
        .burst(FLOOD.1)
        .name("scale")
        .build()
        .map_err(|e| e.to_string())?;
    let bound = LocalBudget::new()
        .max_permits(BUDGET_PERMITS)
        .grant_period(Duration::from_millis(BUDGET_LEASE_MS))
        .overshoot_bound(&policy, INSTANCES as u64);
    let instances: Vec<Instances> = FLOOD_CONFIGS
        .iter()
        .map(|c| Instances::start(c, Some(&redis), FLOOD, &format!("scale-flood-{c}")))
        .collect::<Result<_, _>>()?;
    // [config] -> (calls, runs)
    let mut totals: Vec<(u64, Vec<Run>)> = vec![(0, Vec::new()); FLOOD_CONFIGS.len()];
    for round in 0..rounds {
        for (c, instance) in instances.iter().enumerate() {
            let before = redis.calls();
            let run = measured_load(&redis, instance, true, secs, FLOOD_CONNECTIONS)?;
            let calls = redis.calls() - before;
            println!(
                "  round {} {:<7} flood {:>8.0} req/s  ok {} limited {} other {}  calls {calls} ({:.4} per request)  {}",
                round + 1,
                FLOOD_CONFIGS[c],
                run.per_second,
                run.ok,
                run.limited,
                run.other,
                calls as f64 / run.requests.max(1) as f64,
                run.busy()
            );
            totals[c].0 += calls;
            totals[c].1.push(run);
        }
    }
    drop(instances);
    drop(redis);
    let mut table = vec![
        format!(
            "| configuration | one subject flooding past {} per second, {FLOOD_CONNECTIONS} connections | req/s median [range] | admitted per second | Redis calls / request | checks / Redis CPU s median [range] | checks / instance CPU s median [range] | worst window over the exact policy | stated bound |",
            FLOOD.0
        ),
        "|---|---|---|---|---|---|---|---|---|".to_owned(),
    ];
    for (c, config) in FLOOD_CONFIGS.iter().enumerate() {
        let (calls, runs) = &totals[c];
        let (rate, low, high) = median(runs.iter().map(|r| r.per_second).collect());
        let requests: u64 = runs.iter().map(|r| r.requests).sum();
        let ok: u64 = runs.iter().map(|r| r.ok).sum();
        let worst = runs
            .iter()
            .map(|r| worst_overshoot(&r.buckets, FLOOD.0, FLOOD.1))
            .max()
            .unwrap_or(0);
        let stated = if *config == "budget" {
            bound.to_string()
        } else {
            "0".to_owned()
        };
        let per_cpu: Vec<(f64, f64)> = runs.iter().map(Run::per_cpu_second).collect();
        table.push(format!(
            "| {config} | {requests} requests over {rounds} rounds | {rate:.0} [{low:.0}–{high:.0}] | {:.0} | {:.4} | {} | {} | {worst} | {stated} |",
            ok as f64 / (secs * rounds as f64),
            *calls as f64 / requests.max(1) as f64,
            median_cell(per_cpu.iter().map(|p| p.0).collect()),
            median_cell(per_cpu.iter().map(|p| p.1).collect()),
        ));
    }
    Ok(table)
}
