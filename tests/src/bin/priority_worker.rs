//! A separate OS process for the priority-class tests
//! (`tests/tests/redis_paths/redis_options.rs`): floods one subject with checks of one
//! class through `RedisStore::check_with`, sharing one Redis with others.
//!
//! ```text
//! priority_worker --url U --prefix P --subject S --class C --requests N
//! ```
//!
//! The policy is the tests' `api` policy: 10 per hour, classes `critical`
//! (0 %), `interactive` (20 %) and `batch` (50 %). Prints
//! `admitted=<n> denied=<n> errors=<n>`; exits 2 on bad arguments.

use std::collections::HashMap;
use std::process::ExitCode;

use portcullis_core::{CheckOptions, Store};
use portcullis_redis::RedisStore;

fn main() -> ExitCode {
    let rest: Vec<String> = std::env::args().skip(1).collect();
    let mut options = HashMap::new();
    for pair in rest.chunks(2) {
        match pair {
            [key, value] if key.starts_with("--") => {
                options.insert(key.trim_start_matches("--").to_owned(), value.clone());
            }
            _ => {
                eprintln!("priority_worker: arguments come in `--name value` pairs, got {pair:?}");
                return ExitCode::from(2);
            }
        }
    }
    let get = |name: &str| options.get(name).cloned().unwrap_or_default();
    let Ok(requests) = get("requests").parse::<u64>() else {
        eprintln!("priority_worker: --requests must be a number");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("priority_worker: no Tokio runtime: {error}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        let store = match RedisStore::builder()
            .url(get("url"))
            .prefix(get("prefix"))
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .await
        {
            Ok(store) => store,
            Err(error) => {
                eprintln!("priority_worker: no store: {error}");
                return ExitCode::from(2);
            }
        };
        let policies = [portcullis_tests::priority_policy()];
        let class = CheckOptions::new().class(get("class"));
        let (mut admitted, mut denied, mut errors) = (0, 0, 0);
        for _ in 0..requests {
            match store
                .check_with(&get("subject"), &policies, 1, &class)
                .await
            {
                Ok(checked) if checked.verdict().is_allowed() => admitted += 1,
                Ok(_) => denied += 1,
                Err(error) => {
                    eprintln!("priority_worker: {error}");
                    errors += 1;
                }
            }
        }
        println!("admitted={admitted} denied={denied} errors={errors}");
        ExitCode::SUCCESS
    })
}
