//! Exact coalescing (`RedisStoreBuilder::coalesce`, on by default): checks
//! of one subject that arrive while a call for it is in flight go as one
//! call, and decide exactly what the same checks sent one by one decide
//! (`MemoryStore`, sequentially, at the same instant); a check cancelled
//! while it waits is never charged; a call that fails store-wide fails the
//! checks that waited for it at once, unsent, and nothing is charged twice.
//! Checks of different subjects that find the store's calls all in flight
//! go together in one call (batches across subjects), and decide exactly
//! as one by one too; a check its function refuses fails alone.
//!
//! Redis Functions for the most part (the `EVALSHA` path coalesces one
//! subject's checks, and batches checks of different subjects, as scripts,
//! tested on servers of their own): xtask skips these by name on servers
//! before Redis 7. One test function runs the steps in turn, because two
//! of them read server-wide counters (`INFO commandstats`) and one pauses
//! the server.

mod across_runs;
mod coalesce_batches;
mod evalsha_across;
mod redis_common;

use std::time::Duration;

use futures::future::join_all;
use portcullis_core::{
    Algorithm, Clock, Decision, LeakyMode, ManualClock, MemoryStore, Policy, Store,
};
use portcullis_redis::{CallPath, ClockMode, RedisStore};
use portcullis_tests::unique_prefix;
use redis_common::{client, manual_clock};

/// How many checks go at once: one leads, the rest wait for one batch.
const CONCURRENT: usize = 64;

/// The costs of the checks, in the order they are made: varied, so that
/// the order decides which are admitted.
fn costs() -> Vec<u64> {
    (0..CONCURRENT as u64).map(|i| 1 + (i * 7) % 3).collect()
}

async fn store(prefix: &str, clock: ClockMode, coalesce: bool) -> RedisStore {
    RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .prefix(prefix)
        .timeout(redis_common::TEST_TIMEOUT)
        .clock(clock)
        .client_clock_tolerance(Duration::MAX)
        .coalesce(coalesce)
        .build()
        .await
        .expect("the store should build")
}

/// The decisions of `costs` made at once on `store` (each check joins in
/// the order of `costs`: `check` is called for all before any is polled).
async fn at_once(
    store: &RedisStore,
    subject: &str,
    policies: &[Policy],
    costs: &[u64],
) -> Vec<Vec<Decision>> {
    let checks: Vec<_> = costs
        .iter()
        .map(|&cost| store.check(subject, policies, cost))
        .collect();
    join_all(checks)
        .await
        .into_iter()
        .map(|verdict| {
            verdict
                .expect("the check should be decided")
                .decisions()
                .to_vec()
        })
        .collect()
}

/// The decisions of `costs` made one after another on a `MemoryStore` at
/// `clock`'s (frozen) time.
fn one_by_one(clock: &ManualClock, policies: &[Policy], costs: &[u64]) -> Vec<Vec<Decision>> {
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    costs
        .iter()
        .map(|&cost| {
            memory
                .check_now("s", policies, cost)
                .expect("the memory store answers at once")
                .expect("the check should be decided")
                .decisions()
                .to_vec()
        })
        .collect()
}

/// Policy sets that take each form of the coalesced call: the fast batch
/// of each one-policy fast path (GCRA with a whole interval, the token
/// bucket, both leaky buckets, both windows, the sliding log; the buckets
/// also with a burst above the limit, so costs above the limit), and the
/// general batch (a fractional GCRA interval, several policies).
fn policy_sets() -> Vec<(&'static str, Vec<Policy>)> {
    let per = |limit, secs, algorithm, name: &str| {
        Policy::per(limit, Duration::from_secs(secs))
            .algorithm(algorithm)
            .name(name)
            .build()
            .unwrap()
    };
    // 2 per second with a burst of 30: most costs are above the limit.
    let burst = |limit, algorithm| {
        Policy::per_second(limit)
            .burst(30)
            .algorithm(algorithm)
            .name("a")
            .build()
            .unwrap()
    };
    vec![
        (
            "gcra, whole interval",
            vec![per(40, 1, Algorithm::Gcra, "a")],
        ),
        (
            "gcra, fractional interval",
            vec![per(37, 7, Algorithm::Gcra, "a")],
        ),
        (
            "token bucket",
            vec![per(30, 60, Algorithm::TokenBucket, "a")],
        ),
        ("sliding log", vec![per(25, 60, Algorithm::SlidingLog, "a")]),
        (
            "fixed window",
            vec![per(40, 60, Algorithm::FixedWindow, "a")],
        ),
        (
            "sliding window",
            vec![per(40, 60, Algorithm::SlidingWindow, "a")],
        ),
        (
            "leaky queue",
            vec![per(20, 1, Algorithm::LeakyBucket(LeakyMode::Queue), "a")],
        ),
        (
            "leaky meter",
            vec![per(30, 60, Algorithm::LeakyBucket(LeakyMode::Meter), "a")],
        ),
        (
            "gcra, burst above the limit",
            vec![burst(2, Algorithm::Gcra)],
        ),
        (
            "token bucket, burst above the limit",
            vec![burst(2, Algorithm::TokenBucket)],
        ),
        (
            "leaky queue, burst above the limit",
            vec![burst(2, Algorithm::LeakyBucket(LeakyMode::Queue))],
        ),
        (
            "leaky meter, burst above the limit",
            vec![burst(2, Algorithm::LeakyBucket(LeakyMode::Meter))],
        ),
        (
            "gcra and sliding window",
            vec![
                per(50, 1, Algorithm::Gcra, "a"),
                per(35, 60, Algorithm::SlidingWindow, "b"),
            ],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_checks_decide_as_checks_sent_one_by_one() {
    assert!(
        portcullis_tests::server_has_functions(),
        "coalescing needs Redis Functions (Redis 7 or later); xtask skips this test on older servers"
    );
    let clock = manual_clock();
    let prefix = unique_prefix("coalesce");
    let redis = store(&prefix, client(&clock), true).await;
    let costs = costs();

    // Memory, one by one = Redis, all at once: every decision, in order.
    for (i, (what, policies)) in policy_sets().into_iter().enumerate() {
        let subject = format!("differential-{i}");
        let expected = one_by_one(&clock, &policies, &costs);
        let got = at_once(&redis, &subject, &policies, &costs).await;
        assert_eq!(
            got, expected,
            "{what}: coalesced decisions differ from sequential ones"
        );
        let admitted = got
            .iter()
            .filter(|d| d.iter().all(Decision::is_allowed))
            .count();
        assert!(
            admitted > 0 && admitted < CONCURRENT,
            "{what}: {admitted} admitted; the case should admit some and deny others"
        );
    }

    // One call leads, the other 63 go as one: two FCALLs for 64 checks
    // (none is in flight before, and all 64 join before the first answer
    // can arrive: they are made before any is polled).
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    let hot = [Policy::per_second(1_000).name("hot").build().unwrap()];
    let before = redis_common::fcalls(&mut raw);
    let decided = at_once(&redis, "hot", &hot, &vec![1; CONCURRENT]).await;
    let calls = redis_common::fcalls(&mut raw) - before;
    assert!(decided.iter().all(|d| d[0].is_allowed()));
    assert_eq!(
        calls, 2,
        "64 concurrent checks of one subject should take 2 calls"
    );
    // Without coalescing, one call per check.
    let separate = store(&prefix, client(&clock), false).await;
    let before = redis_common::fcalls(&mut raw);
    at_once(&separate, "hot-separate", &hot, &vec![1; CONCURRENT]).await;
    assert_eq!(redis_common::fcalls(&mut raw) - before, CONCURRENT as u64);

    // Every one-policy fast path's batch is one call too, and a state its
    // fast function hands to the general check makes it hand the batch to
    // the general one (a third call), deciding as one by one all the same.
    fast_batches_take_one_call(&redis, &clock, &mut raw).await;

    across_subjects(&clock, &mut raw).await;

    // A waiting check whose request is dropped before its batch goes is
    // not charged.
    let small = [Policy::per_minute(100).name("cancel").build().unwrap()];
    let mut checks: Vec<_> = (0..11)
        .map(|_| Some(redis.check("cancel", &small, 1)))
        .collect();
    for check in checks.iter_mut().skip(1).step_by(2) {
        // Checks 1, 3, 5, 7, 9: made (they joined the queue), then dropped.
        check.take();
    }
    let kept = join_all(checks.into_iter().flatten()).await;
    assert!(kept
        .iter()
        .all(|v| v.as_ref().is_ok_and(|v| v.is_allowed())));
    let left = redis.peek("cancel", &small).await.unwrap();
    assert_eq!(
        left.decisions()[0].remaining(),
        100 - 6,
        "6 checks ran (the leader and 5 kept); the 5 dropped ones were not charged"
    );

    // A call that meets a store-wide error fails the checks that waited
    // for it at once, unsent (never a second call that waits out the same
    // failure), and nothing is sent twice: the server pauses writes longer
    // than the store waits, so the leading call times out; when the pause
    // ends, that one call runs, once.
    let limit = 1_000;
    let paused = [Policy::per_hour(limit).name("paused").build().unwrap()];
    let quick = RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .prefix(&prefix)
        .timeout(Duration::from_millis(300))
        .clock(client(&clock))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .expect("the store should build");
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_500)
        .arg("WRITE")
        .query(&mut raw)
        .expect("CLIENT PAUSE");
    let failed = join_all((0..CONCURRENT).map(|_| quick.check("paused", &paused, 1))).await;
    let mut unsent = 0;
    for result in &failed {
        let error = result
            .as_ref()
            .expect_err("a check during the pause should fail");
        assert!(error.is_store_wide(), "{error:?}");
        if matches!(error, portcullis_core::StoreError::Unavailable { .. }) {
            unsent += 1;
        }
    }
    assert_eq!(
        unsent,
        CONCURRENT - 1,
        "all but the leading call fail unsent"
    );
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut raw)
        .expect("CLIENT UNPAUSE");
    // Whatever ran, ran once: at most the leading check's permit is gone.
    let left = redis.peek("paused", &paused).await.unwrap().decisions()[0].remaining();
    assert!(
        left >= limit - 1,
        "{} permits charged for {CONCURRENT} failed checks, of which one was sent",
        limit - left
    );
    // And the subject is decided again at once.
    assert!(redis.check("paused", &paused, 1).await.is_ok());

    // The batch functions themselves, against their fast functions.
    coalesce_batches::batches_agree_with_their_fast_functions(
        &mut raw,
        redis.library_name(),
        &unique_prefix("batches"),
        manual_clock().now_micros(),
    );
}

/// For one policy of each fast path but GCRA's: 64 checks at once from an
/// empty state take two calls (the first alone, then the others' batch);
/// from a state the fast function does not read as plain, three (the fast
/// batch answers GENERAL, then the general batch decides). Each decides
/// as a `MemoryStore` one by one, with the same steps before it.
async fn fast_batches_take_one_call(
    redis: &RedisStore,
    clock: &ManualClock,
    raw: &mut redis::Connection,
) {
    let costs = costs();
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket(LeakyMode::Meter),
        Algorithm::LeakyBucket(LeakyMode::Queue),
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];
    for algorithm in algorithms {
        let policies = [Policy::per_minute(40)
            .algorithm(algorithm)
            .name("f")
            .build()
            .unwrap()];
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let expect = |subject: &str, costs: &[u64]| -> Vec<Vec<Decision>> {
            costs
                .iter()
                .map(|&cost| {
                    memory
                        .check_now(subject, &policies, cost)
                        .expect("the memory store answers at once")
                        .expect("decided")
                        .decisions()
                        .to_vec()
                })
                .collect()
        };
        let subject = format!("fast-{algorithm}");
        let before = redis_common::fcalls(raw);
        let got = at_once(redis, &subject, &policies, &costs).await;
        let calls = redis_common::fcalls(raw) - before;
        assert_eq!(calls, 2, "{algorithm}: one batch");
        assert_eq!(got, expect(&subject, &costs), "{algorithm}: the fast batch");
        // Another subject, checked once (that call has ended and nothing
        // is in flight for it, while the batch above may still be: checks
        // of its subject made now could join it), then the clock back a
        // little, before the start of the minute the state was written
        // in: a state written after now, which the fast functions hand to
        // the general check (the queue's alone reads it as plain: a queue
        // free later than now).
        let later = format!("{subject}-later");
        let first = redis.check(&later, &policies, 1).await.expect("decided");
        assert_eq!(first.decisions(), expect(&later, &[1])[0]);
        let back = clock.now_micros() % 60_000_000 + 1;
        clock.set(clock.now_micros() - back);
        let before = redis_common::fcalls(raw);
        let got = at_once(redis, &later, &policies, &costs).await;
        let calls = redis_common::fcalls(raw) - before;
        assert_eq!(got, expect(&later, &costs), "{algorithm}: the clock back");
        let queue = algorithm == Algorithm::LeakyBucket(LeakyMode::Queue);
        assert_eq!(
            calls,
            if queue { 2 } else { 3 },
            "{algorithm}: GENERAL, then the general batch (the queue: its fast batch)"
        );
        clock.advance(Duration::from_secs(120));
    }
}

/// On the `EVALSHA` path (a user without Functions: Redis 6.2, a full
/// node, an ACL without `FCALL`), concurrent checks of one subject still
/// take one call after the lead: the batch script composed for their
/// policy set, deciding them as memory does one by one, for every policy
/// set of `policy_sets`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_evalsha_path_coalesced_checks_go_as_one_script_call() {
    let clock = manual_clock();
    // A server of its own: the call counts are the server's, and the other
    // test of this binary runs beside this one.
    let server = portcullis_tests::OwnedRedis::start(&[]);
    let url = redis_common::without_functions(&server.url(), "no-fn-coalesce");
    let redis = RedisStore::builder()
        .url(url)
        .prefix(unique_prefix("coalesce-evalsha"))
        .timeout(redis_common::TEST_TIMEOUT)
        .clock(client(&clock))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .expect("the store should build");
    let mut raw = redis_common::raw(&server.url());
    let costs = costs();
    for (i, (what, policies)) in policy_sets().into_iter().enumerate() {
        // A first burst on another subject loads the check and batch
        // scripts of this policy set (each first call meets NOSCRIPT).
        at_once(&redis, &format!("evalsha-warm-{i}"), &policies, &costs).await;
        assert_eq!(redis.call_path(), CallPath::Evalsha, "{what}");
        let expected = one_by_one(&clock, &policies, &costs);
        let (calls, failed) = redis_common::evalshas(&mut raw);
        let got = at_once(&redis, &format!("evalsha-{i}"), &policies, &costs).await;
        let (calls_after, failed_after) = redis_common::evalshas(&mut raw);
        assert_eq!(
            got, expected,
            "{what}: coalesced decisions on EVALSHA differ from sequential ones"
        );
        assert_eq!(
            (calls_after - calls, failed_after - failed),
            (2, 0),
            "{what}: {CONCURRENT} concurrent checks of one subject on EVALSHA should take \
             2 calls (the lead, then one batch), none failing"
        );
    }
}

/// Batches across subjects: rounds of one check per subject, each round
/// made at once (the store's first two checks take its calls, the rest
/// wait and go as one batch), with the policy sets of every form mixed
/// across subjects, in turn and then in runs of one to three checks of a
/// set, alternating; Redis decides exactly as a `MemoryStore` one by one,
/// in at most three calls a round; a check its function refuses fails
/// alone; a batch whose runs miscount is an error reply that decides
/// nothing; a waiting check dropped before its batch goes is not charged.
async fn across_subjects(clock: &ManualClock, raw: &mut redis::Connection) {
    const SUBJECTS: usize = 40;
    const ROUNDS: u64 = 6;
    let prefix = unique_prefix("across");
    let redis = store(&prefix, client(clock), true).await;
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    // Every command the server runs, to read the batches' runs below.
    let mut monitor = redis_common::monitor(&portcullis_tests::redis_url());
    let sets = policy_sets();
    // The first rounds take the sets in turn (runs of one check); the
    // others in runs of one to three, alternating (across_runs.rs), on
    // subjects of their own.
    let (index, subject) = across_runs::rounds(sets.len(), ROUNDS);
    let set_of = |round: u64, i: usize| &sets[index(round, i)].1;
    for round in 0..2 * ROUNDS {
        let cost = |i: usize| 1 + (i as u64 * 5 + round * 3) % 7;
        let before = redis_common::fcalls(raw);
        let checks: Vec<_> = redis_common::with_writes_held(raw, || {
            (0..SUBJECTS)
                .map(|i| redis.check(&subject(round, i), set_of(round, i), cost(i)))
                .collect()
        });
        let got = join_all(checks).await;
        let calls = redis_common::fcalls(raw) - before;
        // Two calls go at once, the rest wait and go as one batch. Fewer
        // go at once when the last round's calls have not all given their
        // places back: the batch's task, or a second task that a call's end
        // spawned to send the same waiting checks, which finds them taken
        // and frees its place only when it next runs (coalesce/lane.rs).
        assert!(
            (1..=3).contains(&calls),
            "round {round}: {SUBJECTS} checks of different subjects made at once took {calls} \
             calls, not at most the store's two calls and one batch"
        );
        for (i, verdict) in got.into_iter().enumerate() {
            let subject = subject(round, i);
            let expected = memory
                .check_now(&subject, set_of(round, i), cost(i))
                .expect("the memory store answers at once")
                .expect("decided");
            let verdict = verdict.unwrap_or_else(|e| panic!("round {round}, {subject}: {e}"));
            assert_eq!(
                verdict.decisions(),
                expected.decisions(),
                "round {round}, {subject} ({}): the batch decided otherwise than one by one",
                sets[index(round, i)].0
            );
        }
    }

    // Each batch went as runs: never two in a row of the same function
    // and counts, the rounds' three checks of one set in a row as one.
    across_runs::assert_sent_as_runs(&mut monitor, raw, "FCALL");
    drop(monitor);

    // A check its function refuses fails alone: the batch function, called
    // directly with a fast GCRA check between two good ones, the middle one
    // with a policy argument the function does not read.
    let library = redis.library_name().to_owned();
    let gcra = format!("{library}_gcra");
    let keys = [
        format!("{prefix}:{{m1}}:a"),
        format!("{prefix}:{{m2}}:a"),
        format!("{prefix}:{{m3}}:a"),
    ];
    let now = clock.now_micros().to_string();
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{library}_mixed")).arg(3).arg(&keys).arg(3);
    // One run of three checks (lua/batch_each.lua).
    cmd.arg(&gcra).arg(1).arg(2).arg(3);
    for argument in ["40:1000000:40:1", "not a policy", "40:1000000:40:1"] {
        cmd.arg(argument).arg(&now);
    }
    let replies: Vec<redis::Value> = cmd.query(raw).expect("the batch runs");
    assert_eq!(replies.len(), 3);
    assert!(
        matches!(replies[0], redis::Value::Int(_)) && matches!(replies[2], redis::Value::Int(_)),
        "the good checks are decided: {replies:?}"
    );
    assert!(
        matches!(&replies[1], redis::Value::SimpleString(status) if status.starts_with("FAILED ")),
        "the refused check is its own failure: {replies:?}"
    );

    // Checks sent without a time (Redis' clock, the default) are decided
    // at one instant, the batch's one `TIME`: three fast GCRA checks and a
    // `gcra_multi` check (whose time comes after its policies) of new
    // subjects under one policy each write the same state.
    let keys = [
        format!("{prefix}:{{t1}}:a"),
        format!("{prefix}:{{t2}}:a"),
        format!("{prefix}:{{t3}}:a"),
        format!("{prefix}:{{t4}}:a"),
    ];
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{library}_mixed")).arg(4).arg(&keys).arg(4);
    cmd.arg(&gcra).arg(1).arg(1).arg(3);
    for _ in 0..3 {
        cmd.arg("40:1000000:40:1");
    }
    cmd.arg(format!("{library}_gcra_multi"))
        .arg(1)
        .arg(2)
        .arg(1)
        .arg(1)
        .arg("40:1000000:40");
    let replies: Vec<redis::Value> = cmd.query(raw).expect("the batch runs");
    assert_eq!(replies.len(), 4, "{replies:?}");
    let times: Vec<u64> = keys
        .iter()
        .map(|key| {
            let state: String = redis::cmd("GET").arg(key).query(raw).expect("a state");
            let hex = state.split('@').next().unwrap_or_default();
            u64::from_str_radix(hex, 16)
                .unwrap_or_else(|e| panic!("{key}: state {state:?} is not hex µs: {e}"))
        })
        .collect();
    assert!(
        times.iter().all(|t| *t == times[0]),
        "checks of one batch were decided at different instants: {times:?}"
    );
    let redis_now: Vec<u64> = redis::cmd("TIME").query(raw).expect("TIME");
    let redis_now = redis_now[0] * 1_000_000 + redis_now[1];
    assert!(
        times[0] > redis_now - 60_000_000 && times[0] <= redis_now + 25_000,
        "the batch's instant {} is Redis' clock ({redis_now}) plus one interval",
        times[0]
    );
    let () = redis::cmd("DEL").arg(&keys).query(raw).expect("DEL");

    // A batch whose runs miscount is an error reply, having decided
    // nothing.
    let mixed = format!("{library}_mixed");
    let head = || {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&mixed);
        cmd
    };
    across_runs::malformed_batches(raw, head, &gcra, &["40:1000000:40:1", &now], &prefix);

    // Dropped before their batch goes: never charged.
    let minute = [Policy::per_minute(10).name("m").build().unwrap()];
    let mut checks: Vec<_> = (0..8)
        .map(|i| Some(redis.check(&format!("d{i}"), &minute, 1)))
        .collect();
    for check in checks.iter_mut().skip(3).step_by(2) {
        // d3, d5, d7: queued behind the two calls in flight, then dropped.
        check.take();
    }
    let kept = join_all(checks.into_iter().flatten()).await;
    assert!(kept
        .iter()
        .all(|v| v.as_ref().is_ok_and(|v| v.is_allowed())));
    for i in 0..8 {
        let left = redis
            .peek(&format!("d{i}"), &minute)
            .await
            .unwrap()
            .decisions()[0]
            .remaining();
        let dropped = i >= 3 && i % 2 == 1;
        assert_eq!(left, if dropped { 10 } else { 9 }, "d{i}");
    }
}
