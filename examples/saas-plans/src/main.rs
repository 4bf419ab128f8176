// Run with: cargo run -p saas-plans
//! Per-customer quotas from a database, changed while two instances run.
//!
//! Customers, their API keys and their plans live in a SQLite file this
//! example creates (`saas-plans.db` in the temporary directory): a plan is
//! `free` (the default policies: 5 per minute), `pro` (the `pro` tier: 50
//! per minute) or `custom` with a quota of the customer's own. Requests
//! carry the customer's API key (`x-api-key`). The rate-limit layer keys on
//! it with `ApiKey`, which hashes it: the store, the logs and
//! `RateLimitInfo::key` see `#<sha256>`, never the key. Its `PlanResolver`
//! is given the key itself (`.lookup_key(ApiKey::new())`), so it can find
//! the customer by the key the database holds; it caches the plan (30 s;
//! unknown keys 10 s, with the defaults) by the hash, and makes one lookup
//! for many concurrent requests of one key. (An override in a limits file
//! for such a customer is written as `"#<sha256 of the key>"`, from
//! `printf '%s' "$KEY" | sha256sum`: the file holds no secret.)
//!
//! Two instances serve on two ports of this process and share the
//! rate-limit state (process memory here; Redis when `REDIS_URL` is set,
//! as instances on several machines would). Changing a quota
//! (`POST /admin/quota/<customer>/<per-minute>` on either instance)
//! writes the database and tells every instance to drop that customer's
//! cached plan, by the hash of its key (a broadcast channel here; Redis
//! pub/sub or Postgres `LISTEN` between machines: no secret travels), so
//! the next requests on both follow it; the
//! cache's TTL bounds how long a lost notification can leave an instance
//! behind.
//!
//! At start the example shows it: acme, on a custom quota of 3 per minute,
//! is limited across both instances; its quota is raised to 100 through
//! instance A; the next requests on A and on B are admitted under the new
//! quota. Then both keep serving (ports 3001 and 3002, or `PORT` and
//! `PORT + 1`) until Ctrl-C. Try:
//!
//! ```text
//! curl -i -H 'x-api-key: k-acme-3f9a' http://127.0.0.1:3001/
//! curl -i -X POST http://127.0.0.1:3002/admin/quota/acme/10
//! curl -i -H 'x-api-key: k-acme-3f9a' http://127.0.0.1:3001/
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::StatusCode;
use portcullis::redis::store_from_env;
use portcullis::subject::hash_subject;
use portcullis::tower::{ApiKey, Plan, PlanResolver, RateLimitInfo, RateLimitLayer};
use portcullis::{BoxLeaseStore, LimitSet, Limits, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(run().await)
}

/// The customer table: each customer's API key and plan. (A real table
/// would hold a hash of each key, as a password table does; the lookup
/// then hashes the key it is given.)
fn create_database(path: &Path) -> rusqlite::Result<()> {
    let db = rusqlite::Connection::open(path)?;
    db.execute_batch(
        "DROP TABLE IF EXISTS customers;
         CREATE TABLE customers (id TEXT PRIMARY KEY, api_key TEXT UNIQUE NOT NULL, plan TEXT NOT NULL, per_minute INTEGER);
         INSERT INTO customers VALUES ('acme', 'k-acme-3f9a', 'custom', 3), ('globex', 'k-globex-77c1', 'pro', NULL), ('initech', 'k-initech-0b2e', 'free', NULL);",
    )
}

/// The plan of the customer whose API key is `api_key`, from the
/// database: the blocking query runs on Tokio's blocking pool.
async fn plan_of(
    db: PathBuf,
    api_key: String,
) -> Result<Option<Plan>, Box<dyn Error + Send + Sync>> {
    tokio::task::spawn_blocking(
        move || -> Result<Option<Plan>, Box<dyn Error + Send + Sync>> {
            let db = rusqlite::Connection::open(db)?;
            let row = db.query_row(
                "SELECT plan, per_minute FROM customers WHERE api_key = ?1",
                [&api_key],
                |row| Ok((row.get::<_, String>(0)?, row.get::<_, Option<u64>>(1)?)),
            );
            let (plan, per_minute) = match row {
                Ok(row) => row,
                Err(rusqlite::Error::QueryReturnedNoRows) => return Ok(None),
                Err(error) => return Err(error.into()),
            };
            Ok(Some(match (plan.as_str(), per_minute) {
                ("custom", Some(n)) => Plan::Policies(vec![
                    // A name per quota: a new quota starts a fresh count (the
                    // same name would carry the count over, clamped).
                    Policy::per_minute(n).name(format!("quota-{n}")).build()?,
                ]),
                ("free", _) => Plan::Default,
                (tier, _) => Plan::Tier(tier.to_owned()),
            }))
        },
    )
    .await?
}

/// One instance: its own resolver (and cache), the shared store and
/// limits, and the change feed.
fn instance(
    name: &'static str,
    store: BoxLeaseStore,
    limits: &Limits,
    db: PathBuf,
    changes: &broadcast::Sender<String>,
) -> Result<Router, Box<dyn Error>> {
    let plans = PlanResolver::builder(move |api_key| plan_of(db.clone(), api_key))
        // The lookup is given the API key itself; the cache keeps its hash.
        .lookup_key(ApiKey::new())
        .ttl(Duration::from_secs(30))
        .build();
    // Drop a customer's cached plan when it changes (the feed carries the
    // layer's key: the hash of the API key).
    let mut feed = changes.subscribe();
    let cache = plans.clone();
    tokio::spawn(async move {
        while let Ok(hashed_key) = feed.recv().await {
            cache.invalidate(&hashed_key);
        }
    });
    let limited = RateLimitLayer::builder(store)
        // The store and the logs see the key's SHA-256, never the key.
        .key(ApiKey::new())
        .limits(limits.clone())
        .resolve_plan(plans)
        .info_in_extensions(true)
        .build()?;
    Ok(Router::new()
        .route(
            "/",
            get(
                move |Extension(info): Extension<RateLimitInfo>| async move {
                    let decision = info.verdict().decisions().first().copied();
                    format!(
                        "instance {name}: {} on {} ({}), {} left\n",
                        info.key(),
                        info.tier(),
                        info.source(),
                        decision.map_or(0, |d| d.remaining())
                    )
                },
            ),
        )
        .layer(limited))
}

/// The admin side: changes a quota in the database, then tells every
/// instance.
#[derive(Clone)]
struct Admin {
    db: PathBuf,
    changes: broadcast::Sender<String>,
}

async fn set_quota(
    State(admin): State<Admin>,
    UrlPath((customer, per_minute)): UrlPath<(String, u64)>,
) -> (StatusCode, String) {
    let db = admin.db.clone();
    let id = customer.clone();
    let written = tokio::task::spawn_blocking(move || {
        rusqlite::Connection::open(db)?.query_row(
            "UPDATE customers SET plan = 'custom', per_minute = ?2 WHERE id = ?1 RETURNING api_key",
            rusqlite::params![id, per_minute],
            |row| row.get::<_, String>(0),
        )
    })
    .await;
    match written {
        Ok(Ok(api_key)) => {
            // Every instance drops the plan cached under the key's hash.
            let _ = admin.changes.send(hash_subject(api_key.as_bytes()));
            (
                StatusCode::OK,
                format!("{customer}: {per_minute} per minute\n"),
            )
        }
        Ok(Err(rusqlite::Error::QueryReturnedNoRows)) => {
            (StatusCode::NOT_FOUND, format!("no customer {customer}\n"))
        }
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")),
    }
}

async fn serve(port: u16, app: Router) -> Result<SocketAddr, Box<dyn Error>> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// One HTTP/1.1 request: the status, the `RateLimit-Policy` field and the
/// body.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    api_key: &str,
) -> Result<String, Box<dyn Error>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nx-api-key: {api_key}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response.lines().next().unwrap_or_default().to_owned();
    let policy = response
        .lines()
        .find_map(|l| l.strip_prefix("ratelimit-policy: "))
        .unwrap_or("-");
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .trim_end();
    Ok(format!("{status} [{policy}] {body}"))
}

async fn run() -> Result<(), Box<dyn Error>> {
    let db = std::env::temp_dir().join("saas-plans.db");
    create_database(&db)?;
    // Free: the defaults; pro: a tier. Both could come from a LimitsFile.
    let limits = Limits::new(
        LimitSet::builder()
            .policy(Policy::per_minute(5).name("free-minute").build()?)
            .tier("pro", [Policy::per_minute(50).name("pro-minute").build()?])
            .build()?,
    );
    let store = store_from_env("REDIS_URL").await?;
    let (changes, _) = broadcast::channel(64);
    let admin = Admin {
        db: db.clone(),
        changes: changes.clone(),
    };
    let admin_routes = Router::new()
        .route("/admin/quota/{customer}/{per_minute}", post(set_quota))
        .with_state(admin);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3001);
    let a = serve(
        port,
        instance("A", store.clone(), &limits, db.clone(), &changes)?.merge(admin_routes.clone()),
    )
    .await?;
    let b = serve(
        port + 1,
        instance("B", store, &limits, db.clone(), &changes)?.merge(admin_routes),
    )
    .await?;
    println!(
        "customers in {}; instances A on http://{a}/ and B on http://{b}/",
        db.display()
    );

    println!("\nacme has a custom quota of 3 per minute, shared by both instances:");
    for addr in [a, b, a, b] {
        println!("  {addr}  {}", send(addr, "GET", "/", "k-acme-3f9a").await?);
    }
    println!("\nraise acme's quota to 100 per minute through instance A:");
    println!(
        "  {a}  {}",
        send(a, "POST", "/admin/quota/acme/100", "").await?
    );
    println!("\nthe next requests on both instances follow it:");
    for addr in [a, b] {
        println!("  {addr}  {}", send(addr, "GET", "/", "k-acme-3f9a").await?);
    }
    println!("\nglobex (pro tier) and an unknown key (the defaults):");
    println!("  {a}  {}", send(a, "GET", "/", "k-globex-77c1").await?);
    println!("  {b}  {}", send(b, "GET", "/", "k-stranger").await?);

    println!("\nserving until Ctrl-C; try: curl -i -H 'x-api-key: k-acme-3f9a' http://{a}/");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
