//! A separate OS process for the token reservation tests
//! (`tests/tests/tokens/processes.rs`), sharing one Redis with others, on
//! a client clock that stands still at `--now-us` (so nothing refills and
//! every count is exact). The budget: `--tokens` per hour, at most
//! `--max-in-flight` reservations open, an overage cap of `--max-overage`,
//! a TTL of 30 s.
//!
//! ```text
//! reservation_worker load --url U --prefix P --now-us T --tokens N
//!                         --max-in-flight F --max-overage M --seed S
//! reservation_worker hold --url U --prefix P --now-us T --tokens N
//!                         --max-in-flight F --max-overage M --seed S
//! ```
//!
//! `load` runs ten tasks of eight rounds each: reserve an estimate, yield,
//! settle a usage up to three times it; it prints `charged=<n>
//! overage=<n> admitted=<n>`. `hold` reserves `F` times, prints `held`,
//! and waits to be killed. Exits 2 on bad arguments or a store error.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{ManualClock, Policy, ReservationId, ReservationStore, TokenBudget};
use portcullis_redis::{ClockMode, RedisStore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    portcullis_tests::worker_main("reservation_worker", |mode, options| async move {
        run(&mode, &options).await
    })
}

fn number(options: &HashMap<String, String>, name: &str) -> Result<u64, BoxError> {
    let value = options
        .get(name)
        .ok_or_else(|| format!("--{name} is required"))?;
    Ok(value
        .parse()
        .map_err(|e| format!("--{name} {value:?}: {e}"))?)
}

async fn run(mode: &str, options: &HashMap<String, String>) -> Result<(), BoxError> {
    let url = options.get("url").ok_or("--url is required")?;
    let prefix = options.get("prefix").ok_or("--prefix is required")?;
    let clock = ManualClock::new(number(options, "now-us")?);
    let store = RedisStore::builder()
        .url(url.as_str())
        .prefix(prefix.as_str())
        .timeout(Duration::from_secs(5))
        .clock(ClockMode::Client(Arc::new(clock)))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await?;
    let budget = TokenBudget::tokens(
        Policy::per_hour(number(options, "tokens")?)
            .name("tokens")
            .build()?,
    )
    .max_in_flight(number(options, "max-in-flight")?)
    .max_overage(number(options, "max-overage")?)
    .reservation_ttl(Duration::from_secs(30))
    .build()?;
    let seed = number(options, "seed")?;
    match mode {
        "load" => load(store, budget, seed).await,
        "hold" => {
            for _ in 0..budget.max_in_flight().unwrap_or(1) {
                let reserved = store
                    .reserve("key-1", &budget, 100, ReservationId::generate())
                    .await?;
                if !reserved.is_admitted() {
                    return Err(format!("refused: {reserved:?}").into());
                }
            }
            println!("held");
            loop {
                tokio::time::sleep(Duration::from_secs(3_600)).await;
            }
        }
        other => Err(format!("unknown mode {other:?}: use load or hold").into()),
    }
}

async fn load(store: RedisStore, budget: TokenBudget, seed: u64) -> Result<(), BoxError> {
    let charged = Arc::new(AtomicU64::new(0));
    let overage = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..10_u64 {
        let (store, budget) = (store.clone(), budget.clone());
        let (charged, overage, admitted) = (
            Arc::clone(&charged),
            Arc::clone(&overage),
            Arc::clone(&admitted),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..8_u64 {
                let n = seed * 1_000 + task * 10 + round;
                let estimate = 10 + n * 7 % 50;
                let id = ReservationId::generate();
                let reserved = store.reserve("key-1", &budget, estimate, id).await?;
                if !reserved.is_admitted() {
                    continue;
                }
                admitted.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                let used = n * 13 % (3 * estimate + 1);
                let settled = store.settle("key-1", &budget, id, used).await?;
                charged.fetch_add(settled.charged(), Ordering::SeqCst);
                overage.fetch_add(settled.overage(), Ordering::SeqCst);
            }
            Ok::<(), portcullis_core::StoreError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    println!(
        "charged={} overage={} admitted={}",
        charged.load(Ordering::SeqCst),
        overage.load(Ordering::SeqCst),
        admitted.load(Ordering::SeqCst)
    );
    Ok(())
}
