//! `cargo xtask test`'s own stages after the lint: the servers started,
//! `cargo test` over the workspace, and the Redis suites again on the
//! `EVALSHA` path; which tests a server older than Redis 7 skips.

use args::TestOptions;
use redis::Tools;

use crate::servers::Servers;
use crate::{args, envoy, lint, redis, run_cargo, Result, Stages, CLUSTER_MASTERS};

/// `cargo xtask test` / `ci`.
pub(crate) fn test(options: &TestOptions) -> Result<()> {
    let tools = Tools::discover()?;
    println!(
        "xtask: using {} ({})",
        tools.server.display(),
        tools.server_version()
    );
    if tools.promtool.is_none() {
        eprintln!(
            "xtask: WARNING: promtool not found on PATH: the metrics export test \
             (metrics-dashboard) will FAIL; install it with `apt-get install prometheus` \
             (Debian's package provides promtool)"
        );
    }
    let evalsha_stage = usize::from(options.cargo_args.is_empty());
    let mut stages = Stages::new(if options.lint { lint::STAGES } else { 0 } + 3 + evalsha_stage);
    let result = run_test_stages(options, &tools, &mut stages);
    stages.print_summary();
    result
}

/// The stages of `test`, in order; servers are stopped when this returns,
/// whether a stage failed or not (and on panic: they are dropped while
/// unwinding).
fn run_test_stages(options: &TestOptions, tools: &Tools, stages: &mut Stages) -> Result<()> {
    if options.lint {
        lint::run(stages)?;
    }
    let servers = stages.run(
        "start Redis (standalone, Cluster, TLS + ACL, TLS Cluster, Sentinel, TLS Sentinel)",
        || Servers::start(tools, CLUSTER_MASTERS, 0),
    )?;
    let mut env = servers.env();
    env.extend(tools.env());
    env.extend(envoy::env());
    for (name, value) in &env {
        println!("    {name}={value}");
    }
    let mut test_args = options.cargo_test_args();
    let skips = version_skips(&tools.server_version());
    add_skips(&mut test_args, &skips);
    let shown = format!("cargo {}", test_args.join(" "));
    let test_result = stages.run(&shown, || {
        let args: Vec<&str> = test_args.iter().map(String::as_str).collect();
        run_cargo(
            &args,
            &env,
            "tests failed (see above); rerun one crate quickly with \
             `cargo xtask test --no-lint -- -p <crate>`",
        )
    });
    // The full run also decides the Redis correctness suites on the EVALSHA
    // fallback (Redis Functions are the default path above).
    let evalsha_result = if options.cargo_args.is_empty() {
        let mut evalsha_env = env.clone();
        evalsha_env.push(("PORTCULLIS_REDIS_CALL_PATH", "evalsha".to_owned()));
        // `--workspace`, as the stage above: selecting the tests package
        // alone unifies the dependencies' features differently and rebuilds
        // Tokio, Axum and the tests (about a minute of CI's 2 cores); the
        // two binaries are the tests package's only.
        let mut args: Vec<String> = [
            "test",
            "--no-fail-fast",
            "--workspace",
            "--test",
            EVALSHA_BINARY,
            "--test",
            EVALSHA_TOKENS,
        ]
        .map(str::to_owned)
        .to_vec();
        add_skips(&mut args, &skips);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let title = format!(
            "cargo {} (EVALSHA path: {}, and the token reservations)",
            args.join(" "),
            EVALSHA_SUITES.join(", ")
        );
        stages.run(&title, || {
            run_cargo(
                &args,
                &evalsha_env,
                "the Redis suites failed on the EVALSHA path (see above); rerun with \
                 PORTCULLIS_REDIS_CALL_PATH=evalsha after `cargo xtask redis`",
            )
        })
    } else {
        Ok(())
    };
    stages.run("stop Redis", || {
        servers.stop();
        Ok(())
    })?;
    test_result.and(evalsha_result)
}

/// Tests that need what a server older than Redis 7 lacks (Redis Functions,
/// `allow-oom` scripts), each with the reason, for the server whose
/// `--version` line is `version`; empty for Redis 7, Valkey and anything
/// whose version is not read. Printed by name when skipped.
fn version_skips(version: &str) -> Vec<&'static str> {
    let major = version
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok());
    match major {
        Some(major) if major < 7 => {
            let skipped = FUNCTIONS_ONLY.to_vec();
            println!(
                "xtask: {version}: no Redis Functions and no allow-oom scripts before Redis 7; \
                 skipping {} tests that need them: {}",
                skipped.len(),
                skipped.join(", ")
            );
            skipped
        }
        _ => Vec::new(),
    }
}

/// The tests of Redis Functions and of `allow-oom` scripts (Redis 7): the
/// ones a Redis 6.2 run skips, by their full names (`<module>::<test>` for
/// a suite that is a module of a merged test binary such as
/// `tests/tests/redis_paths/`; `test_names_exist` holds each one real).
const FUNCTIONS_ONLY: [&str; 27] = [
    "functions_are_the_default_and_the_library_is_loaded",
    "an_acl_user_granted_the_documented_function_rules_runs_on_functions",
    "an_acl_without_functions_falls_back_to_evalsha",
    "function_flush_mid_run_is_survived",
    "function_flush_on_the_cluster_is_survived",
    "a_failover_to_a_node_without_the_library_is_survived",
    "out_of_memory_on_both_paths",
    "the_fast_gcra_function_agrees_with_the_general_check",
    "redis_full_start::a_store_builds_on_a_full_redis_and_loads_the_library_once_there_is_room",
    "redis_full_start::a_cluster_node_full_before_it_ever_loaded_the_library",
    "concurrency_limit::out_of_memory_keeps_held_subjects_and_refuses_new_ones",
    "stores::out_of_memory_settles_held_reservations_and_refuses_new_ones",
    "coalesced_checks_decide_as_checks_sent_one_by_one",
    "redis_coalesce_timeout::a_waiting_check_gets_its_batch_answer_or_is_not_charged",
    "redis_budget::three_processes_with_leases_stay_within_the_stated_bound",
    "redis_budget_evalsha::the_grant_script_answers_as_the_grant_function",
    "redis_budget_evalsha::a_store_refused_functions_mid_life_keeps_its_budget_on_scripts",
    "redis_budget_evalsha::at_maxmemory_the_grant_script_s_twin_serves_held_subjects",
    "the_fast_token_bucket_function_agrees_with_the_general_check",
    "the_fast_fixed_window_function_agrees_with_the_general_check",
    "the_fast_leaky_meter_function_agrees_with_the_general_check",
    "the_fast_sliding_window_function_agrees_with_the_general_check",
    "the_fast_leaky_queue_function_agrees_with_the_general_check",
    "the_fast_sliding_log_function_agrees_with_the_general_check",
    "redis_budget_reset::a_reset_is_obeyed_at_once_here_and_within_one_lease_period_by_another_process",
    "redis_budget_reset::a_plan_raised_a_hundredfold_under_the_same_name_is_obeyed_by_both_processes",
    "redis_budget_reset::a_daily_quota_leased_for_an_hour_takes_no_more_than_an_hour_of_it",
];

/// Appends `--skip <name>` for each of `skips` to a `cargo test` command
/// line (after its `--`, added if missing), matching names exactly.
fn add_skips(args: &mut Vec<String>, skips: &[&str]) {
    if skips.is_empty() {
        return;
    }
    if !args.iter().any(|arg| arg == "--") {
        args.push("--".to_owned());
    }
    for name in skips {
        args.extend(["--skip".to_owned(), (*name).to_owned()]);
    }
    args.push("--exact".to_owned());
}

/// The test binary of the Redis suites that `test` runs a second time on
/// the `EVALSHA` path (`PORTCULLIS_REDIS_CALL_PATH=evalsha`: their stores
/// log in as an ACL user without Redis Functions): `tests/tests/redis_paths/`,
/// whose modules are [`EVALSHA_SUITES`].
const EVALSHA_BINARY: &str = "redis_paths";

/// The token reservations' test binary (`tests/tests/tokens/`), also run
/// on the `EVALSHA` path: reservations take the library's function by
/// default and the script where Redis refuses Functions.
const EVALSHA_TOKENS: &str = "tokens";

/// The suites of [`EVALSHA_BINARY`], one module each
/// (`evalsha_suites_are_the_modules_of_their_binary` holds the two equal).
const EVALSHA_SUITES: [&str; 11] = [
    "charge_after_response",
    "redis_differential",
    "redis_compat",
    "redis_ttl",
    "redis_policy_change",
    "redis_magnitudes",
    "redis_bad_input",
    "redis_concurrency",
    "redis_restart",
    "concurrency_limit",
    "redis_options",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;
    use std::path::PathBuf;

    #[test]
    fn only_servers_before_redis_7_skip_tests_and_by_exact_name() {
        assert!(version_skips("Redis server v=7.0.15 sha=00000000:0").is_empty());
        assert!(version_skips("Valkey server v=8.0.1 sha=00000000:1").is_empty());
        assert!(version_skips("unknown version").is_empty());
        let skips = version_skips("Redis server v=6.2.16 sha=00000000:0");
        assert_eq!(skips.len(), FUNCTIONS_ONLY.len());
        let mut args = vec!["test".to_owned(), "--workspace".to_owned()];
        add_skips(&mut args, &skips[..1]);
        assert_eq!(
            args.join(" "),
            format!("test --workspace -- --skip {} --exact", FUNCTIONS_ONLY[0])
        );
        let mut args = vec!["test".to_owned(), "--".to_owned(), "--nocapture".to_owned()];
        add_skips(&mut args, &[]);
        assert_eq!(args.join(" "), "test -- --nocapture");
    }

    /// The suite modules `tests/tests/<binary>/main.rs` declares.
    fn modules_of(binary: &str) -> Vec<String> {
        let main = workspace_root()
            .join("tests/tests")
            .join(binary)
            .join("main.rs");
        let text = std::fs::read_to_string(&main).unwrap();
        let mut modules = Vec::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.starts_with("#[path") {
                lines.next(); // a shared helper module, not a suite
            } else if let Some(name) = line.strip_prefix("mod ") {
                modules.push(name.trim_end_matches(';').to_owned());
            }
        }
        modules
    }

    #[test]
    fn evalsha_suites_are_the_modules_of_their_binary() {
        let mut listed: Vec<String> = EVALSHA_SUITES.iter().map(|s| (*s).to_owned()).collect();
        listed.sort();
        let mut modules = modules_of(EVALSHA_BINARY);
        modules.sort();
        assert_eq!(listed, modules);
    }

    #[test]
    fn test_names_exist() {
        let tests = workspace_root().join("tests/tests");
        for name in FUNCTIONS_ONLY {
            let (module, function) = name.split_once("::").unwrap_or(("", name));
            let files: Vec<PathBuf> = if module.is_empty() {
                std::fs::read_dir(&tests)
                    .unwrap()
                    .map(|entry| entry.unwrap().path())
                    .filter(|path| path.extension().is_some_and(|e| e == "rs"))
                    .collect()
            } else {
                std::fs::read_dir(&tests)
                    .unwrap()
                    .map(|entry| entry.unwrap().path().join(format!("{module}.rs")))
                    .filter(|path| path.is_file())
                    .collect()
            };
            let defined = files.iter().any(|file| {
                std::fs::read_to_string(file)
                    .unwrap()
                    .contains(&format!("fn {function}("))
            });
            assert!(defined, "{name}: no such test in {}", tests.display());
        }
    }
}
