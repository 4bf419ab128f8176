//! Measures how long checks take through the tower layer on a loaded box,
//! to choose default timeouts that do not fail open spuriously: the layer
//! over a `RedisStore` with generous timeouts (so nothing fails), many
//! concurrent requests on a two-worker runtime, optionally with busy-loop
//! threads competing for the CPUs.
//!
//! ```text
//! latency --url redis://127.0.0.1:6379 [--seconds 10] [--tasks 64] [--hogs 2]
//! ```
//!
//! Prints the latency percentiles and how many checks would have exceeded
//! 100 ms, 250 ms and 500 ms. Exits 2 on bad arguments.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis_core::Policy;
use portcullis_redis::RedisStore;
use portcullis_tower::{Global, RateLimitLayer};
use tower::{service_fn, Layer, ServiceExt};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match portcullis_tests::option_pairs("latency", &args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(2);
        }
    };
    let number = |name: &str, default: u64| -> Option<u64> {
        options.get(name).map_or(Some(default), |v| v.parse().ok())
    };
    let (Some(url), Some(seconds), Some(tasks), Some(hogs)) = (
        options.get("url").cloned(),
        number("seconds", 10),
        number("tasks", 64),
        number("hogs", 0),
    ) else {
        eprintln!("latency: --url is required; --seconds, --tasks and --hogs take numbers");
        return ExitCode::from(2);
    };
    let stop = Arc::new(AtomicBool::new(false));
    let hog_threads: Vec<_> = (0..hogs)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x: u64 = 1;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let latencies = runtime.block_on(measure(url, seconds, tasks));
    stop.store(true, Ordering::Relaxed);
    for hog in hog_threads {
        let _ = hog.join();
    }
    let Ok(mut latencies) = latencies else {
        eprintln!("latency: {}", latencies.unwrap_err());
        return ExitCode::FAILURE;
    };
    latencies.sort_unstable();
    let at = |q: f64| {
        let index = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies.get(index).copied().unwrap_or_default()
    };
    let over = |limit: Duration| latencies.iter().filter(|l| **l > limit).count();
    println!(
        "checks={} p50={:?} p99={:?} p99.9={:?} max={:?} over_100ms={} over_250ms={} over_500ms={}",
        latencies.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        latencies.last().copied().unwrap_or_default(),
        over(Duration::from_millis(100)),
        over(Duration::from_millis(250)),
        over(Duration::from_millis(500)),
    );
    ExitCode::SUCCESS
}

async fn measure(url: String, seconds: u64, tasks: u64) -> Result<Vec<Duration>, String> {
    let store = RedisStore::builder()
        .url(url)
        .prefix(format!("latency-{}", std::process::id()))
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .map_err(|e| e.to_string())?;
    store.ping().await.map_err(|e| e.to_string())?;
    let layer = RateLimitLayer::builder(store)
        .policy(
            Policy::per_second(1_000_000)
                .name("latency")
                .build()
                .map_err(|e| e.to_string())?,
        )
        .key(Global)
        .check_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let service = layer.layer(service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    }));
    let until = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < until {
                    let started = Instant::now();
                    let response = service
                        .clone()
                        .oneshot(http::Request::new(()))
                        .await
                        .expect("infallible");
                    latencies.push(started.elapsed());
                    assert!(response.headers().contains_key("ratelimit"), "decided");
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.map_err(|e| e.to_string())?);
    }
    Ok(all)
}
