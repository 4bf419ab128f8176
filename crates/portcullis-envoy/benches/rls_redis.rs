//! The Redis cost of Envoy's `ShouldRateLimit`: `RlsService::decide` on a
//! `RedisStore` (every descriptor of a request in one atomic Lua call),
//! beside envoyproxy/ratelimit's Redis traffic reproduced as a peer (per
//! descriptor `INCRBY key hits` and `EXPIRE key window`, keys
//! `domain_key_value_windowstart`, one pipeline per request, not atomic:
//! its `fixed_cache_impl.go` with the defaults, no local cache, no
//! near-limit reads), on the same requests.
//!
//! Run with `cargo xtask bench envoy`, or by hand:
//! `PORTCULLIS_REDIS_SERVER=$(which redis-server) cargo bench -p portcullis-envoy --bench rls_redis`.
//!
//! Workloads: requests of 1 descriptor (`remote_address`) and of 3
//! (`remote_address`, `tenant`, `route`); values random (addresses over
//! 100k, tenants over 1k, routes over 16: nearly all admitted) or one hot
//! value of each. Rules per second, as the peer's units are: 100/s per
//! address, 1 000/s per tenant, 10 000/s per route, portcullis as fixed
//! windows (the peer's semantics) and as GCRA.
//!
//! 1. **Server instructions per descriptor**: `redis-server` under
//!    valgrind's callgrind, pinned to core 0 (`benches/support/server.rs`
//!    of portcullis-redis, shared with `redis_throughput`); per workload
//!    two request counts, and the instructions of the larger minus those
//!    of the smaller, divided by the difference in descriptors (start-up,
//!    connection and script loading cancel). The hot value is paced at 200
//!    requests/s on the client's clock, so about half pass the 100/s rule.
//! 2. **Requests/s**: a plain server on core 0, this client pinned to the
//!    other cores and on one thread, 50 requests in flight on one
//!    multiplexed connection; the three implementations interleaved, round
//!    after round (`ROUNDS`), median and range; also per second of this
//!    client's CPU time and of the server's (`/proc`): the figures per core
//!    of each side. Wall-clock figures move 2–3× on a shared machine;
//!    the instructions hold still.
//!
//! `PORTCULLIS_BENCH_INSTRUCTIONS_ONLY=1` skips part 2.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use portcullis_envoy::{Config, LiveConfig, RlsService};
use portcullis_redis::RedisStore;
use redis::aio::MultiplexedConnection;

#[path = "../../portcullis-redis/benches/support/server.rs"]
mod server;
use server::{cpu_seconds_of, Server};

const DOMAIN: &str = "edge";
/// Each descriptor's key, how many random values it takes, and its rule
/// (requests per second).
const RULES: [(&str, u64, u64); 3] = [
    ("remote_address", 100_000, 100),
    ("tenant", 1_000, 1_000),
    ("route", 16, 10_000),
];
const TASKS: usize = 50;
const ROUNDS: usize = 3;
const RUN_TIME: Duration = Duration::from_millis(1500);
/// Requests of the two counts (random values; the hot one runs a fifth
/// as many, paced).
const SMALL: u64 = 1_000;
const LARGE: u64 = 4_000;
const HOT_PACE: Duration = Duration::from_millis(5);

fn main() {
    pin_away_from_the_server();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(run());
}

/// Pins this process to every core but 0, where the servers run (before
/// any other thread exists, so all inherit it).
fn pin_away_from_the_server() {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores < 2 {
        println!("one core: the client shares it with the server");
        return;
    }
    let pinned = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &format!("1-{}", cores - 1)])
        .arg(std::process::id().to_string())
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !pinned {
        println!("could not pin the client with taskset: it may share core 0 with the server");
    }
}

/// One implementation of `ShouldRateLimit`'s Redis side.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    FixedWindow,
    Gcra,
    Peer,
}

impl Kind {
    const ALL: [Self; 3] = [Self::FixedWindow, Self::Gcra, Self::Peer];

    fn name(self) -> &'static str {
        match self {
            Self::FixedWindow => "portcullis fixed window",
            Self::Gcra => "portcullis GCRA",
            Self::Peer => "peer INCRBY+EXPIRE",
        }
    }
}

#[derive(Clone)]
enum Target {
    Portcullis(RlsService),
    Peer(MultiplexedConnection),
}

impl Target {
    async fn new(kind: Kind, url: &str) -> Self {
        let algorithm = match kind {
            Kind::Peer => {
                let connection = redis::Client::open(url)
                    .expect("a URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("a connection");
                return Self::Peer(connection);
            }
            Kind::FixedWindow => "fixed_window",
            Kind::Gcra => "gcra",
        };
        let mut toml = format!("[[domains]]\nname = \"{DOMAIN}\"\n");
        for (key, _, limit) in RULES {
            toml.push_str(&format!(
                "[[domains.descriptors]]\nkey = \"{key}\"\nlimit = {limit}\nperiod = \"1s\"\nalgorithm = \"{algorithm}\"\n"
            ));
        }
        let config = Config::parse("bench.toml", &toml).expect("a configuration");
        let store = RedisStore::builder()
            .url(url)
            .pool_size(1)
            .timeout(Duration::from_secs(30))
            .build()
            .await
            .expect("a store");
        Self::Portcullis(RlsService::builder(LiveConfig::new(config), store).build())
    }

    /// Decides one request; whether it passed.
    async fn decide(&mut self, request: &RateLimitRequest) -> bool {
        match self {
            Self::Portcullis(service) => {
                service
                    .decide(request)
                    .await
                    .expect("a decision")
                    .overall_code
                    == Code::Ok as i32
            }
            Self::Peer(connection) => peer_decide(connection, request).await,
        }
    }
}

/// envoyproxy/ratelimit's `DoLimit` on Redis with its defaults: for each
/// descriptor with a rule, `INCRBY` its window's key by the hits and
/// `EXPIRE` it after the unit's seconds, all in one pipeline (no
/// `MULTI`); a descriptor is over when its count after the increment
/// passes the limit. Counts go up even on denial, as there.
async fn peer_decide(connection: &mut MultiplexedConnection, request: &RateLimitRequest) -> bool {
    const WINDOW: u64 = 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let start = now / WINDOW * WINDOW;
    let hits = u64::from(request.hits_addend.max(1));
    let mut pipe = redis::pipe();
    let mut limits = Vec::with_capacity(request.descriptors.len());
    for descriptor in &request.descriptors {
        let Some(first) = descriptor.entries.first() else {
            continue;
        };
        let Some((_, _, limit)) = RULES.iter().find(|(key, _, _)| *key == first.key) else {
            continue;
        };
        let mut key = String::with_capacity(64);
        key.push_str(&request.domain);
        key.push('_');
        for entry in &descriptor.entries {
            key.push_str(&entry.key);
            key.push('_');
            key.push_str(&entry.value);
            key.push('_');
        }
        key.push_str(&start.to_string());
        pipe.cmd("INCRBY").arg(&key).arg(hits);
        pipe.cmd("EXPIRE").arg(&key).arg(WINDOW).ignore();
        limits.push(*limit);
    }
    let counts: Vec<u64> = pipe
        .query_async(connection)
        .await
        .expect("a pipeline reply");
    counts
        .iter()
        .zip(&limits)
        .all(|(count, limit)| count <= limit)
}

/// A small xorshift: values without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A request of `descriptors` descriptors (1 or 3), random values or the
/// hot ones.
fn request(descriptors: usize, hot: bool, state: &mut u64) -> RateLimitRequest {
    let descriptors = RULES[..descriptors]
        .iter()
        .map(|(key, space, _)| {
            let value = if hot {
                "hot".to_owned()
            } else {
                let n = next(state) % space;
                match *key {
                    "remote_address" => format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255),
                    "tenant" => format!("tenant-{n}"),
                    _ => format!("/api/v1/route-{n}"),
                }
            };
            RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*key).to_owned(),
                    value,
                }],
                ..RateLimitDescriptor::default()
            }
        })
        .collect();
    RateLimitRequest {
        domain: DOMAIN.to_owned(),
        descriptors,
        hits_addend: 1,
    }
}

/// One workload: descriptors per request, hot or random values.
#[derive(Clone, Copy)]
struct Workload {
    descriptors: usize,
    hot: bool,
}

impl Workload {
    const ALL: [Self; 4] = [
        Self {
            descriptors: 1,
            hot: false,
        },
        Self {
            descriptors: 1,
            hot: true,
        },
        Self {
            descriptors: 3,
            hot: false,
        },
        Self {
            descriptors: 3,
            hot: true,
        },
    ];

    fn name(self) -> String {
        format!(
            "{} descriptor{}, {}",
            self.descriptors,
            if self.descriptors == 1 { "" } else { "s" },
            if self.hot { "hot" } else { "random" }
        )
    }
}

/// Runs `n` requests: random values from TASKS tasks, or the hot values
/// paced. Returns how many passed.
async fn requests(target: &Target, workload: Workload, n: u64, seed: u64) -> u64 {
    if workload.hot {
        let mut target = target.clone();
        let mut state = seed | 1;
        let mut passed = 0;
        let mut tick = tokio::time::interval(HOT_PACE);
        for _ in 0..n {
            tick.tick().await;
            let request = request(workload.descriptors, true, &mut state);
            passed += u64::from(target.decide(&request).await);
        }
        return passed;
    }
    let issued = Arc::new(AtomicU64::new(0));
    let passed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS as u64 {
        let mut target = target.clone();
        let issued = Arc::clone(&issued);
        let passed = Arc::clone(&passed);
        tasks.push(tokio::spawn(async move {
            let mut state = seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while issued.fetch_add(1, Ordering::Relaxed) < n {
                let request = request(workload.descriptors, false, &mut state);
                if target.decide(&request).await {
                    passed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("no task panicked");
    }
    passed.load(Ordering::Relaxed)
}

/// Server instructions per descriptor, (I(large) - I(small)) / (large -
/// small) / descriptors, and the share of requests passed.
async fn instructions(server: &Server, target: &Target, workload: Workload) -> (f64, f64) {
    let (small, large) = if workload.hot {
        (SMALL / 5, LARGE / 5)
    } else {
        (SMALL, LARGE)
    };
    // Another workload's keys expiring would count here: none are left.
    flush(server).await;
    // Warm: load the functions, open the connections.
    requests(target, workload, 50, 1).await;
    server.instructions();
    let passed_small = requests(target, workload, small, 2).await;
    let i_small = server.instructions();
    let passed_large = requests(target, workload, large, 3).await;
    let i_large = server.instructions();
    let per_descriptor =
        (i_large as f64 - i_small as f64) / ((large - small) as f64 * workload.descriptors as f64);
    let passed = (passed_small + passed_large) as f64 / (small + large) as f64;
    (per_descriptor, passed)
}

/// Empties the keyspace (the Functions and scripts stay loaded).
async fn flush(server: &Server) {
    let mut connection = redis::Client::open(server.url())
        .expect("a URL")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let () = redis::cmd("FLUSHALL")
        .query_async(&mut connection)
        .await
        .expect("FLUSHALL");
}

/// Requests per second of CPU time, from CPU seconds before and after
/// (`NaN` without `/proc`).
fn per_cpu(done: u64, before: Option<f64>, after: Option<f64>) -> f64 {
    match (before, after) {
        (Some(before), Some(after)) if after > before => done as f64 / (after - before),
        _ => f64::NAN,
    }
}

/// One run at the ceiling: requests/s of wall-clock time, and requests
/// per second of this client's CPU time and of the server's.
async fn throughput(server: &Server, target: &Target, workload: Workload, seed: u64) -> [f64; 3] {
    let deadline = Instant::now() + RUN_TIME;
    let server_before = server.cpu_seconds();
    let client_before = cpu_seconds_of("self");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS as u64 {
        let mut target = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut state = seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut done = 0_u64;
            while Instant::now() < deadline {
                let request = request(workload.descriptors, workload.hot, &mut state);
                target.decide(&request).await;
                done += 1;
            }
            done
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += task.await.expect("no task panicked");
    }
    let wall = started.elapsed().as_secs_f64();
    [
        done as f64 / wall,
        per_cpu(done, client_before, cpu_seconds_of("self")),
        per_cpu(done, server_before, server.cpu_seconds()),
    ]
}

fn median_range(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn thousands((median, low, high): (f64, f64, f64)) -> String {
    format!("{:.1}k [{:.1}–{:.1}k]", median / 1e3, low / 1e3, high / 1e3)
}

async fn run() {
    let started = Instant::now();
    // instructions[workload][kind] = (per descriptor, share passed)
    let mut instructions_of = vec![[(0.0, 0.0); 3]; Workload::ALL.len()];
    println!(
        "server instructions per descriptor (callgrind on redis-server, pinned to core 0) ..."
    );
    {
        let server = Server::start(true);
        for (k, kind) in Kind::ALL.into_iter().enumerate() {
            let target = Target::new(kind, &server.url()).await;
            for (w, workload) in Workload::ALL.into_iter().enumerate() {
                let (per, passed) = instructions(&server, &target, workload).await;
                println!(
                    "  {:<24} {:<26} {per:>8.0} per descriptor ({:.0}% of requests passed)",
                    kind.name(),
                    workload.name(),
                    100.0 * passed
                );
                instructions_of[w][k] = (per, passed);
            }
        }
    }
    println!();
    println!("| workload | fixed window | GCRA | peer INCRBY+EXPIRE | fixed window × peer | GCRA × peer |");
    println!("|---|---|---|---|---|---|");
    for (w, workload) in Workload::ALL.into_iter().enumerate() {
        let [(fixed, _), (gcra, _), (peer, _)] = instructions_of[w];
        println!(
            "| {} | {:.1}k | {:.1}k | {:.1}k | {:.2} | {:.2} |",
            workload.name(),
            fixed / 1e3,
            gcra / 1e3,
            peer / 1e3,
            fixed / peer,
            gcra / peer
        );
    }
    if std::env::var_os("PORTCULLIS_BENCH_INSTRUCTIONS_ONLY").is_some() {
        return;
    }
    println!();
    println!(
        "requests/s ({TASKS} in flight, {ROUNDS} rounds of {RUN_TIME:?}, implementations interleaved) ..."
    );
    let server = Server::start(false);
    let mut targets = Vec::new();
    for kind in Kind::ALL {
        targets.push(Target::new(kind, &server.url()).await);
    }
    // rates[workload][kind][wall, per client CPU s, per server CPU s][round]
    let mut rates = vec![vec![[Vec::new(), Vec::new(), Vec::new()]; 3]; Workload::ALL.len()];
    for round in 0..ROUNDS {
        for (w, workload) in Workload::ALL.into_iter().enumerate() {
            for (k, target) in targets.iter().enumerate() {
                let figures = throughput(&server, target, workload, 17 + round as u64).await;
                for (list, figure) in rates[w][k].iter_mut().zip(figures) {
                    list.push(figure);
                }
            }
        }
    }
    println!();
    println!("| workload | implementation | requests/s, wall clock | per client CPU second | per server CPU second | client / server CPU busy |");
    println!("|---|---|---|---|---|---|");
    for (w, workload) in Workload::ALL.into_iter().enumerate() {
        for (k, kind) in Kind::ALL.into_iter().enumerate() {
            let [wall, client, server] = rates[w][k].clone().map(median_range);
            println!(
                "| {} | {} | {} | {} | {} | {:.0}% / {:.0}% |",
                workload.name(),
                kind.name(),
                thousands(wall),
                thousands(client),
                thousands(server),
                100.0 * wall.0 / client.0,
                100.0 * wall.0 / server.0
            );
        }
    }
    println!();
    println!(
        "hot: paced at {} requests/s for the instructions; unpaced, so mostly denied by portcullis, for requests/s. Took {:.0} s.",
        1_000 / HOT_PACE.as_millis(),
        started.elapsed().as_secs_f64()
    );
}
