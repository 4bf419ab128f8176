//! Batches across subjects on the `EVALSHA` path (a module of
//! `redis_coalesce`, on a server of its own): checks of many subjects made
//! at once go as one call of the script of such batches
//! (mixed_script.lua), which decides them as the check scripts would alone.

use std::time::Duration;

use futures::future::join_all;
use portcullis_core::{Clock, MemoryStore, Store};
use portcullis_redis::{CallPath, RedisStore};
use portcullis_tests::unique_prefix;

use super::redis_common::{self, client, manual_clock};
use super::{across_runs, policy_sets};

/// On the `EVALSHA` path, batches across subjects go as one call of the
/// script of such batches: rounds of one check per subject made at once,
/// the policy sets of every form mixed across subjects (in turn, then in
/// runs of one to three checks of a set, alternating), take at most the
/// store's two calls and one batch each (not one call per check), and
/// Redis decides exactly as a `MemoryStore` one by one. Called directly,
/// the script answers a check whose check script fails alone with
/// `FAILED <error>` and decides the others, decides the checks sent
/// without a time at one instant, the batch's one `TIME`, and answers a
/// batch whose runs miscount with an error reply, deciding nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_evalsha_path_checks_of_many_subjects_go_as_one_script_call() {
    const SUBJECTS: usize = 40;
    const ROUNDS: u64 = 4;
    let clock = manual_clock();
    // A server of its own: the call counts are the server's, and the
    // slow log (every command, to find the batch script's SHA-1 below).
    let server = portcullis_tests::OwnedRedis::start(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "4096",
    ]);
    let url = redis_common::without_functions(&server.url(), "no-fn-across");
    let prefix = unique_prefix("across-evalsha");
    let redis = RedisStore::builder()
        .url(&url)
        .prefix(&prefix)
        .timeout(redis_common::TEST_TIMEOUT)
        .clock(client(&clock))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .expect("the store should build");
    let mut raw = redis_common::raw(&server.url());
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    // Every command the server runs, to read the batches' runs below.
    let mut monitor = redis_common::monitor(&server.url());
    let sets = policy_sets();
    // The first rounds take the sets in turn, the others in runs of one to
    // three, alternating (across_runs.rs), on subjects of their own.
    let (index, subject) = across_runs::rounds(sets.len(), ROUNDS);
    let set_of = |round: u64, i: usize| &sets[index(round, i)].1;
    for round in 0..2 * ROUNDS {
        let cost = |i: usize| 1 + (i as u64 * 5 + round * 3) % 7;
        let (calls, failed) = redis_common::evalshas(&mut raw);
        let checks: Vec<_> = redis_common::with_writes_held(&mut raw, || {
            (0..SUBJECTS)
                .map(|i| redis.check(&subject(round, i), set_of(round, i), cost(i)))
                .collect()
        });
        let got = join_all(checks).await;
        let (calls_after, failed_after) = redis_common::evalshas(&mut raw);
        assert_eq!(redis.call_path(), CallPath::Evalsha);
        // Calls that ran (a NOSCRIPT refusal, before a script is loaded,
        // did not): the two that go at once, and one batch (fewer go at
        // once when the last round's places are not all given back yet).
        let ran = (calls_after - calls) - (failed_after - failed);
        assert!(
            (1..=3).contains(&ran),
            "round {round}: {SUBJECTS} checks of different subjects made at once on EVALSHA ran \
             {ran} calls, not at most the store's two calls and one batch"
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

    // The client sent each batch as runs: never two in a row of the same
    // plan and counts, the rounds' three checks of one set in a row as one.
    across_runs::assert_sent_as_runs(&mut monitor, &mut raw, "EVALSHA");

    // The batch script's SHA-1: the EVALSHA of the slow log with the most
    // keys (a check script alone has one per policy).
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(4096)
        .query(&mut raw)
        .expect("SLOWLOG GET");
    let sha = entries
        .iter()
        .filter_map(|entry| {
            let redis::Value::Array(fields) = entry else {
                return None;
            };
            let Some(redis::Value::Array(args)) = fields.get(3) else {
                return None;
            };
            let text = |i: usize| match args.get(i) {
                Some(redis::Value::BulkString(bytes)) => String::from_utf8(bytes.clone()).ok(),
                _ => None,
            };
            let keys: u64 = text(2)?.parse().ok()?;
            text(0)?
                .eq_ignore_ascii_case("evalsha")
                .then_some((keys, text(1)?))
        })
        .max()
        .filter(|(keys, _)| *keys > 2)
        .map(|(_, sha)| sha)
        .expect("the slow log holds the batch's EVALSHA");

    // A check whose check script fails is answered alone: the middle one
    // of three has a policy argument check.lua does not read.
    let keys = [
        format!("{prefix}:{{m1}}:a"),
        format!("{prefix}:{{m2}}:a"),
        format!("{prefix}:{{m3}}:a"),
    ];
    let now = clock.now_micros().to_string();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&sha).arg(3).arg(&keys).arg(3);
    // One run of three checks (lua/batch_each.lua).
    cmd.arg("a").arg(1).arg(3).arg(3);
    for policy in ["40:1000000:40", "not a policy", "40:1000000:40"] {
        cmd.arg(&now).arg(1).arg(policy);
    }
    let replies: Vec<redis::Value> = cmd.query(&mut raw).expect("the batch runs");
    assert_eq!(replies.len(), 3, "{replies:?}");
    let decided = |reply: &redis::Value| matches!(reply, redis::Value::Array(items) if items.len() == 5 && items[0] == redis::Value::Int(1));
    assert!(
        decided(&replies[0]) && decided(&replies[2]),
        "the good checks are decided: {replies:?}"
    );
    assert!(
        matches!(&replies[1], redis::Value::SimpleString(status) if status.starts_with("FAILED ")),
        "the refused check is its own failure: {replies:?}"
    );

    // Checks sent without a time are decided at one instant, the batch's
    // one `TIME`: four new subjects (one with two GCRA policies) write the
    // same state.
    let keys = [
        format!("{prefix}:{{t1}}:a"),
        format!("{prefix}:{{t2}}:a"),
        format!("{prefix}:{{t3}}:a"),
        format!("{prefix}:{{t3}}:b"),
        format!("{prefix}:{{t4}}:a"),
    ];
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&sha).arg(keys.len()).arg(&keys).arg(4);
    // Runs of two, one and one checks.
    cmd.arg("a").arg(1).arg(3).arg(2);
    for _ in 0..2 {
        cmd.arg("").arg(1).arg("40:1000000:40");
    }
    cmd.arg("aa")
        .arg(2)
        .arg(4)
        .arg(1)
        .arg("")
        .arg(1)
        .arg("40:1000000:40")
        .arg("40:1000000:40");
    cmd.arg("a")
        .arg(1)
        .arg(3)
        .arg(1)
        .arg("")
        .arg(1)
        .arg("40:1000000:40");
    let replies: Vec<redis::Value> = cmd.query(&mut raw).expect("the batch runs");
    assert_eq!(replies.len(), 4, "{replies:?}");
    let states: Vec<String> = keys
        .iter()
        .map(|key| redis::cmd("GET").arg(key).query(&mut raw).expect("a state"))
        .collect();
    assert!(
        states.iter().all(|state| *state == states[0]),
        "checks of one batch were decided at different instants: {states:?}"
    );

    // A batch whose runs miscount is an error reply, having decided
    // nothing.
    let head = || {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&sha);
        cmd
    };
    across_runs::malformed_batches(&mut raw, head, "a", &[&now, "1", "40:1000000:40"], &prefix);
}
