//! Requests per second and latency of a hello-world Axum server: bare, with
//! the rate-limit layer on the memory store (default headers, and headers
//! only on limited responses), with tower_governor 0.8, and with the layer
//! on Redis.
//!
//! First, instructions per request over a bare handler (callgrind, in
//! process, with tower_governor 0.8 beside portcullis: see
//! `support/instructions.rs`; `PORTCULLIS_BENCH_NO_CALLGRIND=1` skips it,
//! `PORTCULLIS_BENCH_CALLGRIND_ONLY=1` runs only it): the stable figure.
//!
//! Then requests per second with `wrk` out of process, the server pinned
//! to CPU 0 and wrk to CPU 1, the configurations taking turns (see
//! `support/wrk.rs`). Without `wrk` (`apt-get install wrk`) or `taskset`,
//! or with `PORTCULLIS_BENCH_IN_PROCESS=1`, the older in-process run below
//! is used instead: one HTTP/1.1 load generator in this process (Hyper
//! client, a fixed number of keep-alive connections each with one request
//! in flight), sharing the cores with the server.
//!
//! Run with `cargo xtask bench http`, or
//! `PORTCULLIS_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p portcullis-tower --bench http_throughput`.
//! Without `PORTCULLIS_REDIS_URL` the Redis column is skipped. Tune with
//! `PORTCULLIS_BENCH_SECS` (seconds per measurement; default 3 with wrk, 2
//! in process), `PORTCULLIS_BENCH_ROUNDS` (default 5; the configurations take
//! turns, and medians over rounds are reported, the ratio as the median of
//! per-round ratios to the bare server) and `PORTCULLIS_BENCH_CONCURRENCY`
//! (connections; default 32 with wrk, 64 in process).
//!
//! Two more configurations of the memory-store layer: with
//! `HeaderMode::LimitedOnly`, showing how much of the cost is the two
//! `RateLimit` header lines on every admitted response, and with
//! `keep_body()` (default headers), whose responses stay in Axum's own
//! `Body` so Axum does not box a wrapper body per response.
//!
//! The policy is far above the offered load (one million per second per
//! client), so every request is checked and admitted: the numbers show the
//! cost of the check, not of rejections. Requests are keyed by the default
//! `PeerIp` (one key: every connection comes from 127.0.0.1), as
//! tower_governor 0.8's `GovernorLayer` (`PeerIp`, a burst of one million
//! and one permit per nanosecond: equally generous), measured beside it.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use portcullis_core::{MemoryStore, Policy, Store};
use portcullis_redis::RedisStore;
use portcullis_tower::{HeaderMode, RateLimitLayer};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn policy() -> Policy {
    // Policy values are constants that always validate.
    Policy::per_second(1_000_000)
        .name("bench")
        .build()
        .expect("valid policy")
}

/// The bare handler.
fn app() -> Router {
    with_peer(handler())
}

fn handler() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// For every configuration alike, outermost: the peer address copied from
/// Axum's `ConnectInfo` into a `SocketAddr` extension, where `PeerIp` reads
/// it without the `axum` feature.
fn with_peer(router: Router) -> Router {
    router.layer(axum::middleware::map_request(
        |mut request: axum::extract::Request| async move {
            if let Some(axum::extract::ConnectInfo(peer)) = request
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .copied()
            {
                request.extensions_mut().insert(peer);
            }
            request
        },
    ))
}

/// tower_governor 0.8 with the same generous limit, keyed by peer IP.
fn governor() -> Router {
    let config = tower_governor::governor::GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .finish()
        .expect("valid governor config");
    with_peer(handler().layer(tower_governor::GovernorLayer::new(config)))
}

/// The same with `use_headers()`: `x-ratelimit-limit` and
/// `x-ratelimit-remaining` on every admitted response, as portcullis's
/// default headers.
fn governor_with_headers() -> Router {
    let config = tower_governor::governor::GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .expect("valid governor config");
    with_peer(handler().layer(tower_governor::GovernorLayer::new(config)))
}

fn limited<St: Store>(store: St) -> Router {
    limited_with(store, HeaderMode::All)
}

fn limited_with<St: Store>(store: St, headers: HeaderMode) -> Router {
    let layer = RateLimitLayer::builder(store)
        .policy(policy())
        .headers(headers)
        .build()
        .expect("valid layer");
    with_peer(handler().layer(layer))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    addr
}

/// CPU time this process has used (user + system), from `/proc/self/stat`;
/// `None` where that file does not exist.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 12th and 13th of those, in clock ticks (100 per second on Linux).
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ').skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

#[derive(Debug, Default)]
struct Run {
    requests: u64,
    errors: u64,
    elapsed: Duration,
    /// Microseconds per request.
    latencies: Vec<u32>,
    /// CPU time the process (server and load generator) used.
    cpu: Option<Duration>,
}

impl Run {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&mut self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        self.latencies.sort_unstable();
        let rank = ((self.latencies.len() as f64) * p).ceil() as usize;
        Duration::from_micros(u64::from(
            self.latencies[rank.clamp(1, self.latencies.len()) - 1],
        ))
    }
}

/// One keep-alive connection sending requests back to back until `end`.
async fn connection(addr: SocketAddr, end: Instant) -> Run {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut run = Run::default();
    let start = Instant::now();
    while Instant::now() < end {
        let request = Request::get("/")
            .header("host", "127.0.0.1")
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        let sent = Instant::now();
        let ok = match sender.send_request(request).await {
            Ok(response) => {
                let status = response.status();
                let body = response.into_body().collect().await;
                status == StatusCode::OK && body.is_ok()
            }
            Err(_) => false,
        };
        run.latencies
            .push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
        run.requests += 1;
        if !ok {
            run.errors += 1;
            break;
        }
    }
    run.elapsed = start.elapsed();
    run
}

async fn load(addr: SocketAddr, concurrency: usize, duration: Duration) -> Run {
    let cpu_before = process_cpu();
    let end = Instant::now() + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| tokio::spawn(connection(addr, end)))
        .collect();
    let mut total = Run::default();
    for task in tasks {
        let run = task.await.expect("load task");
        total.requests += run.requests;
        total.errors += run.errors;
        total.elapsed = total.elapsed.max(run.elapsed);
        total.latencies.extend(run.latencies);
    }
    total.cpu = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    total
}

struct Target {
    name: &'static str,
    addr: SocketAddr,
    /// Per round: req/s, p50, p99, errors.
    rounds: Vec<(f64, Duration, Duration, u64)>,
    /// Per round: CPU microseconds per request (server and client).
    cpu_per_request: Vec<f64>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

impl Target {
    fn new(name: &'static str, addr: SocketAddr) -> Self {
        Self {
            name,
            addr,
            rounds: Vec::new(),
            cpu_per_request: Vec::new(),
        }
    }

    fn median_of(&self, f: impl Fn(&(f64, Duration, Duration, u64)) -> f64) -> f64 {
        median(self.rounds.iter().map(f).collect())
    }

    /// The median over rounds of this target's throughput relative to the
    /// bare server's in the same round (robust to load that drifts between
    /// rounds).
    fn median_ratio(&self, bare: &Target) -> f64 {
        median(
            self.rounds
                .iter()
                .zip(&bare.rounds)
                .map(|(t, b)| t.0 / b.0)
                .collect(),
        )
    }

    /// The bare server's CPU per request over this target's, as a median
    /// over rounds: the throughput ratio if the cores were not shared.
    fn cpu_ratio(&self, bare: &Target) -> Option<f64> {
        if self.cpu_per_request.is_empty() || bare.cpu_per_request.is_empty() {
            return None;
        }
        Some(median(bare.cpu_per_request.clone()) / median(self.cpu_per_request.clone()))
    }
}

/// Nanoseconds per request through the Router in process (no network):
/// the CPU cost of the layer on its own.
async fn in_process_ns(app: Router, iterations: u32) -> f64 {
    use tower::ServiceExt;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        for i in 0..iterations {
            // Eight clients, by peer address (as a server with
            // `into_make_service_with_connect_info` sets it).
            let peer = SocketAddr::from(([192, 0, 2, (i % 8) as u8], 4711));
            let request = Request::get("/")
                .extension(axum::extract::ConnectInfo(peer))
                .body(axum::body::Body::empty())
                .expect("valid request");
            let response = app.clone().oneshot(request).await.expect("infallible");
            assert_eq!(response.status(), StatusCode::OK);
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e9 / f64::from(iterations));
    }
    best
}

async fn bench() {
    let secs: f64 = env_or("PORTCULLIS_BENCH_SECS", 2.0);
    let rounds: usize = env_or("PORTCULLIS_BENCH_ROUNDS", 5).max(1);
    let concurrency: usize = env_or("PORTCULLIS_BENCH_CONCURRENCY", 64).max(1);
    let duration = Duration::from_secs_f64(secs);

    let mut targets = vec![
        Target::new("bare", serve(app()).await),
        Target::new(
            "layer + MemoryStore",
            serve(limited(MemoryStore::new())).await,
        ),
        // The same without RateLimit fields on admitted responses: how much
        // of the cost is writing and parsing two more header lines.
        Target::new(
            "  same, no headers",
            serve(limited_with(MemoryStore::new(), HeaderMode::LimitedOnly)).await,
        ),
        Target::new("tower_governor 0.8", serve(governor()).await),
    ];
    match std::env::var("PORTCULLIS_REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let store = RedisStore::builder()
                .url(&url)
                .prefix(format!("bench-http-{nanos}"))
                .pool_size(16)
                .build()
                .await
                .expect("valid Redis configuration");
            store
                .ping()
                .await
                .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}"));
            targets.push(Target::new(
                "layer + RedisStore",
                serve(limited(store)).await,
            ));
        }
        _ => eprintln!(
            "PORTCULLIS_REDIS_URL is not set: skipping RedisStore (run `cargo xtask bench http`)"
        ),
    }

    println!(
        "http_throughput: hello-world Axum, {concurrency} keep-alive HTTP/1.1 connections, {secs} s x {rounds} rounds per configuration, {} worker threads",
        tokio::runtime::Handle::current().metrics().num_workers()
    );
    for target in &targets {
        // Warm up connections, allocator and (for Redis) the script cache.
        let _ = load(target.addr, concurrency, Duration::from_millis(500)).await;
    }
    for round in 0..rounds {
        for target in &mut targets {
            let mut run = load(target.addr, concurrency, duration).await;
            let (p50, p99) = (run.percentile(0.50), run.percentile(0.99));
            eprintln!(
                "  round {} {:<20} {:>10.0} req/s  p50 {:>8?}  p99 {:>8?}",
                round + 1,
                target.name,
                run.per_second(),
                p50,
                p99
            );
            target.rounds.push((run.per_second(), p50, p99, run.errors));
            if let Some(cpu) = run.cpu.filter(|_| run.requests > 0) {
                target
                    .cpu_per_request
                    .push(cpu.as_secs_f64() * 1e6 / run.requests as f64);
            }
        }
    }

    println!();
    println!("| configuration | req/s | p50 | p99 | vs bare | CPU µs/request | vs bare by CPU | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for target in &targets {
        let cpu = if target.cpu_per_request.is_empty() {
            f64::NAN
        } else {
            median(target.cpu_per_request.clone())
        };
        println!(
            "| {} | {:.0} | {:.0} µs | {:.0} µs | {:.2}x | {:.1} | {} | {} |",
            target.name,
            target.median_of(|r| r.0),
            target.median_of(|r| r.1.as_secs_f64() * 1e6),
            target.median_of(|r| r.2.as_secs_f64() * 1e6),
            target.median_ratio(&targets[0]),
            cpu,
            target
                .cpu_ratio(&targets[0])
                .map_or("n/a".to_owned(), |r| format!("{r:.2}x")),
            target.rounds.iter().map(|r| r.3).sum::<u64>()
        );
    }
    println!(
        "(medians over rounds; \"vs bare\" is the median of per-round throughput ratios; \"by CPU\" compares \
         CPU time per request of the whole process, server and load generator, which other load on the machine disturbs less)"
    );

    let bare_ns = in_process_ns(app(), 200_000).await;
    let memory_ns = in_process_ns(limited(MemoryStore::new()), 200_000).await;
    println!();
    println!(
        "in process, no network: bare Router {bare_ns:.0} ns/request, with the layer on MemoryStore {memory_ns:.0} ns/request (+{:.0} ns)",
        memory_ns - bare_ns
    );
    let memory = targets[1].median_ratio(&targets[0]);
    println!();
    println!(
        "memory-store layer keeps {:.2}x of the bare throughput (goal: at least 0.90x): {}",
        memory,
        if memory >= 0.9 { "met" } else { "NOT met" }
    );
    if let Some(by_cpu) = targets[1].cpu_ratio(&targets[0]) {
        println!("by CPU per request: {by_cpu:.2}x");
    }
}

#[path = "support/instructions.rs"]
mod instructions;
#[path = "support/wrk.rs"]
mod wrk;

/// The router of one configuration of the out-of-process run.
async fn router(config: &str) -> Router {
    match config {
        "portcullis" => limited(MemoryStore::new()),
        "portcullis-limited-only" => limited_with(MemoryStore::new(), HeaderMode::LimitedOnly),
        "portcullis-keep-body" => {
            let layer = RateLimitLayer::builder(MemoryStore::new())
                .policy(policy())
                .build()
                .expect("valid layer");
            with_peer(handler().layer(layer.keep_body()))
        }
        "governor" => governor(),
        "governor-headers" => governor_with_headers(),
        "portcullis-redis" => {
            let url = std::env::var("PORTCULLIS_REDIS_URL").expect("PORTCULLIS_REDIS_URL");
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let store = RedisStore::builder()
                .url(&url)
                .prefix(format!("bench-http-{nanos}"))
                .pool_size(16)
                .build()
                .await
                .expect("valid Redis configuration");
            limited(store)
        }
        _ => app(),
    }
}

/// The server child of the out-of-process run: every configuration on its
/// own port, on one Tokio thread, until killed.
fn serve_child() -> bool {
    let Ok(configs) = std::env::var(wrk::SERVE) else {
        return false;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        for config in configs.split(',') {
            let addr = serve(router(config).await).await;
            println!("{config} {}", addr.port());
        }
        println!("ready");
        std::future::pending::<()>().await;
    });
    true
}

fn main() {
    if instructions::child() || serve_child() {
        return;
    }
    // The stable figure first: instructions per request under callgrind.
    if std::env::var_os("PORTCULLIS_BENCH_NO_CALLGRIND").is_none() {
        instructions::report();
        if std::env::var_os("PORTCULLIS_BENCH_CALLGRIND_ONLY").is_some() {
            return;
        }
    }
    if std::env::var_os("PORTCULLIS_BENCH_IN_PROCESS").is_none() && wrk::available() {
        let mut configs = vec![
            "bare",
            "portcullis",
            "portcullis-limited-only",
            "portcullis-keep-body",
            "governor",
            "governor-headers",
        ];
        if std::env::var("PORTCULLIS_REDIS_URL").is_ok_and(|url| !url.is_empty()) {
            configs.push("portcullis-redis");
        }
        wrk::report(&configs);
        return;
    }
    eprintln!("wrk or taskset not found (apt-get install wrk): the load generator runs in process");
    // `cargo bench` passes `--bench`; this harness takes no arguments.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(bench());
}
