//! `cargo xtask soak`: a bounded soak of the memory and Redis stores.
//!
//! Mixed traffic — a hot fifth of the requests on 1 000 subjects (mostly
//! denied), the rest spread over all 100 000 subjects (mostly admitted) —
//! runs against `MemoryStore`, then against `RedisStore`, with two policies
//! per check (a GCRA rate and an hourly sliding window). Every few seconds
//! it samples the resident memory of this process and Redis' `used_memory`;
//! after the warm-up (the first third) both must stay flat, and no subject
//! may be admitted more than its GCRA policy allows over the run.
//!
//! ```text
//! soak [--seconds N] [--subjects N] [--store memory|redis|both]
//! ```
//!
//! `--seconds` is per store (default 90). Needs `PORTCULLIS_REDIS_URL` for the
//! Redis run (a fresh server: `used_memory` is the whole server's). Exits 1
//! when a subject was over-admitted or memory grew. Run with
//! `cargo xtask soak`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis_core::{Algorithm, MemoryStore, Policy, Store};
use portcullis_redis::RedisStore;
use portcullis_tests::reliability::{admin, command, gcra_allowance, info_field, Rng};

const RATE_LIMIT: u64 = 5;
const RATE_PERIOD: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Options {
    seconds: u64,
    subjects: usize,
    memory: bool,
    redis: bool,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        seconds: 90,
        subjects: 100_000,
        memory: true,
        redis: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--help" | "-h" => {
                return Err(
                    "usage: soak [--seconds N (per store, default 90)] [--subjects N (default 100000)] [--store memory|redis|both]"
                        .to_owned(),
                )
            }
            "--seconds" => {
                options.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--subjects" => {
                options.subjects = value()?.parse().map_err(|e| format!("--subjects: {e}"))?
            }
            "--store" => match value()?.as_str() {
                "memory" => options.redis = false,
                "redis" => options.memory = false,
                "both" => {}
                other => return Err(format!("--store {other}: use memory, redis or both")),
            },
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if options.subjects < 2_000 || options.seconds < 9 {
        return Err("use at least 2000 subjects and 9 seconds".to_owned());
    }
    Ok(options)
}

fn policies() -> Arc<[Policy]> {
    Arc::new([
        Policy::per(RATE_LIMIT, RATE_PERIOD)
            .name("soak-rate")
            .build()
            .expect("valid policy"),
        Policy::per_hour(12)
            .algorithm(Algorithm::SlidingWindow)
            .name("soak-hourly")
            .build()
            .expect("valid policy"),
    ])
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_048_576.0)
}

/// Which subject a request is for: a fifth go to 1 000 hot subjects.
fn pick(rng: &mut Rng, subjects: usize) -> usize {
    if rng.below(5) == 0 {
        rng.below(1_000) as usize
    } else {
        rng.below(subjects as u64) as usize
    }
}

#[derive(Debug, Default)]
struct Counters {
    admitted: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss: u64,
    /// Keys in the memory store, or in Redis.
    keys: u64,
    /// Redis `used_memory` (0 for the memory store).
    redis_used: u64,
    checks: u64,
}

struct Outcome {
    samples: Vec<Sample>,
    counters: Arc<Counters>,
    per_subject: Arc<Vec<AtomicU32>>,
    elapsed: Duration,
}

fn record(
    counters: &Counters,
    per_subject: &[AtomicU32],
    subject: usize,
    result: Result<bool, ()>,
) {
    match result {
        Ok(true) => {
            counters.admitted.fetch_add(1, Ordering::Relaxed);
            per_subject[subject].fetch_add(1, Ordering::Relaxed);
        }
        Ok(false) => {
            counters.denied.fetch_add(1, Ordering::Relaxed);
        }
        Err(()) => {
            counters.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What one sample reads from the store under test.
struct Figures {
    /// Keys the store holds.
    keys: u64,
    /// Redis' `used_memory` (zero for the memory store).
    redis_used: u64,
}

/// Samples every `every` until `stop`, with the store's figures read by
/// the caller's closure (one read per sample).
async fn sample_loop<F>(
    started: Instant,
    duration: Duration,
    counters: &Counters,
    mut figures: F,
) -> Vec<Sample>
where
    F: FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = Figures> + Send>>,
{
    let every = duration / 18;
    let mut samples = Vec::new();
    while started.elapsed() < duration {
        tokio::time::sleep(every).await;
        let Figures { keys, redis_used } = figures().await;
        let sample = Sample {
            at: started.elapsed(),
            rss: rss(),
            keys,
            redis_used,
            checks: counters.admitted.load(Ordering::Relaxed)
                + counters.denied.load(Ordering::Relaxed)
                + counters.errors.load(Ordering::Relaxed),
        };
        eprintln!(
            "  t={:>5.1}s checks={:>10} rss={:>9} keys={:>7} redis used_memory={}",
            sample.at.as_secs_f64(),
            sample.checks,
            mb(sample.rss),
            sample.keys,
            mb(sample.redis_used)
        );
        samples.push(sample);
    }
    samples
}

async fn soak_memory(options: &Options) -> Outcome {
    let store = Arc::new(MemoryStore::new());
    let policies = policies();
    let counters = Arc::new(Counters::default());
    let per_subject: Arc<Vec<AtomicU32>> =
        Arc::new((0..options.subjects).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let names: Arc<Vec<String>> =
        Arc::new((0..options.subjects).map(|i| format!("soak-{i}")).collect());
    let duration = Duration::from_secs(options.seconds);
    let started = Instant::now();
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (store, policies, counters, per_subject, stop, names) = (
                Arc::clone(&store),
                Arc::clone(&policies),
                Arc::clone(&counters),
                Arc::clone(&per_subject),
                Arc::clone(&stop),
                Arc::clone(&names),
            );
            let subjects = options.subjects;
            std::thread::spawn(move || {
                let mut rng = Rng::new(0x50a1 + t);
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let subject = pick(&mut rng, subjects);
                        let result =
                            futures::executor::block_on(store.check(&names[subject], &policies, 1));
                        record(
                            &counters,
                            &per_subject,
                            subject,
                            result.map(|v| v.is_allowed()).map_err(|_| ()),
                        );
                    }
                }
            })
        })
        .collect();
    let keys_store = Arc::clone(&store);
    let samples = sample_loop(started, duration, &counters, move || {
        let keys = keys_store.len() as u64;
        Box::pin(async move {
            Figures {
                keys,
                redis_used: 0,
            }
        })
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a soak thread panicked");
    }
    Outcome {
        samples,
        counters,
        per_subject,
        elapsed: started.elapsed(),
    }
}

async fn redis_figures(url: &str) -> Figures {
    let mut connection = admin(url).await;
    let memory: String = command(&mut connection, &["INFO", "memory"])
        .await
        .unwrap_or_default();
    let redis_used = info_field(&memory, "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let keys: u64 = command(&mut connection, &["DBSIZE"]).await.unwrap_or(0);
    Figures { keys, redis_used }
}

async fn soak_redis(options: &Options, url: &str) -> Outcome {
    let store = Arc::new(
        RedisStore::builder()
            .url(url)
            .prefix(format!("soak-{}", std::process::id()))
            .timeout(Duration::from_secs(2))
            .pool_size(4)
            .build()
            .await
            .expect("the store builds"),
    );
    store.ping().await.expect("Redis answers");
    let policies = policies();
    let counters = Arc::new(Counters::default());
    let per_subject: Arc<Vec<AtomicU32>> =
        Arc::new((0..options.subjects).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let duration = Duration::from_secs(options.seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..64u64)
        .map(|t| {
            let (store, policies, counters, per_subject, stop) = (
                Arc::clone(&store),
                Arc::clone(&policies),
                Arc::clone(&counters),
                Arc::clone(&per_subject),
                Arc::clone(&stop),
            );
            let subjects = options.subjects;
            tokio::spawn(async move {
                let mut rng = Rng::new(0x7ed1 + t);
                while !stop.load(Ordering::Relaxed) {
                    let subject = pick(&mut rng, subjects);
                    let result = store.check(&format!("soak-{subject}"), &policies, 1).await;
                    record(
                        &counters,
                        &per_subject,
                        subject,
                        result.map(|v| v.is_allowed()).map_err(|_| ()),
                    );
                }
            })
        })
        .collect();
    let figures_url = url.to_owned();
    let samples = sample_loop(started, duration, &counters, move || {
        let url = figures_url.clone();
        Box::pin(async move { redis_figures(&url).await })
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a soak task panicked");
    }
    Outcome {
        samples,
        counters,
        per_subject,
        elapsed: started.elapsed(),
    }
}

/// Mean of `values`.
fn mean(values: &[u64]) -> f64 {
    values.iter().sum::<u64>() as f64 / values.len().max(1) as f64
}

/// Flat: the last three samples average at most 10 % (or 8 MB) above the
/// first three after the warm-up.
fn flat(label: &str, values: &[u64]) -> (bool, String) {
    let warm = values.len() / 3;
    let after = &values[warm..];
    if after.len() < 6 {
        return (true, format!("{label}: too few samples"));
    }
    let early = mean(&after[..3]);
    let late = mean(&after[after.len() - 3..]);
    let max = after.iter().copied().max().unwrap_or(0);
    let min = after.iter().copied().min().unwrap_or(0);
    let growth = late - early;
    let ok = growth <= early * 0.10 || growth <= 8.0 * 1_048_576.0;
    (
        ok,
        format!(
            "{label} after warm-up: {} → {} (min {}, max {}, growth {:+.1}%) — {}",
            mb(early as u64),
            mb(late as u64),
            mb(min),
            mb(max),
            if early > 0.0 {
                growth / early * 100.0
            } else {
                0.0
            },
            if ok { "flat" } else { "GROWING" }
        ),
    )
}

/// Prints the figures; returns whether the run passed.
fn report(name: &str, outcome: &Outcome, redis: bool) -> bool {
    let admitted = outcome.counters.admitted.load(Ordering::Relaxed);
    let denied = outcome.counters.denied.load(Ordering::Relaxed);
    let errors = outcome.counters.errors.load(Ordering::Relaxed);
    let total = admitted + denied + errors;
    // GCRA: at most the burst plus one permit per emission interval over
    // the run (the run brackets every store evaluation).
    let bound = gcra_allowance(RATE_LIMIT, RATE_PERIOD, outcome.elapsed);
    let counts: Vec<u32> = outcome
        .per_subject
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let max_admitted = counts.iter().copied().max().unwrap_or(0);
    let over: usize = counts.iter().filter(|c| u64::from(**c) > bound).count();
    let touched = counts.iter().filter(|c| **c > 0).count();
    println!("\n## {name}");
    println!(
        "{total} checks in {:.0} s ({:.0}/s): admitted {admitted}, denied {denied}, errors {errors}",
        outcome.elapsed.as_secs_f64(),
        total as f64 / outcome.elapsed.as_secs_f64()
    );
    println!(
        "subjects admitted at least once: {touched} of {}; most admitted for one subject: {max_admitted} (GCRA bound over the run: {bound}); over the bound: {over}",
        counts.len()
    );
    println!("| t (s) | checks | process RSS | keys | Redis used_memory |");
    println!("|---|---|---|---|---|");
    for s in &outcome.samples {
        println!(
            "| {:.1} | {} | {} | {} | {} |",
            s.at.as_secs_f64(),
            s.checks,
            mb(s.rss),
            s.keys,
            if redis {
                mb(s.redis_used)
            } else {
                "-".to_owned()
            }
        );
    }
    let (rss_flat, rss_line) = flat(
        "process RSS",
        &outcome.samples.iter().map(|s| s.rss).collect::<Vec<_>>(),
    );
    println!("{rss_line}");
    let mut ok = rss_flat && over == 0 && errors == 0;
    if redis {
        let (used_flat, used_line) = flat(
            "Redis used_memory",
            &outcome
                .samples
                .iter()
                .map(|s| s.redis_used)
                .collect::<Vec<_>>(),
        );
        println!("{used_line}");
        ok &= used_flat;
    }
    println!("{name}: {}", if ok { "PASS" } else { "FAIL" });
    ok
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let options = match options() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("soak: {error}");
            return ExitCode::from(2);
        }
    };
    let mut ok = true;
    println!(
        "# soak: {} subjects, {} s per store, policies: GCRA {RATE_LIMIT} per {} s (burst {RATE_LIMIT}) + sliding window 12 per hour",
        options.subjects,
        options.seconds,
        RATE_PERIOD.as_secs()
    );
    if options.memory {
        eprintln!("soak: MemoryStore");
        let outcome = soak_memory(&options).await;
        ok &= report("MemoryStore", &outcome, false);
    }
    if options.redis {
        let url = portcullis_tests::redis_url();
        eprintln!("soak: RedisStore on {url}");
        let outcome = soak_redis(&options, &url).await;
        ok &= report("RedisStore", &outcome, true);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
