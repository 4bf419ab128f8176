//! The scale bench's child processes (`scale serve ...` and `scale load
//! ...`): one app instance, the quickstart's app on the store it is told,
//! and the load generator, which prints its counts, latencies and admitted
//! requests per 10 ms bucket for the bench to read.

use std::collections::HashMap;
use std::net::SocketAddr;
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

use super::{BUCKET_US, BUDGET_LEASE_MS, BUDGET_PERMITS, CONNECTIONS, HOT, SUBJECTS};

fn get<T: std::str::FromStr>(options: &HashMap<String, String>, name: &str) -> Result<T, String> {
    options
        .get(name)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("--{name} is missing or invalid"))
}

// ---------------------------------------------------------------- serve

/// One app instance: `serve --port P --store bare|memory|redis|budget
/// [--redis URL] --limit N --burst B`.
pub(crate) fn serve(options: &HashMap<String, String>) -> Result<(), String> {
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
            // `-evalsha`: the same, logged in as a user without Redis
            // Functions (procs.rs), so the store takes the `EVALSHA` path.
            "redis" | "budget" | "redis-evalsha" | "budget-evalsha" => {
                let url: String = get(options, "redis")?;
                // A Redis under callgrind (the bench's instruction counts)
                // runs some fifty times slower: its first calls (the
                // library loaded, the test check at `build()`) can take
                // longer than the default 250 ms.
                let mut builder = RedisStore::builder()
                    .url(url)
                    .prefix(get::<String>(options, "prefix")?)
                    .timeout(Duration::from_secs(2));
                if kind.starts_with("budget") {
                    builder = builder.local_budget(
                        LocalBudget::new()
                            .max_permits(BUDGET_PERMITS)
                            .grant_period(Duration::from_millis(BUDGET_LEASE_MS)),
                    );
                }
                Some(BoxStore::new(builder.build().await.map_err(|e| {
                    // The error and its causes, which say what to do.
                    let mut text = e.to_string();
                    let mut cause = std::error::Error::source(&e);
                    while let Some(c) = cause {
                        text.push_str(": ");
                        text.push_str(&c.to_string());
                        cause = c.source();
                    }
                    text
                })?))
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
pub(crate) fn load(options: &HashMap<String, String>) -> Result<(), String> {
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
