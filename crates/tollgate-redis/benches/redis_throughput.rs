//! `RedisStore` throughput next to its peers, in one run on one server.
//!
//! Run with `cargo xtask bench redis` (a fresh `redis-server`, and
//! `TOLLGATE_REDIS_URL` / `TOLLGATE_REDIS_BENCHMARK` set), or by hand:
//! `TOLLGATE_REDIS_URL=redis://127.0.0.1:6390 TOLLGATE_REDIS_BENCHMARK=$(which redis-benchmark) cargo bench -p tollgate-redis --bench redis_throughput`.
//!
//! With 50 concurrent tasks it measures checks per second and p50/p99
//! latency of
//!
//! 1. `RedisStore::check` with a GCRA policy (random keys, one hot key),
//! 2. `redis-benchmark -c 50` sending the same `EVALSHA` (same script, same
//!    arguments; random keys through `__rand_int__`), i.e. what one Redis
//!    core does for this script with a C client that adds almost nothing,
//! 3. the naive `MULTI; INCR; EXPIRE; EXEC` recipe from a Rust client,
//!
//! prints a table and the ratios (goal: `RedisStore` ≥ 0.9× of
//! redis-benchmark), then a criterion comparison of one sequential call:
//! `RedisStore::check` next to a bare `EVALSHA` through the redis crate.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use tollgate_core::{Policy, Store};
use tollgate_redis::redis::{self, aio::MultiplexedConnection};
use tollgate_redis::RedisStore;

const TASKS: usize = 50;
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(5);
/// Distinct subjects for the random-key runs.
const KEYS: u64 = 100_000;
const PREFIX: &str = "bench";

/// One row of the table.
struct Row {
    client: &'static str,
    keys: &'static str,
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
}

/// A small xorshift generator per task: random subjects without a
/// dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[rank.min(sorted.len() - 1)])
}

/// Runs `call(task, rng)` in `TASKS` concurrent tasks: warm-up, then
/// `MEASURE` of counted calls with their latencies.
async fn drive<F, Fut>(call: F) -> (f64, f64, f64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let start = Instant::now();
    let measure_from = start + WARM_UP;
    let measure_until = measure_from + MEASURE;
    let handles: Vec<_> = (0..TASKS)
        .map(|task| {
            let call = Arc::clone(&call);
            tokio::spawn(async move {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ ((task as u64 + 1) * 0x2545_F491));
                let mut latencies = Vec::with_capacity(64 * 1024);
                let mut failures = 0_u64;
                loop {
                    let began = Instant::now();
                    if began >= measure_until {
                        break;
                    }
                    let ok = call(task, rng.next()).await;
                    if began >= measure_from {
                        let micros = began.elapsed().as_micros();
                        latencies.push(u32::try_from(micros).unwrap_or(u32::MAX));
                        if !ok {
                            failures += 1;
                        }
                    }
                }
                (latencies, failures)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut failures = 0;
    for handle in handles {
        let (latencies, failed) = handle.await.expect("bench task panicked");
        all.extend(latencies);
        failures += failed;
    }
    assert_eq!(failures, 0, "calls failed during the measurement");
    all.sort_unstable();
    let per_second = all.len() as f64 / MEASURE.as_secs_f64();
    (per_second, percentile(&all, 0.50), percentile(&all, 0.99))
}

fn host_port(url: &str) -> (String, u16) {
    let info = redis::IntoConnectionInfo::into_connection_info(url).expect("a valid Redis URL");
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        other => panic!("the bench needs a TCP Redis URL, got {other}"),
    }
}

/// Runs redis-benchmark on the check script and parses its CSV line.
fn redis_benchmark(
    binary: &str,
    url: &str,
    sha: &str,
    key: &str,
    policy: &Policy,
    requests: u64,
) -> Row {
    let (host, port) = host_port(url);
    let output = Command::new(binary)
        .args(["-h", &host, "-p", &port.to_string()])
        .args(["-c", &TASKS.to_string(), "-n", &requests.to_string()])
        .args(["-r", &KEYS.to_string(), "--csv"])
        .args(["EVALSHA", sha, "1", key, "", "1"])
        .arg(policy.limit().to_string())
        .arg(policy.period_micros().to_string())
        .arg(policy.capacity().to_string())
        .output()
        .unwrap_or_else(|e| panic!("could not run {binary}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && !stdout.contains("Error"),
        "redis-benchmark failed: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find(|line| line.starts_with("\"EVALSHA"))
        .unwrap_or_else(|| panic!("no result line in redis-benchmark's output: {stdout}"));
    let fields: Vec<f64> = line
        .split("\",\"")
        .skip(1)
        .map(|f| f.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    // rps, avg, min, p50, p95, p99, max (latencies in ms)
    Row {
        client: "redis-benchmark EVALSHA",
        keys: if key.contains("__rand_int__") {
            "random"
        } else {
            "hot"
        },
        per_second: fields[0],
        p50_us: fields[3] * 1000.0,
        p99_us: fields[5] * 1000.0,
    }
}

fn main() {
    let url = std::env::var("TOLLGATE_REDIS_URL").expect(
        "TOLLGATE_REDIS_URL is not set: run `cargo xtask bench redis` (it starts a fresh redis-server)",
    );
    let benchmark = std::env::var("TOLLGATE_REDIS_BENCHMARK").expect(
        "TOLLGATE_REDIS_BENCHMARK is not set: run `cargo xtask bench redis` with redis-benchmark on PATH",
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let policy = Policy::per_second(1_000)
        .name("gcra")
        .build()
        .expect("valid policy");
    let store = runtime.block_on(async {
        let store = RedisStore::builder()
            .url(&url)
            .prefix(PREFIX)
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("the store builds");
        store.ping().await.expect("the bench server answers PING");
        // Loads the script, so redis-benchmark's EVALSHA finds it.
        store
            .check("warm", std::slice::from_ref(&policy), 1)
            .await
            .expect("a first check");
        store
    });
    let version = runtime.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("valid URL");
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection");
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut connection)
            .await
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned()
    });
    // The script the store runs for this policy: redis-benchmark sends the
    // same EVALSHA.
    let sha = store
        .script_sha(std::slice::from_ref(&policy))
        .expect("a script for GCRA");

    println!();
    println!(
        "tollgate-redis throughput: {TASKS} concurrent tasks, GCRA {}/s, Redis {version} at {url}",
        policy.limit()
    );
    let mut rows = Vec::new();

    for (keys, hot) in [("random", false), ("hot", true)] {
        let store = store.clone();
        let policy = policy.clone();
        let (per_second, p50_us, p99_us) = runtime.block_on(drive(move |_, r| {
            let subject = if hot {
                "hot".to_owned()
            } else {
                format!("user-{}", r % KEYS)
            };
            let future = store.check(&subject, std::slice::from_ref(&policy), 1);
            async move { future.await.is_ok() }
        }));
        rows.push(Row {
            client: "RedisStore::check",
            keys,
            per_second,
            p50_us,
            p99_us,
        });
    }

    for (keys, key) in [
        ("random", format!("{PREFIX}:{{user-__rand_int__}}:gcra")),
        ("hot", format!("{PREFIX}:{{hot}}:gcra")),
    ] {
        let random_rate = rows
            .iter()
            .find(|r| r.keys == keys)
            .map_or(50_000.0, |r| r.per_second);
        // About as long as the other runs.
        let requests = ((random_rate * MEASURE.as_secs_f64()) as u64).max(10_000);
        rows.push(redis_benchmark(
            &benchmark, &url, &sha, &key, &policy, requests,
        ));
    }

    let connections: Vec<MultiplexedConnection> = runtime.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("valid URL");
        let mut connections = Vec::new();
        for _ in 0..tollgate_redis::DEFAULT_POOL_SIZE {
            connections.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("a connection"),
            );
        }
        connections
    });
    let (per_second, p50_us, p99_us) = runtime.block_on(drive(move |task, r| {
        let mut connection = connections[task % connections.len()].clone();
        let key = format!("{PREFIX}:naive:user-{}", r % KEYS);
        async move {
            let result: redis::RedisResult<(i64, bool)> = redis::pipe()
                .atomic()
                .incr(&key, 1)
                .expire(&key, 60)
                .query_async(&mut connection)
                .await;
            result.is_ok()
        }
    }));
    rows.push(Row {
        client: "naive MULTI/INCR/EXPIRE/EXEC",
        keys: "random",
        per_second,
        p50_us,
        p99_us,
    });

    println!();
    println!(
        "| {:<30} | {:<6} | {:>10} | {:>8} | {:>8} |",
        "client", "keys", "checks/s", "p50 µs", "p99 µs"
    );
    println!(
        "|{:-<32}|{:-<8}|{:->12}|{:->10}|{:->10}|",
        "", "", "", "", ""
    );
    for row in &rows {
        println!(
            "| {:<30} | {:<6} | {:>10.0} | {:>8.0} | {:>8.0} |",
            row.client, row.keys, row.per_second, row.p50_us, row.p99_us
        );
    }
    println!();
    let rate = |client: &str, keys: &str| {
        rows.iter()
            .find(|r| r.client.starts_with(client) && r.keys == keys)
            .map_or(f64::NAN, |r| r.per_second)
    };
    for keys in ["random", "hot"] {
        let ratio = rate("RedisStore", keys) / rate("redis-benchmark", keys);
        println!(
            "RedisStore / redis-benchmark ({keys} keys): {ratio:.2}x (goal >= 0.90x){}",
            if ratio >= 0.9 { "" } else { "  BELOW GOAL" }
        );
    }
    println!(
        "RedisStore / naive MULTI recipe (random keys): {:.2}x",
        rate("RedisStore", "random") / rate("naive", "random")
    );
    println!();

    // One sequential call: the store next to a bare EVALSHA of the same
    // script through the redis crate (what the store adds per call).
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut group = criterion.benchmark_group("sequential_gcra_check");
    {
        group.bench_function("RedisStore::check", |b| {
            b.to_async(&runtime).iter(|| {
                let future = store.check("sequential", std::slice::from_ref(&policy), 1);
                async move { future.await.expect("check") }
            });
        });
    }
    {
        let connection = runtime.block_on(async {
            redis::Client::open(url.as_str())
                .expect("valid URL")
                .get_multiplexed_async_connection()
                .await
                .expect("a connection")
        });
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha)
            .arg(1)
            .arg(store.key_for("sequential", policy.name()))
            .arg("")
            .arg(1)
            .arg(policy.limit())
            .arg(policy.period_micros())
            .arg(policy.capacity());
        group.bench_function("bare EVALSHA (redis crate)", |b| {
            b.to_async(&runtime).iter(|| {
                let mut connection = connection.clone();
                let cmd = cmd.clone();
                async move {
                    let _: redis::Value = cmd.query_async(&mut connection).await.expect("EVALSHA");
                }
            });
        });
    }
    group.finish();
    criterion.final_summary();
}
