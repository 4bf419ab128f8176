//! `cargo xtask bench scale`: three instances of the quickstart's app on
//! one Redis, loaded out of process, on one hot subject and on 100 000
//! subjects: requests per second against the bare app, Redis calls and
//! Redis server instructions per request, checks per CPU second of Redis
//! and of the instances, p50 / p99, and the overshoot of a limited hot
//! subject against the bound the local budget states. The same on
//! `MemoryStore` (each instance its own), on Redis exact (one call per
//! check, coalesced) and on Redis with a local budget.
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
//! writes).
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

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use portcullis_core::{BoxStore, MemoryStore, Policy};
use portcullis_redis::{LocalBudget, RedisStore};
use portcullis_tower::{ClientIp, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

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
            portcullis_tests::option_pairs("scale", &args[1..]).and_then(|o| serve(&o))
        }
        Some("load") => portcullis_tests::option_pairs("scale", &args[1..]).and_then(|o| load(&o)),
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

fn get<T: std::str::FromStr>(options: &HashMap<String, String>, name: &str) -> Result<T, String> {
    options
        .get(name)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("--{name} is missing or invalid"))
}

// ---------------------------------------------------------------- serve

/// One app instance: `serve --port P --store bare|memory|redis|budget
/// [--redis URL] --limit N --burst B`.
fn serve(options: &HashMap<String, String>) -> Result<(), String> {
    let port: u16 = get(options, "port")?;
    let kind: String = get(options, "store")?;
    let limit: u64 = get(options, "limit")?;
    let burst: u64 = get(options, "burst")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let policy = Policy::per_second(limit)
            .burst(burst)
            .name("scale")
            .build()
            .map_err(|e| e.to_string())?;
        let hello = tower::service_fn(|_: Request<Incoming>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                b"hello",
            ))))
        });
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .map_err(|e| format!("port {port}: {e}"))?;
        let store: Option<BoxStore> = match kind.as_str() {
            "bare" => None,
            "memory" => Some(BoxStore::new(MemoryStore::new())),
            "redis" | "budget" => {
                let url: String = get(options, "redis")?;
                let mut builder = RedisStore::builder()
                    .url(url)
                    .prefix(get::<String>(options, "prefix")?);
                if kind == "budget" {
                    builder = builder.local_budget(
                        LocalBudget::new()
                            .max_permits(BUDGET_PERMITS)
                            .grant_period(Duration::from_millis(BUDGET_LEASE_MS)),
                    );
                }
                Some(BoxStore::new(
                    builder.build().await.map_err(|e| e.to_string())?,
                ))
            }
            other => return Err(format!("unknown store {other:?}")),
        };
        println!("ready");
        match store {
            None => accept(listener, hello).await,
            Some(store) => {
                let trusted = vec!["127.0.0.1/32".parse().map_err(|e| format!("{e:?}"))?];
                let layer = RateLimitLayer::builder(store)
                    .policy(policy)
                    .key(ClientIp::trusting(trusted))
                    .build()
                    .map_err(|e| e.to_string())?;
                accept(listener, layer.layer(hello)).await
            }
        }
        Ok(())
    })
}

/// Serves `service` on `listener` over HTTP/1, the peer address in each
/// request's extensions (where `ClientIp` reads the connection's address).
async fn accept<S, B>(listener: tokio::net::TcpListener, service: S)
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let per_connection = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(peer);
            service.clone().oneshot(request)
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), per_connection)
                .await;
        });
    }
}

// ----------------------------------------------------------------- load

/// The load generator: `load --ports a,b,c --subjects hot|many (--secs S |
/// --requests N) [--connections C]`; prints `requests ok limited other secs p50_us p99_us`
/// and then the admitted requests per 10 ms bucket.
fn load(options: &HashMap<String, String>) -> Result<(), String> {
    let ports: Vec<u16> = options
        .get("ports")
        .ok_or("--ports is missing")?
        .split(',')
        .map(|p| p.parse().map_err(|e| format!("port {p:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let hot = get::<String>(options, "subjects")? == "hot";
    let secs: Option<f64> = get(options, "secs").ok();
    let requests: Option<u64> = get(options, "requests").ok();
    let connections: usize = get(options, "connections").unwrap_or(CONNECTIONS);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .build_http();
        let sent = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = secs.map(|s| started + Duration::from_secs_f64(s));
        let mut tasks = Vec::new();
        for c in 0..connections {
            let client = client.clone();
            let sent = Arc::clone(&sent);
            let uri: http::Uri = format!("http://127.0.0.1:{}/", ports[c % ports.len()])
                .parse()
                .map_err(|e| format!("{e}"))?;
            tasks.push(tokio::spawn(async move {
                let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (c as u64 + 1);
                // (ok, limited, other, latencies, admitted per bucket)
                let mut counts = (0_u64, 0_u64, 0_u64, Vec::new(), Vec::<u64>::new());
                loop {
                    let n = sent.fetch_add(1, Ordering::Relaxed);
                    if requests.is_some_and(|r| n >= r)
                        || deadline.is_some_and(|d| Instant::now() >= d)
                    {
                        break;
                    }
                    let subject = if hot {
                        HOT.to_owned()
                    } else {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let i = state % SUBJECTS;
                        format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)
                    };
                    let request = Request::get(uri.clone())
                        .header("x-forwarded-for", subject)
                        .body(Empty::new())
                        .unwrap_or_default();
                    let begun = Instant::now();
                    let status = match client.request(request).await {
                        Ok(response) => {
                            let status = response.status();
                            let _ = response.into_body().collect().await;
                            status
                        }
                        Err(_) => StatusCode::BAD_GATEWAY,
                    };
                    let done = Instant::now();
                    counts
                        .3
                        .push(u64::try_from((done - begun).as_micros()).unwrap_or(u64::MAX));
                    match status {
                        StatusCode::OK => {
                            counts.0 += 1;
                            let bucket = usize::try_from(
                                (done - started).as_micros() / u128::from(BUCKET_US),
                            )
                            .unwrap_or(usize::MAX);
                            if bucket < 100_000 {
                                if counts.4.len() <= bucket {
                                    counts.4.resize(bucket + 1, 0);
                                }
                                counts.4[bucket] += 1;
                            }
                        }
                        StatusCode::TOO_MANY_REQUESTS => counts.1 += 1,
                        _ => counts.2 += 1,
                    }
                }
                counts
            }));
        }
        let (mut ok, mut limited, mut other) = (0, 0, 0);
        let mut latencies = Vec::new();
        let mut buckets: Vec<u64> = Vec::new();
        for task in tasks {
            let (o, l, x, lat, b) = task.await.map_err(|e| e.to_string())?;
            ok += o;
            limited += l;
            other += x;
            latencies.extend(lat);
            if buckets.len() < b.len() {
                buckets.resize(b.len(), 0);
            }
            for (sum, n) in buckets.iter_mut().zip(b) {
                *sum += n;
            }
        }
        let secs = started.elapsed().as_secs_f64();
        latencies.sort_unstable();
        let at = |q: f64| {
            latencies
                .get(((latencies.len().saturating_sub(1)) as f64 * q) as usize)
                .copied()
                .unwrap_or(0)
        };
        println!(
            "{} {ok} {limited} {other} {secs} {} {}",
            ok + limited + other,
            at(0.5),
            at(0.99)
        );
        println!(
            "{}",
            buckets
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        );
        Ok(())
    })
}

// ---------------------------------------------------------------- bench

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}

fn redis_server() -> String {
    std::env::var("PORTCULLIS_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A redis-server pinned to CPU 0, under callgrind when asked.
struct Redis {
    child: Child,
    port: u16,
    callgrind_out: Option<PathBuf>,
}

impl Redis {
    fn start(callgrind: bool) -> Result<Self, String> {
        let port = free_port();
        let out = std::env::temp_dir().join(format!("portcullis-scale-callgrind.{port}"));
        let mut command = Command::new("taskset");
        command.args(["-c", "0"]);
        if callgrind {
            command.args([
                "valgrind",
                "--tool=callgrind",
                "--dump-instr=no",
                &format!("--callgrind-out-file={}", out.display()),
            ]);
        }
        command
            .arg(redis_server())
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command
            .spawn()
            .map_err(|e| format!("starting redis-server (taskset, valgrind): {e}"))?;
        let redis = Self {
            child,
            port,
            callgrind_out: callgrind.then_some(out),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while redis.query(&["PING"]).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not answer within 60 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn query(&self, args: &[&str]) -> Result<String, String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let mut connection = client.get_connection().map_err(|e| e.to_string())?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let value: redis::Value = cmd.query(&mut connection).map_err(|e| e.to_string())?;
        Ok(match value {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            other => format!("{other:?}"),
        })
    }

    /// CPU seconds (user and system) the server has spent so far.
    fn cpu(&self) -> Result<f64, String> {
        portcullis_tests::cpu::cpu_seconds(self.child.id(), &process_name(&redis_server()))
    }

    /// Script and function calls served so far.
    fn calls(&self) -> u64 {
        let info = self.query(&["INFO", "commandstats"]).unwrap_or_default();
        info.lines()
            .filter(|line| {
                ["cmdstat_fcall:", "cmdstat_fcall_ro:", "cmdstat_evalsha:"]
                    .iter()
                    .any(|p| line.starts_with(p))
            })
            .filter_map(|line| {
                line.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Instructions since the last call (callgrind dumps, then the total
    /// of the newest dump's summary).
    fn instructions(&self) -> u64 {
        let Some(out) = &self.callgrind_out else {
            return 0;
        };
        let _ = Command::new("callgrind_control")
            .args(["-d", &self.child.id().to_string()])
            .output();
        let dir = out.parent().map(PathBuf::from).unwrap_or_default();
        let stem = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let newest = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
        newest
            .and_then(|e| std::fs::read_to_string(e.path()).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("summary: ").or(l.strip_prefix("totals: ")))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(out) = &self.callgrind_out {
            let _ = std::fs::remove_file(out);
        }
    }
}

/// Three app instances of one configuration, pinned to CPU 1.
struct Instances {
    children: Vec<Child>,
    ports: Vec<u16>,
}

impl Instances {
    fn start(
        store: &str,
        redis: Option<&Redis>,
        limit: (u64, u64),
        prefix: &str,
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut children = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..INSTANCES {
            let port = free_port();
            let mut command = Command::new("taskset");
            command
                .args(["-c", "1"])
                .arg(&exe)
                .args(["serve", "--port", &port.to_string(), "--store", store])
                .args([
                    "--limit",
                    &limit.0.to_string(),
                    "--burst",
                    &limit.1.to_string(),
                ])
                .args(["--prefix", prefix]);
            if let Some(redis) = redis {
                command.args(["--redis", &redis.url()]);
            }
            let mut child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("starting an instance: {e}"))?;
            let mut line = String::new();
            if let Some(out) = child.stdout.take() {
                let _ = BufReader::new(out).read_line(&mut line);
            }
            if line.trim() != "ready" {
                let _ = child.kill();
                return Err(format!("an instance ({store}) did not start"));
            }
            children.push(child);
            ports.push(port);
        }
        Ok(Self { children, ports })
    }
}

impl Instances {
    /// CPU seconds (user and system) the instances have spent so far, summed.
    fn cpu(&self) -> Result<f64, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let name = process_name(&exe.to_string_lossy());
        self.children
            .iter()
            .map(|child| portcullis_tests::cpu::cpu_seconds(child.id(), &name))
            .sum()
    }
}

/// The name Linux gives a process started from `path` (`/proc/<pid>/stat`'s
/// second field: the file name, at most 15 bytes).
fn process_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.chars()
        .scan(0, |bytes, c| {
            *bytes += c.len_utf8();
            (*bytes <= 15).then_some(c)
        })
        .collect()
}

impl Drop for Instances {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One load run's figures.
#[derive(Clone, Default)]
struct Run {
    requests: u64,
    ok: u64,
    limited: u64,
    other: u64,
    per_second: f64,
    secs: f64,
    /// CPU seconds Redis and the three instances spent during the run
    /// (0 when not measured).
    redis_cpu: f64,
    app_cpu: f64,
    p50: f64,
    p99: f64,
    buckets: Vec<u64>,
}

fn run_load(ports: &[u16], hot: bool, flag: &str, amount: &str) -> Result<Run, String> {
    run_load_on(ports, hot, flag, amount, CONNECTIONS)
}

fn run_load_on(
    ports: &[u16],
    hot: bool,
    flag: &str,
    amount: &str,
    connections: usize,
) -> Result<Run, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let ports = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let output = Command::new("taskset")
        .args(["-c", "1"])
        .arg(exe)
        .args(["load", "--ports", &ports])
        .args(["--subjects", if hot { "hot" } else { "many" }])
        .args([flag, amount])
        .args(["--connections", &connections.to_string()])
        .output()
        .map_err(|e| format!("the load generator: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let numbers: Vec<f64> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [requests, ok, limited, other, secs, p50, p99] = numbers[..] else {
        return Err(format!(
            "the load generator printed {text:?} ({})",
            String::from_utf8_lossy(&output.stderr)
        ));
    };
    Ok(Run {
        requests: requests as u64,
        ok: ok as u64,
        limited: limited as u64,
        other: other as u64,
        per_second: requests / secs,
        secs,
        p50,
        p99,
        buckets: lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect(),
        ..Run::default()
    })
}

/// A run, with the CPU seconds Redis and the instances spent in it.
fn measured_load(
    redis: &Redis,
    instances: &Instances,
    hot: bool,
    secs: f64,
    connections: usize,
) -> Result<Run, String> {
    let before = (redis.cpu()?, instances.cpu()?);
    let mut run = run_load_on(
        &instances.ports,
        hot,
        "--secs",
        &secs.to_string(),
        connections,
    )?;
    run.redis_cpu = redis.cpu()? - before.0;
    run.app_cpu = instances.cpu()? - before.1;
    Ok(run)
}

impl Run {
    /// Requests decided (admitted or limited) per CPU second of Redis, and
    /// of the three instances together; infinite under one clock tick.
    fn per_cpu_second(&self) -> (f64, f64) {
        let decided = (self.ok + self.limited) as f64;
        (decided / self.redis_cpu, decided / self.app_cpu)
    }

    /// `Redis 43% CPU, instances 97% CPU` over the run's wall time.
    fn busy(&self) -> String {
        format!(
            "Redis {:.0}% CPU, instances {:.0}% CPU",
            100.0 * self.redis_cpu / self.secs,
            100.0 * self.app_cpu / self.secs
        )
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

const CONFIGS: [&str; 4] = ["bare", "memory", "redis", "budget"];

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
                    "  round {} {:<7} {:<4} {:>8.0} req/s  ok {} limited {} other {}  {}",
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
            let (small, large) = (1_500_u64, 4_500_u64);
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
                "redis" => "0".to_owned(),
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
    println!("(bare: requests, no check, per instance CPU s)");
    println!();
    println!("| configuration | hot subject at {} per second, burst {} | admitted | worst window over the exact policy | stated bound |", LIMITED.0, LIMITED.1);
    println!("|---|---|---|---|---|");
    for (c, config) in CONFIGS.iter().enumerate().skip(1) {
        if let Some((worst, ok, rate)) = overshoot[c] {
            let stated = match *config {
                "budget" => bound.to_string(),
                "redis" => "0".to_owned(),
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
