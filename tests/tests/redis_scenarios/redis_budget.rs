//! The local budget (`LocalBudget`): three OS processes (the
//! `budget_worker` binary), each a store with a budget on a client clock
//! this test drives, check one hot subject at the same simulated instants.
//! In every interval of the run they are admitted no more than the exact
//! policy admits plus the bound `LocalBudget::overshoot_bound` states, one
//! of them killed mid-run while it holds a lease; leases save most Redis
//! calls; a flood far past the limit (rate shares) stays within the bound
//! on every interval and costs Redis no more calls than the grant period
//! allows (counted by the server); and a quiet subject decides exactly as
//! the memory store does.
//!
//! This test is the Redis Functions path's (xtask skips it by name on
//! servers before Redis 7); redis_budget_evalsha.rs runs the same steps on
//! the `EVALSHA` path, every server. One test function runs the steps in
//! turn, because one of them reads a server-wide counter.

use crate::budget_common;
use crate::redis_common;

use std::time::Duration;

use budget_common::{Setup, Worker};
use portcullis_core::{Clock, MemoryStore, Policy, Store};
use portcullis_redis::{CallPath, LocalBudget, RedisStore};
use portcullis_tests::{unique_prefix, OwnedRedis};
use redis_common::{client, manual_clock};

const WORKERS: usize = 3;
/// 250 per second, burst 25: a whole emission interval (4 ms), the fast
/// path the budget takes.
const LIMIT: u64 = 250;
const PERIOD_MS: u64 = 1_000;
const BURST: u64 = 25;
const MAX_PERMITS: u64 = 16;
const LEASE_MS: u64 = 50;
/// Simulated time per step, and checks per worker per step: 300 per
/// second per worker, 900 in all against 250 allowed.
const STEP_US: u64 = 10_000;
const CHECKS_PER_STEP: u64 = 3;
const STEPS: usize = 200;
/// The step after which the last worker is killed.
const KILL_AT: usize = 100;

/// The flood: 1 000 per second (a 1 ms interval), burst 50, shares of at
/// most 64 slots over 100 ms; each worker offers 10 checks every 2 ms
/// (15 000 per second in all), for two grant periods of warm-up (each
/// instance learns the demand) and then the measured stretch.
const FLOOD_LIMIT: u64 = 1_000;
const FLOOD_BURST: u64 = 50;
const FLOOD_PERMITS: u64 = 64;
const FLOOD_LEASE_MS: u64 = 100;
const FLOOD_STEP_US: u64 = 2_000;
const FLOOD_CHECKS: u64 = 10;
const FLOOD_WARM_STEPS: usize = 100;
const FLOOD_STEPS: usize = 600;

/// Every interval of steps `admitted` (one entry per step of `step_us`)
/// against the exact policy's envelope (`burst` plus one permit per
/// `interval_us` elapsed) plus `bound`; the worst excess.
fn within_bound(admitted: &[u64], step_us: u64, interval_us: u64, burst: u64, bound: u64) -> i64 {
    let mut worst = i64::MIN;
    for i in 0..admitted.len() {
        let mut sum = 0;
        for (j, step) in admitted.iter().enumerate().skip(i) {
            sum += step;
            let elapsed = (j - i) as u64 * step_us;
            let exact = burst + elapsed / interval_us;
            worst = worst.max(sum as i64 - exact as i64);
            assert!(
                sum <= exact + bound,
                "steps {i}..={j}: {sum} admitted, exact policy {exact}, bound {bound}"
            );
        }
    }
    worst
}

/// A worker on the hot policy's figures, with `limit` and `burst`, on the
/// server at `url`.
fn worker(url: &str, prefix: &str, subject: &str, limit: u64, burst: u64) -> Worker {
    Worker::start_on(
        url,
        &Setup {
            prefix: prefix.to_owned(),
            subject: subject.to_owned(),
            limit,
            period_ms: PERIOD_MS,
            burst,
            max_permits: MAX_PERMITS,
            lease_ms: LEASE_MS,
        },
    )
}

fn policy() -> Policy {
    Policy::per(LIMIT, Duration::from_millis(PERIOD_MS))
        .burst(BURST)
        .name("budget")
        .build()
        .unwrap()
}

#[test]
fn three_processes_with_leases_stay_within_the_stated_bound() {
    assert!(
        portcullis_tests::server_has_functions(),
        "this run is the Redis Functions path's (Redis 7 or later); xtask skips it on older servers"
    );
    three_processes_stay_within_the_bound(Path::Functions);
}

/// Which call path the workers and the store of
/// [`three_processes_stay_within_the_bound`] take, and so which calls the
/// server counts as theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Redis Functions: grants and checks are `FCALL`s.
    Functions,
    /// Logged in as a user without Redis Functions: grants and checks are
    /// `EVALSHA`s (redis_budget_evalsha.rs).
    Evalsha,
}

impl Path {
    /// The URL the workers and the store use on the server at `url`.
    pub(crate) fn url(self, url: &str) -> String {
        match self {
            Self::Functions => url.to_owned(),
            Self::Evalsha => redis_common::without_functions(url, "no-fn-budget"),
        }
    }

    /// The calls of this path the server at `raw` has run so far.
    fn calls(self, raw: &mut redis::Connection) -> u64 {
        match self {
            Self::Functions => redis_common::fcalls(raw),
            Self::Evalsha => redis_common::evalshas(raw).0,
        }
    }
}

/// The steps of the three-process test, in turn, on `path`: an
/// oversubscribed subject with a worker killed mid-run, a busy subject
/// under its limit, a flood far past the limit, and a quiet subject.
pub(crate) fn three_processes_stay_within_the_bound(path: Path) {
    let prefix = unique_prefix("budget");
    let policy = policy();
    let budget = LocalBudget::new()
        .max_permits(MAX_PERMITS)
        .grant_period(Duration::from_millis(LEASE_MS));
    let bound = budget.overshoot_bound(&policy, WORKERS as u64);
    // min(3 × 16, ⌈250 × 50 ms / 1 s⌉) = 13.
    assert_eq!(bound, 13);
    let interval_us = PERIOD_MS * 1_000 / LIMIT;

    // A server of its own: the calls are counted server-wide (INFO
    // commandstats), and the suites beside this one share the common one.
    let server = OwnedRedis::start(&[]);
    let mut raw = redis_common::raw(&server.url());
    let url = path.url(&server.url());
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|_| worker(&url, &prefix, "hot", LIMIT, BURST))
        .collect();
    let start = redis_common::manual_clock().now_micros();
    let mut admitted = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        if step == KILL_AT {
            // Killed while it holds a lease (it has been busy every step):
            // its permits are lost, never handed out twice.
            let mut worker = workers.pop().expect("a worker to kill");
            worker.child.kill().expect("the worker can be killed");
            worker.child.wait().expect("the killed worker is reaped");
        }
        let now = start + step as u64 * STEP_US;
        // Every worker gets the step before any answers: they race.
        for worker in &mut workers {
            worker.send(now, CHECKS_PER_STEP);
        }
        admitted.push(workers.iter_mut().map(Worker::admitted).sum::<u64>());
    }
    drop(workers);

    // Every interval [i, j] of steps: no more than the exact policy's
    // envelope (the burst plus one permit per emission interval elapsed)
    // plus the bound.
    let worst = within_bound(&admitted, STEP_US, interval_us, BURST, bound);
    // Over the whole run, every permit admitted was charged in Redis: no
    // more than the exact policy allows, at all.
    let total: u64 = admitted.iter().sum();
    let run_us = (STEPS as u64 - 1) * STEP_US;
    assert!(
        total <= BURST + run_us / interval_us,
        "{total} admitted over the run"
    );
    // The killed worker's lease did not starve the others.
    assert!(
        admitted[KILL_AT..].iter().sum::<u64>() > 0,
        "nothing admitted after the kill"
    );
    eprintln!(
        "{path:?}: oversubscribed: {total} admitted, worst interval {worst} over the exact policy (bound {bound})"
    );

    // A busy subject under its limit (900 checks/s against 2 000): every
    // check admitted, and leases save most Redis calls.
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|_| worker(&url, &prefix, "busy", 2_000, 100))
        .collect();
    let calls_before = path.calls(&mut raw);
    let (mut checks, mut admitted) = (0, 0);
    for step in 0..STEPS {
        let now = start + step as u64 * STEP_US;
        for worker in &mut workers {
            worker.send(now, CHECKS_PER_STEP);
        }
        admitted += workers.iter_mut().map(Worker::admitted).sum::<u64>();
        checks += WORKERS as u64 * CHECKS_PER_STEP;
    }
    let calls = path.calls(&mut raw) - calls_before;
    drop(workers);
    eprintln!(
        "{path:?}: under its limit: {checks} checks, {admitted} admitted, {calls} Redis calls ({:.3} per check)",
        calls as f64 / checks as f64
    );
    assert_eq!(
        admitted, checks,
        "a subject under its limit is always admitted"
    );
    assert!(
        calls * 4 < checks,
        "{calls} Redis calls for {checks} checks: leases should save most of them"
    );

    // A flood with rate shares: three instances, each offering 15 times
    // its third of the limit. Within the bound on every interval, and the
    // Redis calls counted by the server.
    let flood = Policy::per_second(FLOOD_LIMIT)
        .burst(FLOOD_BURST)
        .name("budget")
        .build()
        .unwrap();
    let flood_budget = LocalBudget::new()
        .max_permits(FLOOD_PERMITS)
        .grant_period(Duration::from_millis(FLOOD_LEASE_MS));
    let flood_bound = flood_budget.overshoot_bound(&flood, WORKERS as u64);
    // min(3 × 64, ⌈1 000 × 100 ms / 1 s⌉) = 100.
    assert_eq!(flood_bound, 100);
    let flood_interval_us = 1_000_000 / FLOOD_LIMIT;
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|_| {
            Worker::start_on(
                &url,
                &Setup {
                    prefix: prefix.clone(),
                    subject: "flood".to_owned(),
                    limit: FLOOD_LIMIT,
                    period_ms: 1_000,
                    burst: FLOOD_BURST,
                    max_permits: FLOOD_PERMITS,
                    lease_ms: FLOOD_LEASE_MS,
                },
            )
        })
        .collect();
    let flood_start = start + (STEPS as u64 + 10) * STEP_US;
    let mut admitted = Vec::with_capacity(FLOOD_STEPS);
    let mut calls_before = 0;
    for step in 0..FLOOD_STEPS {
        if step == FLOOD_WARM_STEPS {
            calls_before = path.calls(&mut raw);
        }
        let now = flood_start + step as u64 * FLOOD_STEP_US;
        for worker in &mut workers {
            worker.send(now, FLOOD_CHECKS);
        }
        admitted.push(workers.iter_mut().map(Worker::admitted).sum::<u64>());
    }
    let calls = path.calls(&mut raw) - calls_before;
    drop(workers);
    let worst = within_bound(
        &admitted,
        FLOOD_STEP_US,
        flood_interval_us,
        FLOOD_BURST,
        flood_bound,
    );
    let measured_us = (FLOOD_STEPS - FLOOD_WARM_STEPS) as u64 * FLOOD_STEP_US;
    let checks = (FLOOD_STEPS - FLOOD_WARM_STEPS) as u64 * WORKERS as u64 * FLOOD_CHECKS;
    // Once the subject is past its limit, an instance's next grant call
    // comes no sooner than min(max_permits × interval, grant period) after
    // the last (it spends its share, and a share cut by the horizon or
    // empty holds the denial for the grant period): per instance, at most
    // measured / that + 1 calls.
    let gap_us = (FLOOD_PERMITS * flood_interval_us).min(FLOOD_LEASE_MS * 1_000);
    let most_calls = WORKERS as u64 * (measured_us / gap_us + 1);
    let served: u64 = admitted[FLOOD_WARM_STEPS..].iter().sum();
    eprintln!(
        "{path:?}: flood: {checks} checks, {served} admitted, {calls} Redis calls ({:.4} per check, at most {most_calls}), worst interval {worst} over the exact policy (bound {flood_bound})",
        calls as f64 / checks as f64
    );
    assert!(
        calls <= most_calls,
        "{calls} Redis calls under the flood, more than {most_calls} (one per {gap_us} µs per instance)"
    );
    // The flood is served at the policy's rate, not starved: at least
    // half of what the exact policy admits over the stretch.
    assert!(
        served * 2 >= measured_us / flood_interval_us,
        "{served} admitted over {measured_us} µs"
    );

    // A quiet subject (one check per lease period) is never leased: every
    // decision is the exact one, as the memory store makes it.
    let clock = manual_clock();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime
        .block_on(
            RedisStore::builder()
                .url(url.as_str())
                .prefix(&prefix)
                .timeout(redis_common::TEST_TIMEOUT)
                .clock(client(&clock))
                .client_clock_tolerance(Duration::MAX)
                .local_budget(budget)
                .build(),
        )
        .expect("the store should build");
    let expected = match path {
        Path::Functions => CallPath::Functions,
        Path::Evalsha => CallPath::Evalsha,
    };
    assert_eq!(store.call_path(), expected);
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    // 4 per second: a whole emission interval, so the budget could take it.
    let quiet = [Policy::per_second(4)
        .burst(2)
        .name("quiet")
        .build()
        .unwrap()];
    for _ in 0..40 {
        clock.advance(Duration::from_millis(LEASE_MS + 20));
        let redis = runtime
            .block_on(store.check("quiet", &quiet, 1))
            .expect("a check");
        let memory = memory
            .check_now("quiet", &quiet, 1)
            .expect("at once")
            .expect("a check");
        assert_eq!(redis.decisions(), memory.decisions());
    }
}
