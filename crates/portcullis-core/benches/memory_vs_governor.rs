//! `MemoryStore` GCRA checks against governor's keyed rate limiter.
//!
//! Run with `cargo bench -p portcullis-core --bench memory_vs_governor` (or
//! `cargo xtask bench core`). Add `-- --quick` for a faster, rougher run.
//!
//! Both sides get the same pre-generated, shuffled key strings, the same
//! GCRA quota (one per 10 s with a burst so large nothing is ever denied,
//! and every key's state stays live between two visits even at a million
//! keys, so no run measures denials, expiry or re-insertion), their default
//! clocks, and the same loop. Every implementation checks every key once
//! before any implementation is timed, so the runs measure checks of known
//! keys with the same memory in use; those first checks go in numeric
//! order and the timed ones in a shuffled order,
//! so no implementation finds its keys laid out in memory in the order it
//! visits them (each allocates a key, or places an entry, in the order keys
//! arrive).
//! Governor is measured twice: as `RateLimiter::keyed` builds it (a DashMap
//! with std's SipHash) and with the foldhash hasher portcullis uses, so the
//! comparison does not come down to the hash function. Portcullis is measured
//! twice too: with the `FastClock` `MemoryStore::new()` uses (it reads the
//! CPU's timestamp counter through quanta, as governor's default clock does)
//! and reading `SystemTime` on every check (`SystemClock`), to show what the
//! clock costs.
//!
//! Two-thread runs time the wall clock from a barrier until both threads
//! finished their half of the checks, and report wall time per check.
//!
//! At the end a table prints ns per check as criterion estimated them (read
//! from its `estimates.json`, falling back to this program's own timing),
//! then a second opinion for busy machines: the implementations take turns
//! in short rounds and the medians (and median ratios within a round) are
//! printed.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use portcullis_core::{MemoryStore, Policy, Store, SystemClock};

const SIZES: [usize; 3] = [1, 10_000, 1_000_000];
const THREADS: [usize; 2] = [1, 2];
/// Time between two permits: 10 s. Each check moves a key's state 10 s
/// ahead, so a key visited at least every 10 s (a pass over a million keys
/// takes well under a second) never falls back to full and is never
/// forgotten; with a burst of 4·10^8 (portcullis: burst × period must stay
/// within 2^52 µs) or 10^9 (governor), a key takes hundreds of millions of
/// checks before a denial, more than any run makes.
const PERIOD: Duration = Duration::from_secs(10);
const PORTCULLIS_BURST: u64 = 400_000_000;
const GOVERNOR_BURST: u32 = 1_000_000_000;

type FoldGovernor = RateLimiter<
    String,
    governor::state::keyed::DashMapStateStore<String, foldhash::fast::RandomState>,
    governor::clock::DefaultClock,
>;

/// What a limiter under test must do: one cost-1 check, allowed or not.
///
/// The key is a `&String` because governor's `RateLimiter<String, ..>`
/// takes its key type by reference; portcullis takes the `&str` inside.
#[allow(clippy::ptr_arg)]
trait Limiter: Sync {
    fn allow(&self, key: &String) -> bool;
}

struct Portcullis {
    store: MemoryStore,
    policies: [Policy; 1],
}

impl Limiter for Portcullis {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        match self.store.check(key, &self.policies, 1).into_inner() {
            Ok(verdict) => verdict.is_allowed(),
            Err(err) => panic!("check failed: {err}"),
        }
    }
}

impl Limiter for DefaultKeyedRateLimiter<String> {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        self.check_key(key).is_ok()
    }
}

impl Limiter for FoldGovernor {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        self.check_key(key).is_ok()
    }
}

#[derive(Default, Clone, Copy)]
struct Tally {
    checks: u64,
    denied: u64,
    wall: Duration,
}

/// Our own measurements, keyed by (size, threads, implementation).
static TALLY: Mutex<BTreeMap<(usize, usize, &'static str), Tally>> = Mutex::new(BTreeMap::new());

/// The keys every implementation first sees: `user:<n>` in numeric order.
fn first_seen(size: usize) -> Vec<String> {
    (0..size).map(|i| format!("user:{i}")).collect()
}

/// The same keys, shuffled: the order every implementation is timed on, so
/// that consecutive checks hit unrelated keys (and unrelated allocations).
fn keys(size: usize) -> Vec<String> {
    let mut keys = first_seen(size);
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..keys.len()).rev() {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = usize::try_from((seed >> 33) % (i as u64 + 1)).unwrap();
        keys.swap(i, j);
    }
    keys
}

/// Runs `checks` checks starting at key `start`, walking the keys in order.
#[inline(never)]
fn run(limiter: &dyn Limiter, keys: &[String], start: usize, checks: u64) -> u64 {
    let mut index = start % keys.len();
    let mut denied = 0;
    for _ in 0..checks {
        let key = &keys[index];
        denied += u64::from(!black_box(limiter.allow(key)));
        index += 1;
        if index == keys.len() {
            index = 0;
        }
    }
    denied
}

/// `iters` checks over `threads` threads (each its share, starting at its
/// own place in the keys after `offset`); the wall time from the start
/// signal until the last thread finished, and the denials.
fn timed_from(
    limiter: &dyn Limiter,
    keys: &[String],
    threads: usize,
    offset: usize,
    iters: u64,
) -> (Duration, u64) {
    if threads == 1 {
        let start = Instant::now();
        let denied = run(limiter, keys, offset, iters);
        return (start.elapsed(), denied);
    }
    let barrier = Barrier::new(threads + 1);
    let per_thread = iters.div_ceil(threads as u64);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let start = offset + thread * keys.len() / threads;
                    let denied = run(limiter, keys, start, per_thread);
                    (Instant::now(), denied)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut end = start;
        let mut denied = 0;
        for worker in workers {
            let (finished, worker_denied) = worker.join().expect("the worker finished");
            end = end.max(finished);
            denied += worker_denied;
        }
        (end - start, denied)
    })
}

fn bench_one(
    c: &mut Criterion,
    size: usize,
    threads: usize,
    name: &'static str,
    limiter: &dyn Limiter,
    keys: &[String],
) {
    let mut group = c.benchmark_group(format!("keys_{size}_threads_{threads}"));
    group.bench_function(BenchmarkId::from_parameter(name), |b| {
        b.iter_custom(|iters| {
            let (wall, denied) = timed_from(limiter, keys, threads, 0, iters);
            let mut tally = TALLY.lock().unwrap();
            let entry = tally.entry((size, threads, name)).or_default();
            entry.checks += iters;
            entry.denied += denied;
            entry.wall += wall;
            wall
        });
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    let portcullis_policy = Policy::per(1, PERIOD)
        .burst(PORTCULLIS_BURST)
        .name("bench")
        .build()
        .expect("a valid policy");
    let quota = Quota::with_period(PERIOD)
        .expect("a non-zero period")
        .allow_burst(NonZeroU32::new(GOVERNOR_BURST).expect("a non-zero burst"));
    for size in SIZES {
        let first = first_seen(size);
        let keys = keys(size);
        for threads in THREADS {
            // Unbounded, as governor is: a million keys would otherwise pass
            // `DEFAULT_MAX_KEYS` and measure eviction instead of checks.
            let portcullis = Portcullis {
                store: MemoryStore::builder().unbounded().build(),
                policies: [portcullis_policy.clone()],
            };
            let portcullis_sys = Portcullis {
                store: MemoryStore::builder()
                    .clock(SystemClock)
                    .unbounded()
                    .build(),
                policies: [portcullis_policy.clone()],
            };
            let governor: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota);
            let governor_fold: FoldGovernor =
                RateLimiter::dashmap_with_hasher(quota, foldhash::fast::RandomState::default());
            let limiters: [(&'static str, &dyn Limiter); 4] = [
                ("portcullis", &portcullis),
                ("portcullis_sys", &portcullis_sys),
                ("governor", &governor),
                ("governor_foldhash", &governor_fold),
            ];
            // Every key once per implementation, in another order than
            // the timed walk, and all implementations before any is timed,
            // so each is timed with the same memory in use: the runs
            // measure known keys. (Not inside the timed closure: criterion's
            // warm-up would count it.)
            for (name, limiter) in limiters {
                let denied = run(limiter, &first, 0, first.len() as u64);
                assert_eq!(denied, 0, "{name} denied a first check");
            }
            for (name, limiter) in limiters {
                bench_one(c, size, threads, name, limiter, &keys);
            }
            interleaved(size, threads, &limiters, &keys);
        }
    }
}

/// Rounds of the interleaved comparison.
const ROUNDS: usize = 15;
/// Checks per implementation per round.
const ROUND_CHECKS: u64 = 400_000;

/// Median over rounds of each implementation's ns per check, and of the
/// ratio of two implementations measured back to back, keyed by (size,
/// threads, name) and (size, threads, "a/b").
static INTERLEAVED: Mutex<BTreeMap<(usize, usize, &'static str), f64>> =
    Mutex::new(BTreeMap::new());

/// A second opinion robust to a busy machine: the implementations take
/// turns, `ROUND_CHECKS` checks each, for `ROUNDS` rounds, and the table
/// reports medians (of times, and of ratios within a round, where all
/// implementations saw the same machine load). Only the implementations
/// criterion just ran take part.
fn interleaved(
    size: usize,
    threads: usize,
    limiters: &[(&'static str, &dyn Limiter)],
    keys: &[String],
) {
    let ran: Vec<_> = {
        let tally = TALLY.lock().unwrap();
        limiters
            .iter()
            .filter(|(name, _)| tally.contains_key(&(size, threads, *name)))
            .copied()
            .collect()
    };
    if ran.is_empty() {
        return;
    }
    let mut times: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for round in 0..ROUNDS {
        for (name, limiter) in &ran {
            // Each round starts elsewhere in the keys, so over the rounds a
            // large key set is walked rather than its first slice.
            let start = round * ROUND_CHECKS as usize % keys.len();
            let (wall, denied) = timed_from(*limiter, keys, threads, start, ROUND_CHECKS);
            assert_eq!(denied, 0, "{name} denied checks");
            times
                .entry(name)
                .or_default()
                .push(wall.as_nanos() as f64 / ROUND_CHECKS as f64);
        }
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut out = INTERLEAVED.lock().unwrap();
    for (a, b, key) in [
        ("portcullis", "governor", "portcullis/governor"),
        (
            "portcullis",
            "governor_foldhash",
            "portcullis/governor_foldhash",
        ),
        ("portcullis_sys", "governor", "portcullis_sys/governor"),
    ] {
        if let (Some(a), Some(b)) = (times.get(a), times.get(b)) {
            let mut ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
            out.insert((size, threads, key), median(&mut ratios));
        }
    }
    for (name, mut values) in times {
        out.insert((size, threads, name), median(&mut values));
    }
}

/// Where criterion writes its results, found as criterion finds it.
fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    let metadata = std::env::var_os("CARGO").and_then(|cargo| {
        let output = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .ok()?;
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        Some(PathBuf::from(json["target_directory"].as_str()?).join("criterion"))
    });
    metadata.unwrap_or_else(|| PathBuf::from("target/criterion"))
}

/// Criterion's estimate in ns per check: the slope when it has one, else
/// the mean.
fn criterion_estimate(
    home: &std::path::Path,
    size: usize,
    threads: usize,
    name: &str,
) -> Option<f64> {
    let path = home
        .join(format!("keys_{size}_threads_{threads}"))
        .join(name)
        .join("new/estimates.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    json["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| json["mean"]["point_estimate"].as_f64())
}

/// The column headers of the summary tables; `denied` adds that column.
fn header(denied: bool) {
    let denied = if denied {
        format!(" {:>7}", "denied")
    } else {
        String::new()
    };
    println!(
        "{:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7}{denied}",
        "keys", "threads", "portcullis", "+sys", "governor", "gov+fold", "ratio", "r fold", "r sys",
    );
}

fn print_table() {
    let tally = TALLY.lock().unwrap().clone();
    if tally.is_empty() {
        return;
    }
    let home = criterion_home();
    let mut used_fallback = false;
    let mut estimate = |size: usize, threads: usize, name: &str| -> Option<f64> {
        let own = tally
            .get(&(size, threads, name))
            .map(|t| t.wall.as_nanos() as f64 / t.checks as f64)?;
        Some(
            criterion_estimate(&home, size, threads, name).unwrap_or_else(|| {
                used_fallback = true;
                own
            }),
        )
    };
    let show = |value: Option<f64>, precision: usize| {
        value.map_or_else(|| "-".to_owned(), |v| format!("{v:.precision$}"))
    };
    println!();
    println!(
        "portcullis MemoryStore vs governor keyed limiter, GCRA, ns per check (wall time / checks), criterion's estimates"
    );
    header(true);
    for size in SIZES {
        for threads in THREADS {
            let ours = estimate(size, threads, "portcullis");
            let sys = estimate(size, threads, "portcullis_sys");
            let theirs = estimate(size, threads, "governor");
            let fold = estimate(size, threads, "governor_foldhash");
            if [ours, sys, theirs, fold].iter().all(Option::is_none) {
                continue;
            }
            let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
            let denied: u64 = tally
                .iter()
                .filter(|((s, t, _), _)| *s == size && *t == threads)
                .map(|(_, tally)| tally.denied)
                .sum();
            println!(
                "{size:>9} {threads:>7} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {denied:>7}",
                show(ours, 1),
                show(sys, 1),
                show(theirs, 1),
                show(fold, 1),
                show(ratio(ours, theirs), 2),
                show(ratio(ours, fold), 2),
                show(ratio(sys, theirs), 2),
            );
        }
    }
    let interleaved = INTERLEAVED.lock().unwrap().clone();
    if !interleaved.is_empty() {
        println!();
        println!(
            "interleaved: {ROUNDS} rounds of {ROUND_CHECKS} checks per implementation, medians (ns per check; ratios within a round)"
        );
        header(false);
        for size in SIZES {
            for threads in THREADS {
                let get = |name: &str| interleaved.get(&(size, threads, name)).copied();
                if get("portcullis").is_none() && get("governor").is_none() {
                    continue;
                }
                println!(
                    "{size:>9} {threads:>7} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7}",
                    show(get("portcullis"), 1),
                    show(get("portcullis_sys"), 1),
                    show(get("governor"), 1),
                    show(get("governor_foldhash"), 1),
                    show(get("portcullis/governor"), 2),
                    show(get("portcullis/governor_foldhash"), 2),
                    show(get("portcullis_sys/governor"), 2),
                );
            }
        }
    }
    println!();
    println!("ratio = portcullis / governor (RateLimiter::keyed: DashMap with std's SipHash)");
    println!("r fold = portcullis / governor with foldhash (the hasher portcullis uses)");
    println!("r sys = portcullis reading SystemTime on every check (SystemClock) / governor; portcullis's default FastClock reads the TSC through quanta, like governor's default clock");
    if used_fallback {
        println!(
            "(some figures are this program's own timing: criterion's estimates.json was not found under {})",
            home.display()
        );
    }
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .without_plots()
        .configure_from_args();
    benches(&mut criterion);
    criterion.final_summary();
    print_table();
}
