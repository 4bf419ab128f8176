//! What a Redis check costs the instance that makes it: client
//! instructions per check of `RedisStore::check` (callgrind, the whole
//! client — the store, the `redis` crate's connection task, Tokio — on one
//! thread), for one check at a time and for 16 tasks checking at once,
//! and for 16 tasks on a store with a local budget, checked as the layer
//! checks (`Store::check_now`, then `Store::check` when it does not
//! answer): subjects seen about once each, as in `cargo xtask bench
//! scale`'s 100k-subject row, are never granted, so this is what the
//! budget adds to an exact check.
//! Issue 35's "× the bare app" is bounded by this cost: the instances of
//! `cargo xtask bench scale` spend their CPU on it beside the HTTP
//! serving.
//!
//! `cargo bench -p portcullis-redis --bench redis_client` (needs
//! `valgrind`; `PORTCULLIS_REDIS_SERVER` names the server, else
//! `redis-server` on the path). The bench starts a redis-server pinned to
//! core 0 and re-runs itself under `valgrind --tool=callgrind`
//! (`PORTCULLIS_BENCH_CHILD=<tasks>:<checks per task>[:budget]`), counting only the
//! function that runs the measured checks (`--toggle-collect`, its exact
//! name: a pattern that also matched the closures inside it would toggle
//! the count off again in every task): a current-thread runtime, so the
//! connection's own task and the runtime run inside it. Two counts per configuration (200 and 400 checks per
//! task after a warm-up); the figure is their difference over the
//! difference in checks, so set-up and the runtime's start are left out.
//! Subjects are random over about 100k (new keys, as `redis_throughput`'s
//! random workload), written before the measured section; the policy is
//! GCRA one million per second, so every check is admitted.
//!
//! One task's figure is deterministic (one call per check). Sixteen
//! tasks' figure depends on how the checks fall into batches across
//! subjects (how many find the store's calls in flight), which moves with
//! timing under valgrind by a few per cent between runs.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use portcullis::redis::{LocalBudget, RedisStore};
use portcullis::{Policy, Store};

#[path = "support/server.rs"]
mod server;
use server::Server;

const CHILD: &str = "PORTCULLIS_BENCH_CHILD";
const SMALL: u64 = 200;
const LARGE: u64 = 400;

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    let server = Server::start(false);
    println!("client instructions per check (callgrind, whole client on one thread):");
    for (tasks, budget) in [(1_u64, false), (16, false), (16, true)] {
        let small = instructions(&server, tasks, SMALL, budget);
        let large = instructions(&server, tasks, LARGE, budget);
        #[allow(clippy::cast_precision_loss)]
        let per_check = large.saturating_sub(small) as f64 / (tasks * (LARGE - SMALL)) as f64;
        let what = if budget { ", local budget" } else { "" };
        println!("  {tasks:>2} task(s) checking at once{what}: {per_check:>8.0}");
    }
}

/// Instructions of one child run of `tasks` tasks, `per` checks each, on
/// a store with a local budget when `budget`.
fn instructions(server: &Server, tasks: u64, per: u64, budget: bool) -> u64 {
    let exe = std::env::current_exe().expect("the bench's path");
    let out = std::env::temp_dir().join(format!(
        "portcullis-redis-client-{}-{tasks}-{per}-{budget}.out",
        std::process::id()
    ));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg("--toggle-collect=*::portcullis_callgrind_measured")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .env(
            CHILD,
            format!("{tasks}:{per}{}", if budget { ":budget" } else { "" }),
        )
        .env("PORTCULLIS_REDIS_URL", server.url())
        .output()
        .expect("valgrind runs (apt-get install valgrind)");
    let _ = std::fs::remove_file(&out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the child failed: {stderr}");
    stderr
        .lines()
        .find_map(|line| line.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no 'Collected' line in valgrind's output: {stderr}"))
}

/// The child: a warm-up round, then the measured one.
fn child(spec: &str) {
    let (spec, budget) = match spec.strip_suffix(":budget") {
        Some(spec) => (spec, true),
        None => (spec, false),
    };
    let (tasks, per) = spec
        .split_once(':')
        .and_then(|(t, p)| Some((t.parse::<u64>().ok()?, p.parse::<u64>().ok()?)))
        .expect("<tasks>:<checks per task>[:budget]");
    let url = std::env::var("PORTCULLIS_REDIS_URL").expect("the parent passes the URL");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let store = Arc::new(
        runtime
            .block_on(
                if budget {
                    // The scale bench's budget.
                    RedisStore::builder().url(url).local_budget(
                        LocalBudget::new()
                            .max_permits(64)
                            .grant_period(Duration::from_millis(100)),
                    )
                } else {
                    RedisStore::builder().url(url)
                }
                .build(),
            )
            .expect("the store connects"),
    );
    let policies: Arc<[Policy]> = Arc::from([Policy::per_second(1_000_000)
        .build()
        .expect("a valid policy")]);
    let warm = subjects(tasks, 20, 1);
    assert_eq!(
        portcullis_callgrind_measured(&runtime, &store, &policies, warm),
        tasks * 20
    );
    let measured = subjects(tasks, per, 2);
    let admitted = portcullis_callgrind_measured(&runtime, &store, &policies, measured);
    assert_eq!(admitted, tasks * per, "every check is admitted");
}

/// Each task's subjects: addresses, random over about 100k.
fn subjects(tasks: u64, per: u64, round: u64) -> Vec<Vec<String>> {
    (0..tasks)
        .map(|task| {
            let mut x = (task + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round;
            (0..per)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    format!("10.{}.{}.{}", (x >> 16) % 2, (x >> 8) % 256, x % 196)
                })
                .collect()
        })
        .collect()
}

/// The counted section (`--toggle-collect` names it): every task's checks,
/// on the current thread; the number admitted.
#[inline(never)]
fn portcullis_callgrind_measured(
    runtime: &tokio::runtime::Runtime,
    store: &Arc<RedisStore>,
    policies: &Arc<[Policy]>,
    subjects: Vec<Vec<String>>,
) -> u64 {
    runtime.block_on(async {
        let handles: Vec<_> = subjects
            .into_iter()
            .map(|subjects| {
                let store = Arc::clone(store);
                let policies = Arc::clone(policies);
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for subject in &subjects {
                        // As the layer asks: at once first (a store
                        // without a budget answers `None` at once).
                        let verdict = match store.check_now(subject, &policies, 1) {
                            Some(verdict) => verdict,
                            None => store.check(subject, &policies, 1).await,
                        }
                        .expect("the check is answered");
                        admitted += u64::from(verdict.is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for handle in handles {
            admitted += handle.await.expect("the task ends");
        }
        admitted
    })
}
