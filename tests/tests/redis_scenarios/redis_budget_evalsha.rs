//! The local budget (`LocalBudget`) on the `EVALSHA` path: a grant is one
//! call of a script of the library's `gcra_take` code. Three processes
//! logged in as a user without Redis Functions stay within the stated
//! bound and spend far fewer Redis calls than checks (redis_budget.rs's
//! steps, counted as `EVALSHA`s); the grant script answers as the grant
//! function does, state by state, and leaves the same state; a store
//! whose Functions are refused mid-life (its ACL changed) keeps its budget
//! on scripts; and at maxmemory the grant script's allow-oom twin serves a
//! held subject from shares while a new one is refused.
//!
//! The first runs on every server; the others compare with or start on
//! Redis Functions, or need allow-oom scripts, so xtask skips them by name
//! before Redis 7.

use crate::redis_budget::{three_processes_stay_within_the_bound, Path};
use crate::redis_common;

use std::io::BufRead as _;
use std::time::Duration;

use portcullis_core::{Policy, Store};
use portcullis_redis::{CallPath, LocalBudget, RedisStore};
use portcullis_tests::{unique_prefix, OwnedRedis};
use redis_common::{client, manual_clock};

#[test]
fn three_processes_on_the_evalsha_path_stay_within_the_stated_bound() {
    three_processes_stay_within_the_bound(Path::Evalsha);
}

/// The words of a `MONITOR` line's command (`<time> [<db> <client>]
/// "CMD" "arg" ...`), unquoted; commands here hold no quote or space.
fn monitored(line: &str) -> Vec<String> {
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// A store with a budget of 16 permits per 100 ms, on `clock`.
async fn budget_store(
    url: String,
    label: &str,
    clock: &portcullis_core::ManualClock,
) -> RedisStore {
    RedisStore::builder()
        .url(url)
        .prefix(unique_prefix(label))
        .timeout(redis_common::TEST_TIMEOUT)
        .clock(client(clock))
        .client_clock_tolerance(Duration::MAX)
        .local_budget(
            LocalBudget::new()
                .max_permits(16)
                .grant_period(Duration::from_millis(100)),
        )
        .build()
        .await
        .expect("the store should build")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_grant_script_answers_as_the_grant_function() {
    assert!(
        portcullis_tests::server_has_functions(),
        "this test compares with Redis Functions (Redis 7 or later); xtask skips it on older servers"
    );
    let server = OwnedRedis::start(&[]);
    let clock = manual_clock();
    let functions = budget_store(server.url(), "grant-fn", &clock).await;
    let scripts = budget_store(
        redis_common::without_functions(&server.url(), "no-fn-grant"),
        "grant-script",
        &clock,
    )
    .await;
    assert_eq!(functions.call_path(), CallPath::Functions);
    assert_eq!(scripts.call_path(), CallPath::Evalsha);

    // The grant commands each store sends, read from MONITOR: a busy
    // grant period, then the next one's first check asks for a share.
    let mut monitor = redis_common::monitor(&server.url());
    let policy = [Policy::per_second(1_000)
        .burst(50)
        .name("p")
        .build()
        .unwrap()];
    let argument = "1000:1000000:50";
    for store in [&functions, &scripts] {
        for _ in 0..10 {
            store.check("warm", &policy, 1).await.unwrap();
        }
    }
    clock.advance(Duration::from_millis(150));
    for store in [&functions, &scripts] {
        store.check("warm", &policy, 1).await.unwrap();
    }
    // `FCALL <library>_gcra_take 1 <key> <policy> <now> <cost> <most>
    // <horizon>`, and the same after `EVALSHA <sha>`.
    let take = format!("{}_gcra_take", functions.library_name());
    let (mut function, mut script) = (None, None);
    while function.is_none() || script.is_none() {
        let mut line = String::new();
        monitor.read_line(&mut line).unwrap_or_else(|error| {
            panic!(
                "MONITOR showed no grant call of each store (function {function:?}, script \
                 {script:?}): {error}"
            )
        });
        let words = monitored(&line);
        if words.len() == 9 && words[2] == "1" && words[4] == argument {
            match words[0].to_ascii_uppercase().as_str() {
                "FCALL" if words[1] == take => function = Some(words[1].clone()),
                "EVALSHA" => script = Some(words[1].clone()),
                _ => {}
            }
        }
    }
    let (function, script) = (function.unwrap(), script.unwrap());
    drop(monitor);

    // Every start state, and every argument form (within the burst, cut
    // by the horizon, by the most slots, too few to fit, and refused),
    // on a fresh pair of keys: the same reply and the same state.
    let mut raw = redis_common::raw(&server.url());
    let now: u64 = 1_900_000_000_000_000;
    let hex = |at: u64| format!("{at:x}");
    let tail = format!("@{argument}");
    let starts: Vec<(&str, Option<String>)> = vec![
        ("absent", None),
        ("behind", Some(format!("{}{tail}", hex(now - 5_000)))),
        (
            "within the burst",
            Some(format!("{}{tail}", hex(now + 10_000))),
        ),
        (
            "one slot left",
            Some(format!("{}{tail}", hex(now + 49_000))),
        ),
        (
            "at the capacity",
            Some(format!("{}{tail}", hex(now + 50_000))),
        ),
        (
            "past the capacity",
            Some(format!("{}{tail}", hex(now + 120_000))),
        ),
        (
            "at the tolerance",
            Some(format!("{}{tail}", hex(now + 1_050_000))),
        ),
        (
            "past the tolerance",
            Some(format!("{}{tail}", hex(now + 1_060_000))),
        ),
        ("an earlier version's", Some(hex(now + 20_000))),
        (
            "another policy's",
            Some(format!("{}@5:1000000:5", hex(now + 20_000))),
        ),
        ("a fraction", Some(format!("gcra:{}:1", now + 20_000))),
        ("foreign", Some("not a state".to_owned())),
        ("another type", Some(String::new())),
    ];
    let calls: [(&str, u64, u64, u64); 9] = [
        (argument, 1, 16, 100_000),
        (argument, 3, 64, 100_000),
        (argument, 1, 5, 0),
        (argument, 2, 500, 5_000_000),
        (argument, 40, 64, 10_000),
        (argument, 5, 3, 100_000),
        (argument, 60, 64, 100_000),
        ("3:1000000:3", 1, 16, 100_000),
        ("a:b:c", 1, 16, 100_000),
    ];
    let (kf, ks) = ("{grant-eq}:function", "{grant-eq}:script");
    let mut answers = std::collections::BTreeSet::new();
    for (label, start) in &starts {
        for (policy, cost, most, horizon) in calls {
            for key in [kf, ks] {
                let _: () = redis::cmd("DEL").arg(key).query(&mut raw).unwrap();
                match (start, *label) {
                    (_, "another type") => {
                        let _: i64 = redis::cmd("RPUSH")
                            .arg(key)
                            .arg("x")
                            .query(&mut raw)
                            .unwrap();
                    }
                    (Some(value), _) => {
                        let () = redis::cmd("SET")
                            .arg(key)
                            .arg(value)
                            .query(&mut raw)
                            .unwrap();
                    }
                    (None, _) => {}
                }
            }
            let call = |command: &str, name: &str, key: &str, raw: &mut redis::Connection| {
                redis::cmd(command)
                    .arg(name)
                    .arg(1)
                    .arg(key)
                    .arg(policy)
                    .arg(now)
                    .arg(cost)
                    .arg(most)
                    .arg(horizon)
                    .query::<redis::Value>(raw)
                    .map_err(|error| error.to_string())
            };
            let a = call("FCALL", &function, kf, &mut raw);
            let b = call("EVALSHA", &script, ks, &mut raw);
            let what = format!("{label}, {policy} cost {cost} most {most} horizon {horizon}");
            assert_eq!(a, b, "{what}");
            answers.insert(format!("{a:?}").chars().take(12).collect::<String>());
            let state = |key: &str, raw: &mut redis::Connection| -> (String, Option<String>, i64) {
                let kind: String = redis::cmd("TYPE").arg(key).query(raw).unwrap();
                let value = if kind == "string" {
                    redis::cmd("GET").arg(key).query(raw).unwrap()
                } else {
                    None
                };
                let expiry = redis_common::pexpiretime(raw, key).unwrap();
                (kind, value, expiry)
            };
            assert_eq!(state(kf, &mut raw), state(ks, &mut raw), "{what}");
        }
    }
    // Shares, GENERAL and refusals were all compared.
    assert!(answers.len() >= 3, "{answers:?}");
}

#[test]
fn a_store_refused_functions_mid_life_keeps_its_budget_on_scripts() {
    assert!(
        portcullis_tests::server_has_functions(),
        "this test starts on Redis Functions (Redis 7 or later); xtask skips it on older servers"
    );
    const STEPS: u64 = 100;
    const CHECKS: u64 = 5;
    let server = OwnedRedis::start(&[]);
    let mut raw = redis_common::raw(&server.url());
    // A user allowed everything, Functions included, for now.
    let user = "budget-mid-life";
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            user,
            "reset",
            "on",
            ">mid-life",
            "~*",
            "&*",
            "+@all",
        ])
        .query(&mut raw)
        .unwrap();
    let url = server
        .url()
        .replacen("redis://", &format!("redis://{user}:mid-life@"), 1);
    let clock = manual_clock();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(budget_store(url, "mid-life", &clock));
    // 500 checks a second against 1 000: every one admitted.
    let policy = [Policy::per_second(1_000)
        .burst(50)
        .name("p")
        .build()
        .unwrap()];
    let run = |raw: &mut redis::Connection| -> (u64, u64, u64) {
        let (fcalls, evalshas) = (redis_common::fcalls(raw), redis_common::evalshas(raw).0);
        let mut admitted = 0;
        for _ in 0..STEPS {
            for _ in 0..CHECKS {
                let verdict = runtime
                    .block_on(store.check("hot", &policy, 1))
                    .expect("a check");
                admitted += u64::from(verdict.is_allowed());
            }
            clock.advance(Duration::from_millis(10));
        }
        (
            admitted,
            redis_common::fcalls(raw) - fcalls,
            redis_common::evalshas(raw).0 - evalshas,
        )
    };
    let checks = STEPS * CHECKS;
    let (admitted, fcalls, _) = run(&mut raw);
    assert_eq!(admitted, checks);
    assert!(
        fcalls > 0 && fcalls * 4 < checks,
        "{fcalls} FCALLs for {checks} checks on Functions"
    );
    assert_eq!(store.call_path(), CallPath::Functions);

    // Functions taken away: the next grant's FCALL is refused, and it runs
    // as the grant script; so do the ones after it.
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", user, "-fcall", "-fcall_ro", "-function"])
        .query(&mut raw)
        .unwrap();
    let (admitted, _, evalshas) = run(&mut raw);
    assert_eq!(store.call_path(), CallPath::Evalsha);
    assert_eq!(
        admitted, checks,
        "a subject under its limit is always admitted"
    );
    assert!(
        evalshas > 0 && evalshas * 4 < checks,
        "{evalshas} EVALSHAs for {checks} checks after Functions were refused: the budget \
         should save most of them"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn at_maxmemory_the_grant_script_s_twin_serves_held_subjects() {
    assert!(
        portcullis_tests::server_has_functions(),
        "allow-oom scripts need Redis 7 or later; xtask skips this test on older servers"
    );
    const STEPS: u64 = 100;
    const CHECKS: u64 = 4;
    let server = OwnedRedis::start(&["--maxmemory-policy", "noeviction"]);
    let clock = manual_clock();
    let store = budget_store(
        redis_common::without_functions(&server.url(), "no-fn-grant-oom"),
        "grant-oom",
        &clock,
    )
    .await;
    assert_eq!(store.call_path(), CallPath::Evalsha);
    // 400 checks a second against 1 000: every one admitted.
    let policy = [Policy::per_second(1_000)
        .burst(50)
        .name("p")
        .build()
        .unwrap()];
    let run = |subject: &'static str| {
        let (store, clock, policy) = (&store, &clock, &policy);
        async move {
            let (mut admitted, mut refused) = (0, 0);
            for _ in 0..STEPS {
                for _ in 0..CHECKS {
                    match store.check(subject, policy, 1).await {
                        Ok(verdict) => admitted += u64::from(verdict.is_allowed()),
                        Err(portcullis_core::StoreError::OutOfMemory { .. }) => refused += 1,
                        Err(error) => panic!("{subject}: {error}"),
                    }
                }
                clock.advance(Duration::from_millis(10));
            }
            (admitted, refused)
        }
    };
    let checks = STEPS * CHECKS;
    assert_eq!(run("held").await, (checks, 0));
    let mut raw = redis_common::raw(&server.url());
    portcullis_tests::reliability::fill_past_maxmemory(&server.url()).await;
    // At maxmemory: the held subject's grants run as the grant script's
    // allow-oom twin (after Redis refused the script at its write), so it
    // is still served from shares; a new subject is refused.
    let (before, failed_before) = redis_common::evalshas(&mut raw);
    assert_eq!(
        run("held").await,
        (checks, 0),
        "the held subject, at maxmemory"
    );
    let (after, failed_after) = redis_common::evalshas(&mut raw);
    assert!(
        failed_after > failed_before,
        "Redis refused no grant script at maxmemory: the twin was not tried"
    );
    assert!(
        (after - before) * 2 < checks,
        "{} EVALSHAs for {checks} checks at maxmemory: the budget should save most of them",
        after - before
    );
    let (admitted, refused) = run("fresh").await;
    assert_eq!(
        (admitted, refused),
        (0, checks),
        "a new subject at maxmemory"
    );
    redis_common::lift_maxmemory(&server);
}
