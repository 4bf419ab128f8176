//! Instructions per request over a bare handler, counted by callgrind in
//! process: requests through an Axum `Router` with `oneshot`, the peer
//! address in the extensions (as `SocketAddr` and as `ConnectInfo`), a
//! generous policy so every request passes. Configurations: bare, portcullis
//! on `MemoryStore` with default headers, the same with headers only on
//! limited responses, both again with `keep_body()` (responses in Axum's
//! own `Body`, which Axum does not box again), a `BoxStore` around the
//! memory store, and tower_governor 0.8's `GovernorLayer` (`PeerIp`, its
//! defaults; and with `use_headers()`, which adds `x-ratelimit-limit` and
//! `x-ratelimit-remaining` to every admitted response).
//!
//! The `metrics` feature is off here, as users get the layer by default;
//! `PORTCULLIS_BENCH_CALLGRIND_ONLY=1 cargo bench -p portcullis-tower
//! --features metrics --bench http_throughput` counts the same
//! configurations with it on and no recorder installed, the cost of the
//! feature being the difference of the added figures of the two runs.
//!
//! The bench re-runs itself under `valgrind --tool=callgrind` once per
//! configuration (`PORTCULLIS_CALLGRIND_CHILD=<config>:<n>`); after 100
//! warm-up requests, only the function running the measured requests is
//! counted (`--toggle-collect`), so start-up and lazy initialisation are
//! excluded.

use std::net::SocketAddr;
use std::process::Command;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::Request;
use http_body_util::BodyExt;
use portcullis_core::{BoxStore, MemoryStore, Policy};
use portcullis_tower::{HeaderMode, RateLimitLayer};
use tower::ServiceExt;

const CHILD: &str = "PORTCULLIS_CALLGRIND_CHILD";
const CONFIGS: [&str; 10] = [
    "bare",
    "portcullis",
    // The same policy from a live `Limits` handle, and through a cached
    // `PlanResolver` (every request's plan is in its cache).
    "portcullis-limits",
    "portcullis-resolver",
    "portcullis-limited-only",
    "portcullis-keep-body",
    "portcullis-keep-body-limited-only",
    "portcullis-boxed",
    "governor",
    "governor-headers",
];

fn router(config: &str) -> Router {
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let policy = || {
        Policy::per_second(1_000_000)
            .name("bench")
            .build()
            .expect("valid policy")
    };
    fn portcullis<St: portcullis_core::Store>(
        store: St,
        policy: Policy,
        headers: HeaderMode,
    ) -> RateLimitLayer<St> {
        RateLimitLayer::builder(store)
            .policy(policy)
            .headers(headers)
            .build()
            .expect("valid layer")
    }
    let limits = || {
        portcullis_core::Limits::new(
            portcullis_core::LimitSet::builder()
                .policy(policy())
                .tier("bench", [policy()])
                .build()
                .expect("valid limits"),
        )
    };
    match config {
        "portcullis" => app.layer(portcullis(MemoryStore::new(), policy(), HeaderMode::All)),
        "portcullis-limits" => app.layer(
            RateLimitLayer::builder(MemoryStore::new())
                .limits(limits())
                .build()
                .expect("valid layer"),
        ),
        "portcullis-resolver" => {
            let plans = portcullis_tower::PlanResolver::builder(|_key: String| async {
                Ok::<_, std::convert::Infallible>(Some(portcullis_tower::Plan::Tier(
                    "bench".into(),
                )))
            })
            .ttl(std::time::Duration::from_secs(3_600))
            .build();
            app.layer(
                RateLimitLayer::builder(MemoryStore::new())
                    .limits(limits())
                    .resolve_plan(plans)
                    .build()
                    .expect("valid layer"),
            )
        }
        "portcullis-boxed" => app.layer(portcullis(
            BoxStore::new(MemoryStore::new()),
            policy(),
            HeaderMode::All,
        )),
        "portcullis-limited-only" => app.layer(portcullis(
            MemoryStore::new(),
            policy(),
            HeaderMode::LimitedOnly,
        )),
        "portcullis-keep-body" => {
            app.layer(portcullis(MemoryStore::new(), policy(), HeaderMode::All).keep_body())
        }
        "portcullis-keep-body-limited-only" => {
            app.layer(portcullis(MemoryStore::new(), policy(), HeaderMode::LimitedOnly).keep_body())
        }
        "governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000)
                .finish()
                .expect("valid governor config");
            app.layer(tower_governor::GovernorLayer::new(config))
        }
        "governor-headers" => {
            // `use_headers`: `x-ratelimit-limit` and `x-ratelimit-remaining`
            // on every admitted response, the same work as portcullis's two
            // default fields.
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000)
                .use_headers()
                .finish()
                .expect("valid governor config");
            app.layer(tower_governor::GovernorLayer::new(config))
        }
        _ => app,
    }
}

/// The child: `n` requests through `config`'s router.
pub(crate) fn child() -> bool {
    let Ok(spec) = std::env::var(CHILD) else {
        return false;
    };
    let (config, n) = spec.split_once(':').expect("<config>:<n>");
    let n: u32 = n.parse().expect("a request count");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let app = router(config);
    // Warm-up outside the counted function: lazy initialisation (clock
    // calibration, first allocations) varies with wall time under valgrind.
    runtime.block_on(requests(&app, config, 100));
    portcullis_callgrind_measured(&runtime, &app, config, n);
    true
}

/// The counted section (`--toggle-collect` names it).
#[inline(never)]
fn portcullis_callgrind_measured(
    runtime: &tokio::runtime::Runtime,
    app: &Router,
    config: &str,
    n: u32,
) {
    runtime.block_on(requests(app, config, n));
}

async fn requests(app: &Router, config: &str, n: u32) {
    let peer: SocketAddr = "192.0.2.1:4711".parse().expect("address");
    for _ in 0..n {
        let request = Request::get("/")
            .extension(peer)
            .extension(ConnectInfo(peer))
            .body(axum::body::Body::empty())
            .expect("request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        assert!(
            response.status().is_success(),
            "{config}: {}",
            response.status()
        );
        let body = response.into_body().collect().await.expect("body");
        std::hint::black_box(body);
    }
}

/// Total instructions of one child run, or why not.
fn instructions(config: &str, n: u32) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::env::temp_dir().join(format!(
        "portcullis-callgrind-{}-{config}-{n}.out",
        std::process::id()
    ));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg("--toggle-collect=*portcullis_callgrind_measured*")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .env(CHILD, format!("{config}:{n}"))
        .output()
        .map_err(|e| format!("cannot run valgrind (install it: apt-get install valgrind): {e}"))?;
    let _ = std::fs::remove_file(&out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("valgrind failed: {stderr}"));
    }
    stderr
        .lines()
        .find_map(|line| line.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("no 'Collected' line in valgrind's output: {stderr}"))
}

/// Prints the table: instructions per request, added over bare, and the
/// ratio of that to tower_governor's (without and with its headers).
pub(crate) fn report() {
    const REQUESTS: u32 = 2000;
    println!("instructions per request (callgrind, in process, Axum Router oneshot, PeerIp):");
    let mut rows = Vec::new();
    for config in CONFIGS {
        match instructions(config, REQUESTS) {
            Ok(total) => rows.push((config, total / u64::from(REQUESTS))),
            Err(e) => {
                println!("  skipped: {e}");
                return;
            }
        }
    }
    let bare = rows.first().map_or(0, |row| row.1);
    let added_by = |name: &str| {
        rows.iter()
            .find(|row| row.0 == name)
            .map(|row| row.1.saturating_sub(bare))
            .filter(|added| *added > 0)
    };
    let (governor, with_headers) = (added_by("governor"), added_by("governor-headers"));
    let ratio = |added: u64, to: Option<u64>| {
        to.map_or(String::from("-"), |to| {
            format!("{:.2}x", added as f64 / to as f64)
        })
    };
    println!(
        "  {:<32} {:>12} {:>12} {:>14} {:>22}",
        "configuration", "per request", "added", "vs governor", "vs governor+headers"
    );
    for &(config, per_request) in &rows {
        let added = per_request.saturating_sub(bare);
        println!(
            "  {config:<32} {per_request:>12} {added:>12} {:>14} {:>22}",
            ratio(added, governor),
            ratio(added, with_headers)
        );
    }
}
