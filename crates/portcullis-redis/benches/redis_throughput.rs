//! The Redis core's cost of a check: portcullis (Redis Functions and
//! `EVALSHA`) beside the peer scripts of `/work/shared/bench` (read its
//! README), same semantics (GCRA 100/s, burst 10).
//!
//! Run with `cargo xtask bench redis`, or by hand:
//! `PORTCULLIS_REDIS_SERVER=$(which redis-server) cargo bench -p portcullis-redis --bench redis_throughput`.
//! `PORTCULLIS_BENCH_PEERS` names the peers' directory (default
//! `../shared/bench` from the workspace root).
//!
//! It starts its own servers, pinned with `taskset` to core 0 (the client
//! runs on the other cores):
//!
//! 1. **server instructions per check**: `redis-server` under valgrind's
//!    callgrind; for each workload, two call counts are run and the
//!    instructions of the larger minus those of the smaller, divided by the
//!    difference in calls, is the cost of one check (start-up, connection
//!    and script loading cancel). Random keys over 100k, and one hot key
//!    paced at 200 calls/s on Redis' clock, so about half are admitted.
//!    A third figure, **hot ×64**, sends 64 checks of the hot key at once,
//!    round after round: there coalescing (on by default) decides the
//!    checks that wait for a call in flight in one call; the workloads
//!    "not coalesced" are the same stores with it off. Each of the three
//!    phases starts on an empty keyspace (`FLUSHALL SYNC`), so no keys of
//!    the phase before expire during it.
//! 2. **checks/s at the pipelined ceiling** (50 tasks on one multiplexed
//!    connection, which pipelines) with p50/p99 latency, three runs each,
//!    median and range.
//!
//! `PORTCULLIS_BENCH_ONLY=<text>` keeps the workloads whose name contains
//! it (and the peers); `PORTCULLIS_BENCH_INSTRUCTIONS_ONLY=1` skips the
//! checks/s part.
//!
//! It prints one table with the ratios portcullis / peer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis_core::{Algorithm, LeakyMode, Policy, Store};
use portcullis_redis::{CallPath, RedisStore};
use redis::aio::MultiplexedConnection;

#[path = "support/server.rs"]
mod server;
use server::Server;

const KEYS: u64 = 100_000;
const TASKS: usize = 50;
const RUNS: usize = 3;
const RUN_TIME: Duration = Duration::from_millis(1500);
/// Calls of the two counts (random keys; the hot key runs a third as many,
/// paced).
const SMALL: u64 = 1_000;
const LARGE: u64 = 4_000;
const HOT_PACE: Duration = Duration::from_millis(5);

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    runtime.block_on(run());
}

#[derive(Clone)]
enum Target {
    Store(RedisStore, Arc<[Policy]>),
    /// A peer script: its SHA-1 and arguments after the key.
    Peer(MultiplexedConnection, String, Vec<u64>),
}

impl Target {
    async fn call(&mut self, key: &str) -> bool {
        match self {
            Self::Store(store, policies) => store
                .check(key, policies, 1)
                .await
                .expect("a check")
                .is_allowed(),
            Self::Peer(connection, sha, args) => {
                let reply: Vec<redis::Value> = redis::cmd("EVALSHA")
                    .arg(&*sha)
                    .arg(1)
                    .arg(key)
                    .arg(&*args)
                    .query_async(connection)
                    .await
                    .expect("a peer call");
                !matches!(reply.first(), Some(redis::Value::Int(0)))
            }
        }
    }
}

struct Workload {
    name: String,
    peer: bool,
    make: Box<dyn Fn(String) -> BoxTarget>,
}

type BoxTarget = std::pin::Pin<Box<dyn std::future::Future<Output = Target>>>;

fn gcra() -> Policy {
    Policy::per_second(100)
        .burst(10)
        .name("gcra")
        .build()
        .expect("a policy")
}

/// 100/s with a burst of 10 where the algorithm has a burst, else 100/s.
fn policy(algorithm: Algorithm) -> Policy {
    let with_burst = Policy::per_second(100)
        .burst(10)
        .algorithm(algorithm)
        .name("p")
        .build();
    with_burst.unwrap_or_else(|_| {
        Policy::per_second(100)
            .algorithm(algorithm)
            .name("p")
            .build()
            .expect("a policy")
    })
}

fn peers_dir() -> PathBuf {
    std::env::var_os("PORTCULLIS_BENCH_PEERS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/peers"),
        PathBuf::from,
    )
}

fn workloads() -> Vec<Workload> {
    let mut list: Vec<Workload> = Vec::new();
    let store = |name: &str, policies: Vec<Policy>, evalsha: bool| {
        let coalesce = !name.contains("not coalesced");
        let policies: Arc<[Policy]> = policies.into();
        Workload {
            name: name.to_owned(),
            peer: false,
            make: Box::new(move |url: String| {
                let policies = Arc::clone(&policies);
                Box::pin(async move {
                    let url = if evalsha {
                        without_functions(&url).await
                    } else {
                        url
                    };
                    let store = RedisStore::builder()
                        .url(url)
                        .pool_size(1)
                        .coalesce(coalesce)
                        .timeout(Duration::from_secs(30))
                        .build()
                        .await
                        .expect("a store");
                    Target::Store(store, policies)
                })
            }),
        }
    };
    list.push(store("portcullis GCRA, Functions", vec![gcra()], false));
    list.push(store(
        "portcullis GCRA, Functions, not coalesced",
        vec![gcra()],
        false,
    ));
    list.push(store("portcullis GCRA, EVALSHA", vec![gcra()], true));
    // An emission interval that is not a whole number of microseconds
    // (3 333.3 µs): the fast function's `gcra_fraction`.
    let fractional = Policy::per_second(300)
        .burst(10)
        .name("p")
        .build()
        .expect("a policy");
    list.push(store(
        "portcullis GCRA 300/s (fractional interval)",
        vec![fractional],
        false,
    ));
    for (file, args) in [
        // burst, rate, period_ms, cost
        ("peer_gcra_redis_rate.lua", vec![10, 100, 1000, 1]),
        // emission interval us, burst, cost
        ("peer_gcra_int.lua", vec![10_000, 10, 1]),
    ] {
        let source = std::fs::read_to_string(peers_dir().join(file)).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (set PORTCULLIS_BENCH_PEERS)",
                peers_dir().join(file).display()
            )
        });
        list.push(Workload {
            name: format!("peer {}", file.trim_end_matches(".lua")),
            peer: true,
            make: Box::new(move |url: String| {
                let source = source.clone();
                let args = args.clone();
                Box::pin(async move {
                    let mut connection = connect(&url).await;
                    let sha: String = redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(&source)
                        .query_async(&mut connection)
                        .await
                        .expect("SCRIPT LOAD");
                    Target::Peer(connection, sha, args)
                })
            }),
        });
    }
    for (name, algorithm) in [
        ("portcullis fixed window", Algorithm::FixedWindow),
        ("portcullis sliding window", Algorithm::SlidingWindow),
        ("portcullis sliding log", Algorithm::SlidingLog),
        ("portcullis token bucket", Algorithm::TokenBucket),
        (
            "portcullis leaky bucket (queue)",
            Algorithm::LeakyBucket(LeakyMode::Queue),
        ),
        (
            "portcullis leaky bucket (meter)",
            Algorithm::LeakyBucket(LeakyMode::Meter),
        ),
    ] {
        list.push(store(name, vec![policy(algorithm)], false));
        // Hot ×64 without coalescing: what the coalesced batch saves.
        list.push(store(
            &format!("{name}, not coalesced"),
            vec![policy(algorithm)],
            false,
        ));
    }
    let daily = Policy::per_day(100_000)
        .name("daily")
        .build()
        .expect("a policy");
    list.push(store(
        "portcullis GCRA + daily GCRA",
        vec![gcra(), daily],
        false,
    ));
    // Both policies on the fast path (whole-µs intervals, burst × period
    // within 2^52): gcra_multi.
    let hourly = Policy::per_hour(10_000)
        .name("hourly")
        .build()
        .expect("a policy");
    list.push(store(
        "portcullis GCRA + hourly GCRA",
        vec![gcra(), hourly],
        false,
    ));
    match std::env::var("PORTCULLIS_BENCH_ONLY") {
        Ok(only) => list
            .into_iter()
            .filter(|w| w.peer || w.name.contains(&only))
            .collect(),
        Err(_) => list,
    }
}

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("a URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection")
}

/// Deletes every key (`FLUSHALL SYNC`; the Functions library and the
/// script cache stay), so the next phase starts on an empty keyspace, as
/// on a fresh server.
async fn flush(url: &str) {
    let mut connection = connect(url).await;
    let () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async(&mut connection)
        .await
        .expect("FLUSHALL");
}

/// `url` as an ACL user without Redis Functions (the EVALSHA path).
async fn without_functions(url: &str) -> String {
    let mut connection = connect(url).await;
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "bench-evalsha",
            "reset",
            "on",
            ">bench",
            "~*",
            "&*",
            "+@all",
            "-fcall",
            "-fcall_ro",
            "-function",
        ])
        .query_async(&mut connection)
        .await
        .expect("ACL SETUSER");
    url.replacen("redis://", "redis://bench-evalsha:bench@", 1)
}

/// A small xorshift: keys spread over KEYS without a dependency.
fn random_key(state: &mut u64) -> String {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    format!("k{}", *state % KEYS)
}

/// Runs `n` calls: random keys from TASKS tasks, or the hot key paced.
/// Returns how many were admitted.
async fn calls(target: &Target, n: u64, hot: bool, seed: u64) -> u64 {
    if hot {
        let mut target = target.clone();
        let mut admitted = 0;
        let mut tick = tokio::time::interval(HOT_PACE);
        for _ in 0..n {
            tick.tick().await;
            admitted += u64::from(target.call("hot").await);
        }
        return admitted;
    }
    let next = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS as u64 {
        let mut target = target.clone();
        let next = Arc::clone(&next);
        let admitted = Arc::clone(&admitted);
        tasks.push(tokio::spawn(async move {
            let mut state = seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let key = random_key(&mut state);
                if target.call(&key).await {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("no task panicked");
    }
    admitted.load(Ordering::Relaxed)
}

/// Server instructions per call: (I(large) - I(small)) / (large - small).
async fn instructions(server: &Server, target: &Target, hot: bool) -> (f64, f64) {
    let (small, large) = if hot {
        (SMALL / 5, LARGE / 5)
    } else {
        (SMALL, LARGE)
    };
    // Warm: load scripts and functions, open connections.
    calls(target, 50, hot, 1).await;
    server.instructions();
    let admitted_small = calls(target, small, hot, 2).await;
    let i_small = server.instructions();
    let admitted_large = calls(target, large, hot, 3).await;
    let i_large = server.instructions();
    let per_call = (i_large as f64 - i_small as f64) / (large - small) as f64;
    let admitted = (admitted_small + admitted_large) as f64 / (small + large) as f64;
    (per_call, admitted)
}

/// Checks of the hot key sent 64 at a time per round.
const AT_ONCE: u64 = 64;

/// Server instructions per check when `AT_ONCE` checks of the hot key go
/// at once, round after round, and the share admitted.
async fn instructions_at_once(server: &Server, target: &Target) -> (f64, f64) {
    async fn rounds(target: &Target, rounds: u64) -> u64 {
        let mut admitted = 0;
        for _ in 0..rounds {
            let checks = (0..AT_ONCE).map(|_| {
                let mut target = target.clone();
                async move { target.call("hot-at-once").await }
            });
            admitted += futures_util::future::join_all(checks)
                .await
                .into_iter()
                .map(u64::from)
                .sum::<u64>();
        }
        admitted
    }
    let (small, large) = (SMALL / AT_ONCE, LARGE / AT_ONCE);
    rounds(target, 2).await;
    server.instructions();
    let admitted_small = rounds(target, small).await;
    let i_small = server.instructions();
    let admitted_large = rounds(target, large).await;
    let i_large = server.instructions();
    let per_call = (i_large as f64 - i_small as f64) / ((large - small) * AT_ONCE) as f64;
    let admitted = (admitted_small + admitted_large) as f64 / ((small + large) * AT_ONCE) as f64;
    (per_call, admitted)
}

/// Checks/s, p50 and p99 (µs) of one run at the ceiling.
async fn throughput(target: &Target, hot: bool, seed: u64) -> (f64, f64, f64) {
    let deadline = Instant::now() + RUN_TIME;
    let mut tasks = Vec::new();
    for t in 0..TASKS as u64 {
        let mut target = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut state = seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let key = if hot {
                    "hot".to_owned()
                } else {
                    random_key(&mut state)
                };
                let started = Instant::now();
                target.call(&key).await;
                latencies.push(started.elapsed().as_micros() as f64);
            }
            latencies
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("no task panicked"));
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let at = |q: f64| all[((all.len() as f64 - 1.0) * q) as usize];
    (rate, at(0.5), at(0.99))
}

fn median_range(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

struct Row {
    name: String,
    peer: bool,
    instructions: [(f64, f64); 2],
    at_once: (f64, f64),
    rate: [(f64, f64, f64); 2],
    latency: [(f64, f64); 2],
}

async fn run() {
    let started = Instant::now();
    let workloads = workloads();
    let mut rows: Vec<Row> = Vec::new();
    println!("server instructions per check (callgrind on redis-server, pinned to core 0) ...");
    let server = Server::start(true);
    for workload in &workloads {
        let target = (workload.make)(server.url()).await;
        if let Target::Store(store, _) = &target {
            let expect = if workload.name.contains("EVALSHA") {
                CallPath::Evalsha
            } else {
                CallPath::Functions
            };
            calls(&target, 1, false, 9).await;
            assert_eq!(store.call_path(), expect, "{}", workload.name);
        }
        // Each phase on an empty keyspace: keys left by the phase (or the
        // workload) before would expire during it, and their expiry would
        // be counted as its instructions.
        flush(&server.url()).await;
        let random = instructions(&server, &target, false).await;
        flush(&server.url()).await;
        let hot = instructions(&server, &target, true).await;
        flush(&server.url()).await;
        let at_once = instructions_at_once(&server, &target).await;
        println!(
            "  {:<42} random {:>8.0} ({:.0}% admitted)  hot {:>8.0} ({:.0}% admitted)  hot x{AT_ONCE} {:>8.0} ({:.0}% admitted)",
            workload.name,
            random.0,
            100.0 * random.1,
            hot.0,
            100.0 * hot.1,
            at_once.0,
            100.0 * at_once.1
        );
        rows.push(Row {
            name: workload.name.clone(),
            peer: workload.peer,
            instructions: [random, hot],
            at_once,
            rate: [(0.0, 0.0, 0.0); 2],
            latency: [(0.0, 0.0); 2],
        });
    }
    drop(server);
    {
        println!();
        println!("| per check | server instructions, random / hot / hot x{AT_ONCE} | x redis_rate peer (hot x{AT_ONCE}) |");
        println!("|---|---|---|");
        let peer = rows
            .iter()
            .find(|r| r.peer && r.name.contains("redis_rate"))
            .map(|r| r.at_once.0)
            .unwrap_or(f64::NAN);
        for row in &rows {
            println!(
                "| {} | {:.1}k / {:.1}k / {:.1}k | {:.2} |",
                row.name,
                row.instructions[0].0 / 1e3,
                row.instructions[1].0 / 1e3,
                row.at_once.0 / 1e3,
                row.at_once.0 / peer
            );
        }
    }
    if std::env::var_os("PORTCULLIS_BENCH_INSTRUCTIONS_ONLY").is_some() {
        return;
    }
    println!("checks/s at the ceiling ({TASKS} tasks, {RUNS} runs of {RUN_TIME:?}) ...");
    let server = Server::start(false);
    for (workload, row) in workloads.iter().zip(&mut rows) {
        let target = (workload.make)(server.url()).await;
        for (i, hot) in [false, true].into_iter().enumerate() {
            let mut rates = Vec::new();
            let mut p50s = Vec::new();
            let mut p99s = Vec::new();
            for run in 0..RUNS {
                let (rate, p50, p99) = throughput(&target, hot, 17 + run as u64).await;
                rates.push(rate);
                p50s.push(p50);
                p99s.push(p99);
            }
            row.rate[i] = median_range(rates);
            row.latency[i] = (median_range(p50s).0, median_range(p99s).0);
        }
    }
    let yard = |name: &str| {
        rows.iter()
            .find(|r| r.peer && r.name.contains(name))
            .map(|r| r.instructions)
    };
    let rate_peer = yard("redis_rate").expect("the redis_rate peer");
    let int_peer = yard("gcra_int").expect("the integer-µs peer");
    println!();
    println!("| per check (random / hot key) | server instructions | × redis_rate peer | × integer-µs peer | checks/s median [range] | p50 / p99 µs |");
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        let [r, h] = row.instructions;
        let rate = |(m, lo, hi): (f64, f64, f64)| {
            format!("{:.1}k [{:.1}–{:.1}k]", m / 1e3, lo / 1e3, hi / 1e3)
        };
        println!(
            "| {} | {:.1}k / {:.1}k | {:.2} / {:.2} | {:.2} / {:.2} | {} / {} | {:.0}/{:.0} · {:.0}/{:.0} |",
            row.name,
            r.0 / 1e3,
            h.0 / 1e3,
            r.0 / rate_peer[0].0,
            h.0 / rate_peer[1].0,
            r.0 / int_peer[0].0,
            h.0 / int_peer[1].0,
            rate(row.rate[0]),
            rate(row.rate[1]),
            row.latency[0].0,
            row.latency[0].1,
            row.latency[1].0,
            row.latency[1].1,
        );
    }
    println!();
    println!(
        "hot key: paced at {} calls/s for the instruction counts (about half admitted, see above); unpaced, so mostly denied, for checks/s. Took {:.0} s.",
        1_000 / HOT_PACE.as_millis(),
        started.elapsed().as_secs_f64()
    );
}
