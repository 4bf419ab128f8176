//! The `portcullis-envoy` server: Envoy's RLS v3 rate-limit service and its
//! RLQS quota service from a
//! TOML configuration file (reloaded live: polled, and on `SIGHUP`), on the
//! memory store or Redis, with gRPC health checking
//! (`grpc.health.v1.Health`) and graceful shutdown on `SIGTERM` or
//! ctrl-c.
//!
//! Run with: `portcullis-envoy --config envoy.toml --listen 127.0.0.1:8081
//! [--redis redis://127.0.0.1:6379]`; `portcullis-envoy convert
//! ratelimit/*.yaml > envoy.toml` converts envoyproxy/ratelimit's files.

// Never a panic on a caller's input or a server's reply: no `unwrap`,
// `expect`, `panic!` or `unreachable!` outside tests (clippy, which
// `cargo xtask test` runs with `-D warnings`).
#![cfg_attr(
    not(test),
    warn(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use portcullis_core::MemoryStore;
use portcullis_envoy::{convert_ratelimit_yaml, Config, ConfigFile, RlqsService, RlsService};
use tokio_stream::wrappers::TcpListenerStream;

/// Envoy's rate-limit services (RLS v3, RLQS) on portcullis's exact
/// algorithms.
#[derive(Debug, Parser)]
#[command(
    name = "portcullis-envoy",
    version,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Tool>,
    #[command(flatten)]
    serve: Args,
}

#[derive(Debug, clap::Subcommand)]
enum Tool {
    /// Print envoyproxy/ratelimit YAML files (one domain each) as this
    /// server's TOML configuration.
    Convert {
        /// The algorithm every limit gets: fixed_window (envoyproxy/ratelimit's
        /// behaviour), gcra, token_bucket, sliding_window, ...
        #[arg(long, default_value = "fixed_window")]
        algorithm: String,
        /// The YAML files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// Serving.
#[derive(Debug, clap::Args)]
struct Args {
    /// The TOML configuration: domains and their descriptors' limits.
    #[arg(long, env = "PORTCULLIS_ENVOY_CONFIG")]
    config: Option<PathBuf>,
    /// Where to serve gRPC (port 0 picks a free one; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Keep the state in Redis at this URL (`redis://`, `rediss://`,
    /// `redis+unix://`, as the Redis store takes); unset: in process memory.
    #[arg(long, env = "PORTCULLIS_ENVOY_REDIS_URL", conflicts_with_all = ["redis_cluster", "redis_sentinel"])]
    redis: Option<String>,
    /// Keep the state in a Redis Cluster: the URLs of some of its nodes,
    /// comma-separated. Requests whose limited descriptors name different
    /// subjects are refused (FAILED_PRECONDITION): one atomic step stays on
    /// one node.
    #[arg(long, value_delimiter = ',', conflicts_with = "redis_sentinel")]
    redis_cluster: Vec<String>,
    /// Keep the state in the Redis primary that Sentinels name by this
    /// master name (with --sentinel).
    #[arg(long, requires = "sentinel")]
    redis_sentinel: Option<String>,
    /// A Sentinel's URL (repeat, or comma-separate, for several).
    #[arg(long, value_delimiter = ',')]
    sentinel: Vec<String>,
    /// The Redis key prefix.
    #[arg(long, default_value = "portcullis")]
    prefix: String,
    /// Ask Envoy to add the IETF `RateLimit-Policy` and `RateLimit` fields
    /// to its responses.
    #[arg(long)]
    rate_limit_headers: bool,
    /// How often the configuration file is checked for changes, in
    /// milliseconds (0: only on SIGHUP).
    #[arg(long, default_value_t = 1000)]
    reload_ms: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(Tool::Convert { algorithm, files }) = cli.command {
        return convert(&algorithm, &files);
    }
    let args = cli.serve;
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            let mut cause = error.source();
            while let Some(inner) = cause {
                eprintln!("  caused by: {inner}");
                cause = inner.source();
            }
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `portcullis-envoy convert`: every file converted, checked together
/// (a domain in two files is refused), printed.
fn convert(algorithm: &str, files: &[PathBuf]) -> ExitCode {
    let mut out =
        String::from("# Converted from envoyproxy/ratelimit by `portcullis-envoy convert`.\n");
    for file in files {
        let converted = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))
            .and_then(|text| {
                convert_ratelimit_yaml(file, &text, algorithm).map_err(|e| e.to_string())
            });
        match converted {
            Ok(toml) => {
                out.push('\n');
                out.push_str(&toml);
            }
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Err(error) = Config::parse("(converted)", &out) {
        eprintln!("error: the files do not combine: {error}");
        return ExitCode::FAILURE;
    }
    print!("{out}");
    ExitCode::SUCCESS
}

async fn run(args: Args) -> Result<(), BoxError> {
    let config = args
        .config
        .clone()
        .ok_or("no configuration: pass --config <file.toml> (or set PORTCULLIS_ENVOY_CONFIG)")?;
    let file = Arc::new(ConfigFile::open(&config)?);
    let live = file.live();
    let redis =
        args.redis.is_some() || !args.redis_cluster.is_empty() || args.redis_sentinel.is_some();
    let (service, quotas) = match redis {
        true => redis_services(live, &args).await?,
        false => {
            tracing::info!("rate-limit state in process memory");
            let store = MemoryStore::new();
            (
                RlsService::builder(live.clone(), store.clone())
                    .rate_limit_headers(args.rate_limit_headers)
                    .build(),
                RlqsService::builder(live, store).build(),
            )
        }
    };
    let watcher = (args.reload_ms > 0).then(|| file.watch(Duration::from_millis(args.reload_ms)));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let local = listener.local_addr()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<RlsService>>()
        .await;
    reporter
        .set_serving::<RateLimitQuotaServiceServer<RlqsService>>()
        .await;
    tracing::info!(
        config = %config.display(),
        domains = ?file.live().load().domains(),
        "serving Envoy's rate-limit services (RLS v3, RLQS) on {local}"
    );
    // The line a supervisor (or a test) reads to learn the port.
    println!("listening on {local}");
    let shutdown = {
        let file = Arc::clone(&file);
        async move {
            wait_for_stop(&file).await;
            tracing::info!("shutting down: finishing requests in flight");
            reporter
                .set_not_serving::<RateLimitServiceServer<RlsService>>()
                .await;
            reporter
                .set_not_serving::<RateLimitQuotaServiceServer<RlqsService>>()
                .await;
        }
    };
    let served = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(service.into_server())
        .add_service(quotas.into_server())
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    served?;
    Ok(())
}

/// Both services on one Redis store.
#[cfg(feature = "redis")]
async fn redis_services(
    live: portcullis_envoy::LiveConfig,
    args: &Args,
) -> Result<(RlsService, RlqsService), BoxError> {
    let builder = portcullis_redis::RedisStore::builder().prefix(args.prefix.as_str());
    let (builder, what) = match (&args.redis, &args.redis_sentinel) {
        (Some(url), _) => (builder.url(url.as_str()), portcullis_redis::redact_url(url)),
        (None, Some(master)) => (
            builder.sentinel(master.as_str(), args.sentinel.iter().cloned()),
            format!(
                "the primary {master:?} of {} Sentinel(s)",
                args.sentinel.len()
            ),
        ),
        (None, None) => (
            builder.cluster(args.redis_cluster.iter().cloned()),
            format!("a Cluster ({} seed nodes)", args.redis_cluster.len()),
        ),
    };
    let store = builder.build().await?;
    tracing::info!("rate-limit state in Redis: {what}");
    Ok((
        RlsService::builder(live.clone(), store.clone())
            .rate_limit_headers(args.rate_limit_headers)
            .build(),
        RlqsService::builder(live, store).build(),
    ))
}

#[cfg(not(feature = "redis"))]
async fn redis_services(
    _live: portcullis_envoy::LiveConfig,
    _args: &Args,
) -> Result<(RlsService, RlqsService), BoxError> {
    Err("this build has no Redis store: build portcullis-envoy with feature `redis`".into())
}

/// Returns on ctrl-c or `SIGTERM`; reloads the configuration on `SIGHUP`.
async fn wait_for_stop(file: &ConfigFile) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return,
                _ = term.recv() => return,
                _ = hup.recv() => file.reload_and_log(),
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        let _ = tokio::signal::ctrl_c().await;
    }
}
