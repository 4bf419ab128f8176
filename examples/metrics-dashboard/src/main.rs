// Run with: cargo run -p metrics-dashboard
//! portcullis's metrics (feature `metrics`) exported for Prometheus: an
//! Axum app whose `GET /` is limited per API key (5 a second, bursts of
//! 10), whose `POST /exports` lets each key run 2 at once, and whose
//! `GET /metrics` answers the Prometheus text format, rendered by
//! `metrics-exporter-prometheus` from the recorder the app installs before
//! it builds its layers (so every metric has its `# HELP` line).
//! `GET /admin/top-denied` answers the API keys denied most (a
//! `TopDenied` table, as JSON), which `portcullis top URL...` merges over
//! instances.
//!
//! State lives in process memory, or in Redis when `REDIS_URL` is set. The
//! server listens on 127.0.0.1:3002, or on the port in `PORT`; an export
//! takes `EXPORT_SECS` seconds (default 2). Try:
//!
//! ```text
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: k1' http://127.0.0.1:3002/; done; echo
//! curl -s http://127.0.0.1:3002/metrics | grep portcullis_
//! portcullis top http://127.0.0.1:3002/admin/top-denied
//! ```
//!
//! Point a Prometheus at `/metrics` and import `dashboards/portcullis.json`
//! into Grafana: the README's "Metrics and dashboard" lists every metric.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use portcullis::redis::store_from_env;
use portcullis::tower::{ApiKey, ConcurrencyLimitLayer, RateLimitLayer, TopDenied};
use portcullis::{BoxLeaseStore, ConcurrencyPolicy, Policy};

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(start().await)
}

async fn start() -> Result<(), Box<dyn Error>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|e| format!("PORT={port:?} is not a port number: {e}"))?,
        Err(_) => 3002,
    };
    let export_secs: u64 = match std::env::var("EXPORT_SECS") {
        Ok(secs) => secs
            .parse()
            .map_err(|e| format!("EXPORT_SECS={secs:?} is not a number of seconds: {e}"))?,
        Err(_) => 2,
    };
    // The recorder first: the layers describe their metrics to the
    // recorder installed when they are built.
    let recorder = recorder()?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| format!("a metrics recorder is already installed: {e}"))?;
    let store = store_from_env("REDIS_URL").await?;
    let app = app(store, handle, Duration::from_secs(export_secs))?;

    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    println!("metrics-dashboard listening on http://{local}/ (metrics at http://{local}/metrics)");
    println!(
        "per API key (x-api-key header): GET / 5 a second in bursts of 10; POST /exports 2 at once"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The Prometheus recorder, its histograms as buckets (the dashboard's
/// quantiles are computed from them, across instances) rather than the
/// exporter's default per-process summaries.
fn recorder() -> Result<PrometheusRecorder, Box<dyn Error>> {
    const BUCKETS: &[f64] = &[
        0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0, 300.0,
    ];
    Ok(PrometheusBuilder::new()
        .set_buckets(BUCKETS)?
        .build_recorder())
}

/// The app: `/` rate limited, `/exports` concurrency limited, `/metrics`
/// and `/admin/top-denied` open (a scraper is not a client to limit). A
/// real deployment serves the admin routes on an internal port or behind
/// its own authentication: the table names who is refused.
fn app(
    store: BoxLeaseStore,
    metrics: PrometheusHandle,
    export: Duration,
) -> Result<Router, Box<dyn Error>> {
    // The 100 API keys denied most, by the space-saving count: its size
    // is fixed whatever keys clients send.
    let top_denied = TopDenied::new(100);
    let api = RateLimitLayer::builder(store.clone())
        .policy(Policy::per_second(5).burst(10).name("api").build()?)
        .key(ApiKey::new())
        .top_denied(top_denied.clone())
        .build()?;
    let exports = ConcurrencyLimitLayer::builder(store)
        .policy(
            ConcurrencyPolicy::max_in_flight(2)
                .name("exports")
                .build()?,
        )
        .key(ApiKey::new())
        .build()?;
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }).layer(api))
        .route(
            "/exports",
            post(move || async move {
                tokio::time::sleep(export).await;
                "export ready\n"
            })
            .layer(exports),
        )
        .route("/metrics", get(move || async move { metrics.render() }))
        .route(
            "/admin/top-denied",
            get(
                move || async move { ([(CONTENT_TYPE, "application/json")], top_denied.to_json()) },
            ),
        ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};

    use axum::body::{to_bytes, Body};
    use axum::http::{Request, StatusCode};
    use metrics::{KeyName, Metadata, Recorder, SharedString, Unit};
    use portcullis::MemoryStore;
    use tower::ServiceExt;

    use super::*;

    fn call(method: &str, uri: &str) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("x-api-key", "k1")
            .body(Body::empty())
            .unwrap()
    }

    /// `promtool`: `PORTCULLIS_PROMTOOL` (which `cargo xtask test` sets),
    /// else the one on PATH.
    fn promtool() -> String {
        std::env::var("PORTCULLIS_PROMTOOL").unwrap_or_else(|_| "promtool".to_owned())
    }

    #[tokio::test]
    async fn the_exported_metrics_pass_promtool_and_count_what_happened() {
        let recorder = recorder().unwrap();
        let handle = recorder.handle();
        // This test binary's only global recorder.
        metrics::set_global_recorder(recorder).unwrap();
        let store = BoxLeaseStore::new(MemoryStore::new());
        let app = app(store, handle, Duration::ZERO).unwrap();

        let mut statuses = Vec::new();
        for _ in 0..12 {
            statuses.push(
                app.clone()
                    .oneshot(call("GET", "/"))
                    .await
                    .unwrap()
                    .status(),
            );
        }
        let allowed = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        assert!(allowed >= 10, "{statuses:?}");
        for _ in 0..2 {
            let export = app.clone().oneshot(call("POST", "/exports")).await.unwrap();
            assert_eq!(export.status(), StatusCode::OK);
            // The permit is given back when the body is done.
            let _ = to_bytes(export.into_body(), 1 << 16).await.unwrap();
        }

        let response = app
            .clone()
            .oneshot(call("GET", "/admin/top-denied"))
            .await
            .unwrap();
        let top: serde_json::Value =
            serde_json::from_slice(&to_bytes(response.into_body(), 1 << 20).await.unwrap())
                .unwrap();
        assert_eq!(top["version"], 1);
        assert_eq!(top["denials"], 12 - allowed, "{top}");
        assert_eq!(top["entries"][0]["policy"], "api", "{top}");
        assert_eq!(top["entries"][0]["count"], 12 - allowed, "{top}");

        let response = app.clone().oneshot(call("GET", "/metrics")).await.unwrap();
        let text = String::from_utf8(
            to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap()
                .to_vec(),
        )
        .unwrap();
        for line in [
            format!("portcullis_requests_total{{policy=\"api\",result=\"allowed\"}} {allowed}"),
            format!(
                "portcullis_requests_total{{policy=\"api\",result=\"denied\"}} {}",
                12 - allowed
            ),
            "portcullis_concurrency_requests_total{policy=\"exports\",result=\"acquired\"} 2"
                .to_owned(),
            "portcullis_active_request_leases{policy=\"exports\"} 0".to_owned(),
            "portcullis_request_lease_duration_seconds_count{policy=\"exports\"} 2".to_owned(),
            "# HELP portcullis_requests_total".to_owned(),
        ] {
            assert!(text.contains(&line), "{line:?} missing from:\n{text}");
        }

        let mut check = Command::new(promtool())
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run promtool ({e}): install Debian's prometheus package \
                     (apt-get install prometheus), or set PORTCULLIS_PROMTOOL"
                )
            });
        check
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let output = check.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "promtool check metrics refused the export:\n{}{}\n{text}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The names `describe_metrics` registers.
    #[derive(Default)]
    struct Names(Arc<Mutex<BTreeSet<String>>>);

    impl Names {
        fn add(&self, name: &KeyName) {
            self.0.lock().unwrap().insert(name.as_str().to_owned());
        }
    }

    impl Recorder for Names {
        fn describe_counter(&self, name: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(&name);
        }
        fn describe_gauge(&self, name: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(&name);
        }
        fn describe_histogram(&self, name: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(&name);
        }
        fn register_counter(&self, _: &metrics::Key, _: &Metadata<'_>) -> metrics::Counter {
            metrics::Counter::noop()
        }
        fn register_gauge(&self, _: &metrics::Key, _: &Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(&self, _: &metrics::Key, _: &Metadata<'_>) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    /// Every `expr` of the dashboard's panels.
    fn exprs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                        _ => exprs(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn the_dashboard_parses_and_names_only_metrics_that_exist() {
        let names = Names::default();
        metrics::with_local_recorder(&names, portcullis::tower::describe_metrics);
        let described = names.0.lock().unwrap().clone();
        assert!(described.len() >= 14, "{described:?}");

        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../dashboards/portcullis.json"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut found = Vec::new();
        exprs(&dashboard, &mut found);
        assert!(found.len() >= 6, "{found:?}");
        let mut used = BTreeSet::new();
        for expr in &found {
            let mut rest = expr.as_str();
            while let Some(at) = rest.find("portcullis_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .unwrap_or(tail.len());
                let name = &tail[..end];
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| {
                        name.strip_suffix(suffix)
                            .filter(|base| described.contains(*base))
                    })
                    .unwrap_or(name);
                assert!(
                    described.contains(base),
                    "{expr:?} names {name}, which is not a portcullis metric"
                );
                used.insert(base.to_owned());
                rest = &tail[end..];
            }
        }
        for needed in [
            "portcullis_requests_total",
            "portcullis_store_duration_seconds",
            "portcullis_store_errors_total",
            "portcullis_active_request_leases",
        ] {
            assert!(used.contains(needed), "the dashboard shows no {needed}");
        }
    }
}
