//! A separate OS process for the concurrency-limit tests
//! (`tests/tests/redis_paths/concurrency_limit.rs`), sharing one Redis with others.
//!
//! ```text
//! lease_worker hold --url U --prefix P --subject S --max N --ttl-ms T
//! lease_worker load --url U --prefix P --subject S --max N --ttl-ms T
//!                   --tasks K --requests R --counter KEY
//! ```
//!
//! `--cluster U1,U2,...` instead of `--url U` runs on a Redis Cluster.
//!
//! `hold` acquires `N` leases of `S` (Redis clock) and prints
//! `held <latest expiry in µs>`, then waits to be killed.
//!
//! `load` runs `K` tasks sending `R` requests each through a
//! `ConcurrencyLimitLayer` (max `N` per subject `S`) over the store; the
//! handler counts itself in with `INCR KEY` (the reply is how many handlers
//! of every process are inside at once), yields a few milliseconds, and
//! counts itself out with `DECR KEY`. It prints
//! `admitted=<n> limited=<n> max_inside=<n> errors=<n>`. Exits 2 on bad
//! arguments.

use std::collections::HashMap;
use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use portcullis_core::{ConcurrencyPolicy, LeaseId, LeaseStore};
use portcullis_redis::RedisStore;
use portcullis_tower::{ConcurrencyLimitLayer, RequestHead};
use tower::{Layer, ServiceExt};

fn main() -> ExitCode {
    portcullis_tests::worker_main("lease_worker", |mode, options| async move {
        run(&mode, &options).await
    })
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the Redis is.
enum Target {
    Url(String),
    Cluster(Vec<String>),
}

/// A connection for the handlers' counter, on either kind of server.
#[derive(Clone)]
enum Counter {
    Standalone(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Counter {
    async fn open(target: &Target) -> Result<Self, BoxError> {
        Ok(match target {
            Target::Url(url) => Self::Standalone(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            Target::Cluster(urls) => Self::Cluster(
                redis::cluster::ClusterClient::new(urls.clone())?
                    .get_async_connection()
                    .await?,
            ),
        })
    }

    /// Creates the counter at 0 with a TTL unless another process did:
    /// every key a test leaves must expire (`redis_ttl` audits the
    /// servers while the suites run).
    async fn create(&mut self, key: &str) -> Result<(), redis::RedisError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(0).arg("NX").arg("EX").arg(600);
        match self {
            Self::Standalone(c) => cmd.query_async::<Option<String>>(c).await.map(drop),
            Self::Cluster(c) => cmd.query_async::<Option<String>>(c).await.map(drop),
        }
    }

    async fn add(&mut self, key: &str, by: i64) -> Result<i64, redis::RedisError> {
        let mut cmd = redis::cmd("INCRBY");
        cmd.arg(key).arg(by);
        match self {
            Self::Standalone(c) => cmd.query_async(c).await,
            Self::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

async fn run(mode: &str, options: &HashMap<String, String>) -> Result<(), BoxError> {
    let get = |name: &str| {
        options
            .get(name)
            .cloned()
            .ok_or_else(|| format!("missing --{name}"))
    };
    let number = |name: &str| -> Result<u64, BoxError> { Ok(get(name)?.parse::<u64>()?) };
    let target = match (get("url"), get("cluster")) {
        (Ok(url), Err(_)) => Target::Url(url),
        (Err(_), Ok(urls)) => Target::Cluster(urls.split(',').map(str::to_owned).collect()),
        _ => return Err("give exactly one of --url and --cluster".into()),
    };
    let subject = get("subject")?;
    let builder = match &target {
        Target::Url(url) => RedisStore::builder().url(url.clone()),
        Target::Cluster(urls) => RedisStore::builder().cluster(urls.clone()),
    };
    let store = builder
        .prefix(get("prefix")?)
        .timeout(Duration::from_secs(10))
        .build()
        .await?;
    let policy = ConcurrencyPolicy::max_in_flight(number("max")?)
        .lease_ttl(Duration::from_millis(number("ttl-ms")?))
        .name("workers")
        .build()?;
    match mode {
        "hold" => {
            let mut latest = 0;
            for _ in 0..policy.limit() {
                let decision = store
                    .acquire(&subject, &policy, LeaseId::generate())
                    .await?;
                let lease = decision.lease().ok_or("a lease was refused")?;
                latest = latest.max(lease.expires_at_micros());
            }
            println!("held {latest}");
            // Wait to be killed (SIGKILL): nothing is released.
            std::future::pending::<()>().await;
            Ok(())
        }
        "load" => load(store, policy, &target, &subject, options).await,
        other => Err(format!("unknown mode {other:?}: hold or load").into()),
    }
}

async fn load(
    store: RedisStore,
    policy: ConcurrencyPolicy,
    target: &Target,
    subject: &str,
    options: &HashMap<String, String>,
) -> Result<(), BoxError> {
    let number = |name: &str| -> Result<u64, BoxError> {
        Ok(options
            .get(name)
            .ok_or_else(|| format!("missing --{name}"))?
            .parse::<u64>()?)
    };
    let tasks = number("tasks")?;
    let requests = number("requests")?;
    let counter: Arc<str> = options
        .get("counter")
        .ok_or("missing --counter")?
        .as_str()
        .into();
    let mut redis = Counter::open(target).await?;
    redis.create(&counter).await?;
    let max_inside = Arc::new(AtomicI64::new(0));
    let subject = subject.to_owned();
    let layer = ConcurrencyLimitLayer::builder(store)
        .policy(policy)
        .key(move |_: &RequestHead<'_>| Some(subject.clone()))
        .on_store_failure(portcullis_tower::ConcurrencyFailure::FailClosed)
        .acquire_timeout(Duration::from_secs(10))
        .build()?;
    let handler = {
        let max_inside = Arc::clone(&max_inside);
        tower::service_fn(move |_: Request<Full<Bytes>>| {
            let mut redis = redis.clone();
            let counter = Arc::clone(&counter);
            let max_inside = Arc::clone(&max_inside);
            async move {
                let inside = redis.add(&counter, 1).await.unwrap_or(i64::MAX);
                max_inside.fetch_max(inside, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                let _ = redis.add(&counter, -1).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        })
    };
    let service = layer.layer(handler);
    let admitted = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let service = service.clone();
            let (admitted, limited, errors) = (
                Arc::clone(&admitted),
                Arc::clone(&limited),
                Arc::clone(&errors),
            );
            tokio::spawn(async move {
                for _ in 0..requests {
                    let request = Request::new(Full::new(Bytes::new()));
                    match service.clone().oneshot(request).await {
                        Ok(response) => {
                            let status = response.status();
                            // Read the body to its end: the permit is
                            // released there.
                            let _ = response.into_body().collect().await;
                            match status {
                                StatusCode::OK => admitted.fetch_add(1, Ordering::Relaxed),
                                StatusCode::TOO_MANY_REQUESTS => {
                                    limited.fetch_add(1, Ordering::Relaxed)
                                }
                                _ => errors.fetch_add(1, Ordering::Relaxed),
                            };
                        }
                        Err(never) => match never {},
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await?;
    }
    // Releases of the last permits run on spawned tasks: let them finish
    // before the process exits (otherwise they expire with their TTL).
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!(
        "admitted={} limited={} max_inside={} errors={}",
        admitted.load(Ordering::Relaxed),
        limited.load(Ordering::Relaxed),
        max_inside.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    Ok(())
}
