//! A second OS process for the Redis concurrency tests: many tasks hammer
//! one key through a `RedisStore`, then the process prints what it got.
//!
//! ```text
//! hammer --url redis://127.0.0.1:6390 | --cluster redis://a,redis://b
//!        --prefix P --subject S --algorithm gcra --limit N --period-secs S
//!        --tasks T --attempts A [--timeout-ms MS]
//!        [--start-at-ms UNIX_MS | --start stdin]
//! ```
//!
//! Prints one line: `admitted=<n> denied=<n> errors=<n>` (and each error's
//! text on stderr). With `--start-at-ms`, the tasks start at that wall-clock
//! time (milliseconds since the epoch), so several processes race; with
//! `--start stdin`, the process prints `ready` (a line of its own, before
//! the counts) once its connections are open, and its tasks start when a
//! line arrives on stdin, so a parent starts several processes at once as
//! soon as all of them are ready. Exits 2 on bad arguments.

use std::process::ExitCode;
use std::time::Duration;

use portcullis_core::{Algorithm, Policy, Store};
use portcullis_redis::RedisStore;

fn algorithm(name: &str) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|a| a.as_str() == name)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match portcullis_tests::option_pairs("hammer", &args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(2);
        }
    };
    let get = |name: &str| options.get(name).cloned();
    let number = |name: &str| get(name).and_then(|v| v.parse::<u64>().ok());
    let (
        Some(prefix),
        Some(subject),
        Some(algorithm),
        Some(limit),
        Some(period),
        Some(tasks),
        Some(attempts),
    ) = (
        get("prefix"),
        get("subject"),
        get("algorithm").as_deref().and_then(algorithm),
        number("limit"),
        number("period-secs"),
        number("tasks"),
        number("attempts"),
    )
    else {
        eprintln!(
            "hammer: missing or invalid argument; see the doc comment of tests/src/bin/hammer.rs"
        );
        return ExitCode::from(2);
    };
    let timeout = Duration::from_millis(number("timeout-ms").unwrap_or(10_000));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("hammer: no Tokio runtime: {error}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        let builder = RedisStore::builder().prefix(prefix).timeout(timeout);
        let builder = match (get("url"), get("cluster")) {
            (Some(url), None) => builder.url(url),
            (None, Some(urls)) => builder.cluster(urls.split(',').map(str::to_owned)),
            _ => {
                eprintln!("hammer: give exactly one of --url and --cluster");
                return ExitCode::from(2);
            }
        };
        let store = match builder.build().await {
            Ok(store) => store,
            Err(error) => {
                eprintln!("hammer: {error}");
                return ExitCode::from(2);
            }
        };
        let policy = match Policy::per(limit, Duration::from_secs(period))
            .algorithm(algorithm)
            .name("hammered")
            .build()
        {
            Ok(policy) => policy,
            Err(error) => {
                eprintln!("hammer: {error}");
                return ExitCode::from(2);
            }
        };
        // Open the connections before the start signal.
        if let Err(error) = store.ping().await {
            eprintln!("hammer: {error}");
        }
        if get("start").as_deref() == Some("stdin") {
            println!("ready");
            let go = tokio::task::spawn_blocking(|| {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).map(|_| ())
            });
            if let Ok(Err(error)) | Err(error) = go.await.map_err(std::io::Error::other) {
                eprintln!("hammer: no start signal on stdin: {error}");
                return ExitCode::from(2);
            }
        } else if let Some(start_at) = number("start-at-ms") {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            let wait = u128::from(start_at).saturating_sub(now);
            tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))).await;
        }
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let store = store.clone();
                let policy = policy.clone();
                let subject = subject.clone();
                tokio::spawn(async move {
                    let (mut admitted, mut denied, mut errors) = (0_u64, 0_u64, 0_u64);
                    for _ in 0..attempts {
                        match store
                            .check(&subject, std::slice::from_ref(&policy), 1)
                            .await
                        {
                            Ok(verdict) if verdict.is_allowed() => admitted += 1,
                            Ok(_) => denied += 1,
                            Err(error) => {
                                eprintln!("hammer: {error}");
                                errors += 1;
                            }
                        }
                    }
                    (admitted, denied, errors)
                })
            })
            .collect();
        let (mut admitted, mut denied, mut errors) = (0, 0, 0);
        for handle in handles {
            match handle.await {
                Ok((a, d, e)) => {
                    admitted += a;
                    denied += d;
                    errors += e;
                }
                Err(error) => {
                    eprintln!("hammer: a task failed: {error}");
                    errors += attempts;
                }
            }
        }
        println!("admitted={admitted} denied={denied} errors={errors}");
        ExitCode::SUCCESS
    })
}
