// Run with: cargo run -p saas-plans
//! Per-customer quotas from a database, changed while two instances run.
//!
//! Customers and their plans live in a SQLite file this example creates
//! (`saas-plans.db` in the temporary directory): a plan is `free` (the
//! default policies: 5 per minute), `pro` (the `pro` tier: 50 per minute)
//! or `custom` with a quota of the customer's own. Each instance's
//! rate-limit layer asks a `PlanResolver` for the customer of each request
//! (the `x-customer` header); the resolver reads the plan from the
//! database, caches it (30 s; unknown customers 10 s, with the defaults),
//! and makes one lookup for many concurrent requests of one customer.
//!
//! Two instances serve on two ports of this process and share the
//! rate-limit state (process memory here; Redis when `REDIS_URL` is set,
//! as instances on several machines would). Changing a quota
//! (`POST /admin/quota/<customer>/<per-minute>` on either instance)
//! writes the database and tells every instance to drop that customer's
//! cached plan (a broadcast channel here; Redis pub/sub or Postgres
//! `LISTEN` between machines), so the next requests on both follow it; the
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
//! curl -i -H 'x-customer: acme' http://127.0.0.1:3001/
//! curl -i -X POST http://127.0.0.1:3002/admin/quota/acme/10
//! curl -i -H 'x-customer: acme' http://127.0.0.1:3001/
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{HeaderName, StatusCode};
use portcullis::redis::store_from_env;
use portcullis::tower::{Header, Plan, PlanResolver, RateLimitInfo, RateLimitLayer};
use portcullis::{BoxLeaseStore, LimitSet, Limits, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

#[tokio::main]
async fn main() -> ExitCode {
    example_support::init_tracing();
    example_support::report(run().await)
}

/// The customer table.
fn create_database(path: &Path) -> rusqlite::Result<()> {
    let db = rusqlite::Connection::open(path)?;
    db.execute_batch(
        "DROP TABLE IF EXISTS customers;
         CREATE TABLE customers (id TEXT PRIMARY KEY, plan TEXT NOT NULL, per_minute INTEGER);
         INSERT INTO customers VALUES ('acme', 'custom', 3), ('globex', 'pro', NULL), ('initech', 'free', NULL);",
    )
}

/// The plan of `customer`, from the database: the blocking query runs on
/// Tokio's blocking pool.
async fn plan_of(
    db: PathBuf,
    customer: String,
) -> Result<Option<Plan>, Box<dyn Error + Send + Sync>> {
    tokio::task::spawn_blocking(
        move || -> Result<Option<Plan>, Box<dyn Error + Send + Sync>> {
            let db = rusqlite::Connection::open(db)?;
            let row = db.query_row(
                "SELECT plan, per_minute FROM customers WHERE id = ?1",
                [&customer],
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
    let plans = PlanResolver::builder(move |customer| plan_of(db.clone(), customer))
        .ttl(Duration::from_secs(30))
        .build();
    // Drop a customer's cached plan when it changes.
    let mut feed = changes.subscribe();
    let cache = plans.clone();
    tokio::spawn(async move {
        while let Ok(customer) = feed.recv().await {
            cache.invalidate(&customer);
        }
    });
    let limited = RateLimitLayer::builder(store)
        .key(Header::new(HeaderName::from_static("x-customer")))
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
        rusqlite::Connection::open(db)?.execute(
            "INSERT INTO customers VALUES (?1, 'custom', ?2)
             ON CONFLICT(id) DO UPDATE SET plan = 'custom', per_minute = ?2",
            rusqlite::params![id, per_minute],
        )
    })
    .await;
    match written {
        Ok(Ok(_)) => {
            let _ = admin.changes.send(customer.clone());
            (
                StatusCode::OK,
                format!("{customer}: {per_minute} per minute\n"),
            )
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
    customer: &str,
) -> Result<String, Box<dyn Error>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nx-customer: {customer}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
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
        println!("  {addr}  {}", send(addr, "GET", "/", "acme").await?);
    }
    println!("\nraise acme's quota to 100 per minute through instance A:");
    println!(
        "  {a}  {}",
        send(a, "POST", "/admin/quota/acme/100", "").await?
    );
    println!("\nthe next requests on both instances follow it:");
    for addr in [a, b] {
        println!("  {addr}  {}", send(addr, "GET", "/", "acme").await?);
    }
    println!("\nglobex (pro tier) and an unknown customer (the defaults):");
    println!("  {a}  {}", send(a, "GET", "/", "globex").await?);
    println!("  {b}  {}", send(b, "GET", "/", "stranger").await?);

    println!("\nserving until Ctrl-C; try: curl -i -H 'x-customer: acme' http://{a}/");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
