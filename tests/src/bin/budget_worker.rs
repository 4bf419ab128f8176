//! One instance with a local budget, for the multi-process test of the
//! bound (`tests/tests/redis_scenarios/redis_budget.rs`): a `RedisStore` with
//! `LocalBudget` on a client clock that the test drives, so that several
//! processes check one subject at the same simulated instants.
//!
//! ```text
//! budget_worker --url redis://127.0.0.1:6390 --prefix P --subject S
//!               --limit N --period-ms MS --burst B
//!               --max-permits K --lease-ms MS
//! ```
//!
//! Reads lines `<now_us> <checks>` on stdin: sets the clock to `now_us`,
//! makes `checks` checks of cost 1 in turn and prints one line
//! `<admitted> <errors>`. A line `<now_us> <checks> <limit> <burst>`
//! checks with that limit and burst from then on (a plan changed under the
//! same name and period). Exits at the end of stdin; exits 2 on bad
//! arguments.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{ManualClock, Policy, Store};
use portcullis_redis::{ClockMode, LocalBudget, RedisStore};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match portcullis_tests::option_pairs("budget_worker", &args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(2);
        }
    };
    let text = |name: &str| options.get(name).cloned();
    let number = |name: &str| options.get(name).and_then(|v| v.parse::<u64>().ok());
    let (
        Some(url),
        Some(prefix),
        Some(subject),
        Some(limit),
        Some(period_ms),
        Some(burst),
        Some(max_permits),
        Some(lease_ms),
    ) = (
        text("url"),
        text("prefix"),
        text("subject"),
        number("limit"),
        number("period-ms"),
        number("burst"),
        number("max-permits"),
        number("lease-ms"),
    )
    else {
        eprintln!(
            "usage: budget_worker --url U --prefix P --subject S --limit N --period-ms MS \
             --burst B --max-permits K --lease-ms MS"
        );
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("budget_worker: no runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let plan = |limit: u64, burst: u64| {
            Policy::per(limit, Duration::from_millis(period_ms))
                .burst(burst)
                .name("budget")
                .build()
                .map(|policy| [policy])
        };
        let mut policy = match plan(limit, burst) {
            Ok(policy) => policy,
            Err(error) => {
                eprintln!("budget_worker: bad policy: {error}");
                return ExitCode::from(2);
            }
        };
        let clock = ManualClock::new(0);
        let store = RedisStore::builder()
            .url(url)
            .prefix(prefix)
            .timeout(Duration::from_secs(5))
            .clock(ClockMode::Client(Arc::new(clock.clone())))
            // The driver sets this clock to its own times.
            .client_clock_tolerance(Duration::MAX)
            .local_budget(
                LocalBudget::new()
                    .max_permits(max_permits)
                    .grant_period(Duration::from_millis(lease_ms)),
            )
            .build()
            .await;
        let store = match store {
            Ok(store) => store,
            Err(error) => {
                eprintln!("budget_worker: the store did not build: {error}");
                return ExitCode::FAILURE;
            }
        };
        let stdin = std::io::stdin();
        let mut stdout = std::io::stdout();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let mut words = line.split_whitespace().map(str::parse::<u64>);
            let (Some(Ok(now)), Some(Ok(checks))) = (words.next(), words.next()) else {
                eprintln!("budget_worker: expected `<now_us> <checks>`, got {line:?}");
                return ExitCode::from(2);
            };
            if let (Some(Ok(limit)), Some(Ok(burst))) = (words.next(), words.next()) {
                policy = match plan(limit, burst) {
                    Ok(policy) => policy,
                    Err(error) => {
                        eprintln!("budget_worker: bad policy: {error}");
                        return ExitCode::from(2);
                    }
                };
            }
            clock.set(now);
            let (mut admitted, mut errors) = (0_u64, 0_u64);
            for _ in 0..checks {
                match store.check(&subject, &policy, 1).await {
                    Ok(verdict) if verdict.is_allowed() => admitted += 1,
                    Ok(_) => {}
                    Err(error) => {
                        eprintln!("budget_worker: {error}");
                        errors += 1;
                    }
                }
            }
            if writeln!(stdout, "{admitted} {errors}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                break;
            }
        }
        ExitCode::SUCCESS
    })
}
