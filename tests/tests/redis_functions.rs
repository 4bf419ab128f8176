//! Redis Functions (issue 10): the default call path, the `EVALSHA`
//! fallback for an ACL without functions, reloading after `FUNCTION FLUSH`
//! and after a Cluster failover, the allow-oom function on both paths, and
//! the lean state (one write per admitted check, none for a denial or a
//! peek; numbers passed to Redis exactly).

mod redis_common;

use std::time::Duration;

use futures::future::join_all;
use portcullis_core::{Algorithm, Policy, Store, StoreError};
use portcullis_redis::{CallPath, ClockMode, RedisStore};
use portcullis_tests::reliability::{crc16_slot, master_with_replica, OwnedCluster};
use portcullis_tests::{unique_prefix, OwnedRedis};

async fn store(url: String) -> RedisStore {
    RedisStore::builder()
        .url(url)
        .prefix(unique_prefix("functions"))
        .timeout(redis_common::TEST_TIMEOUT)
        .build()
        .await
        .unwrap()
}

/// Deletes an ACL user when dropped, even when the test fails.
struct AclUser {
    url: String,
    name: String,
}

impl Drop for AclUser {
    fn drop(&mut self) {
        let mut raw = redis_common::raw(&self.url);
        let _: redis::RedisResult<i64> = redis::cmd("ACL")
            .arg("DELUSER")
            .arg(&self.name)
            .query(&mut raw);
    }
}

fn libraries(url: &str) -> String {
    let mut raw = redis_common::raw(url);
    let value: redis::Value = redis::cmd("FUNCTION").arg("LIST").query(&mut raw).unwrap();
    format!("{value:?}")
}

/// Checks `subject` once on every algorithm and asserts the count goes on.
async fn check_counts(store: &RedisStore, subject: &str, policies: &[Policy], nth: u64) {
    let verdict = store
        .check(subject, policies, 1)
        .await
        .unwrap_or_else(|e| panic!("check {nth} of {subject}: {e}"));
    assert!(verdict.is_allowed(), "check {nth} of {subject}");
    for decision in verdict.decisions() {
        assert_eq!(
            decision.remaining(),
            1_000 - nth,
            "check {nth} of {subject}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn functions_are_the_default_and_the_library_is_loaded() {
    let server = OwnedRedis::start(&[]);
    let store = store(server.url()).await;
    assert_eq!(store.call_path(), CallPath::Functions);
    // build() ran its permission probe as a script; count from here on.
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut redis_common::raw(&server.url()))
        .unwrap();
    let policies = redis_common::every_algorithm();
    for nth in 1..=3 {
        check_counts(&store, "a", &policies, nth).await;
    }
    // A peek (FCALL_RO on the no-writes function) charges nothing.
    let peek = store.check("a", &policies, 0).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 997);
    check_counts(&store, "a", &policies, 4).await;
    assert_eq!(store.call_path(), CallPath::Functions);
    assert!(format!("{store:?}").contains("Functions"));
    assert!(libraries(&server.url()).contains(store.library_name()));
    // Checks ran as functions: no script was ever loaded.
    let mut raw = redis_common::raw(&server.url());
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    assert!(info.contains("cmdstat_fcall:"), "{info}");
    assert!(info.contains("cmdstat_fcall_ro:"), "{info}");
    assert!(!info.contains("cmdstat_evalsha:"), "{info}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acl_without_functions_falls_back_to_evalsha() {
    let url = portcullis_tests::redis_url();
    let name = unique_prefix("portcullis-no-fn");
    let user = AclUser {
        url: url.clone(),
        name: name.clone(),
    };
    let store = store(redis_common::without_functions(&url, &name)).await;
    // build() checks the store with a peek, which finds out (FCALL_RO
    // refused: nothing ran): the path is chosen at build().
    assert_eq!(store.call_path(), CallPath::Evalsha, "chosen at build()");
    let policies = redis_common::every_algorithm();
    // The counts are exact from the first check on.
    for nth in 1..=3 {
        check_counts(&store, "a", &policies, nth).await;
        assert_eq!(store.call_path(), CallPath::Evalsha);
    }
    let peek = store.check("a", &policies[..1], 0).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 997);
    assert!(format!("{store:?}").contains("Evalsha"));
    // Other policy combinations go straight to EVALSHA.
    check_counts(&store, "b", &policies[2..4], 1).await;
    drop(user);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acl_user_granted_the_documented_function_rules_runs_on_functions() {
    // What the portcullis-redis docs and README tell an ACL user to grant for
    // the Functions path: ACL_COMMANDS plus these three rules.
    const FUNCTION_RULES: [&str; 3] = ["+fcall", "+fcall_ro", "+function|load"];
    let url = portcullis_tests::redis_url();
    let name = unique_prefix("portcullis-fn-user");
    let prefix = unique_prefix("functions-acl");
    let user = AclUser {
        url: url.clone(),
        name: name.clone(),
    };
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg(&name)
        .arg("reset")
        .arg("on")
        .arg(">with-functions")
        .arg(format!("~{prefix}:*"));
    for rule in portcullis_redis::ACL_COMMANDS
        .split(' ')
        .chain(FUNCTION_RULES)
    {
        setuser.arg(rule);
    }
    let () = setuser
        .query(&mut redis_common::raw(&url))
        .unwrap_or_else(|e| panic!("ACL SETUSER {name}: {e}"));
    let store = RedisStore::builder()
        .url(url.replacen("redis://", &format!("redis://{name}:with-functions@"), 1))
        .prefix(&prefix)
        .timeout(redis_common::TEST_TIMEOUT)
        .build()
        .await
        .unwrap_or_else(|e| panic!("the documented grant builds: {e}"));
    let policies = redis_common::every_algorithm();
    for nth in 1..=3 {
        check_counts(&store, "a", &policies, nth).await;
    }
    let peek = store.check("a", &policies[..1], 0).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 997);
    assert_eq!(store.call_path(), CallPath::Functions);
    assert!(libraries(&url).contains(store.library_name()));
    drop(user);
}

#[tokio::test(flavor = "multi_thread")]
async fn function_flush_mid_run_is_survived() {
    let server = OwnedRedis::start(&[]);
    let store = store(server.url()).await;
    let policies = redis_common::every_algorithm();
    let mut raw = redis_common::raw(&server.url());
    for nth in 1..=30_u64 {
        if nth % 10 == 5 {
            let () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut raw).unwrap();
            assert!(!libraries(&server.url()).contains(store.library_name()));
        }
        // Reloaded, never replayed: the count goes on by one.
        check_counts(&store, "subject", &policies, nth).await;
        check_counts(&store, &format!("single-{nth}"), &policies[..1], 1).await;
    }
    assert_eq!(store.call_path(), CallPath::Functions);
}

#[tokio::test(flavor = "multi_thread")]
async fn function_flush_on_the_cluster_is_survived() {
    let store = redis_common::cluster(&unique_prefix("fn-cluster"), ClockMode::Redis).await;
    let policies = redis_common::every_algorithm();
    let subjects = ["a", "b", "c", "d", "e", "f"];
    for round in 1..=3_u64 {
        for url in portcullis_tests::cluster_urls() {
            let mut raw = redis_common::raw(&url);
            let () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut raw).unwrap();
        }
        for subject in subjects {
            check_counts(&store, subject, &policies, round).await;
        }
    }
}

/// A failover to a node without the library (flushed after its promotion,
/// as a node that never had it): the check is redirected there, the
/// library loaded, the count goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_failover_to_a_node_without_the_library_is_survived() {
    let cluster = OwnedCluster::start(3, 1).await;
    let admin = cluster.admin();
    let (master, replica) = master_with_replica(&admin.nodes().await).expect("a replica");
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .prefix(unique_prefix("fn-failover"))
        .timeout(redis_common::TEST_TIMEOUT)
        .build()
        .await
        .unwrap();
    let policies = redis_common::every_algorithm();
    let subjects: Vec<String> = (0..)
        .map(|i| format!("s{i}"))
        .filter(|s| master.serves(crc16_slot(s.as_bytes())))
        .take(3)
        .collect();
    for subject in &subjects {
        check_counts(&store, subject, &policies, 1).await;
    }
    let mut raw = redis_common::raw(&replica.url);
    let () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut raw)
        .unwrap();
    let mut promoted = false;
    for _ in 0..300 {
        let nodes = admin.nodes().await;
        if nodes
            .iter()
            .any(|n| n.id == replica.id && n.master && !n.slots.is_empty())
        {
            promoted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(promoted, "the replica was not promoted within 30 s");
    let () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut raw).unwrap();
    for subject in &subjects {
        // MOVED to the new master, "Function not found" there, loaded,
        // run once: the state replicated before the failover goes on.
        check_counts(&store, subject, &policies, 2).await;
    }
    assert!(libraries(&replica.url).contains(store.library_name()));
}

/// The allow-oom twin on both paths: at maxmemory, a held subject is
/// checked exactly and a new one is refused with OutOfMemory.
#[tokio::test(flavor = "multi_thread")]
async fn out_of_memory_on_both_paths() {
    let server = OwnedRedis::start(&["--maxmemory-policy", "noeviction"]);
    let functions = store(server.url()).await;
    let evalsha = store(redis_common::without_functions(&server.url(), "no-fn")).await;
    let policies = redis_common::every_algorithm();
    check_counts(&functions, "held-f", &policies, 1).await;
    check_counts(&evalsha, "held-e", &policies, 1).await;
    assert_eq!(evalsha.call_path(), CallPath::Evalsha);
    // Held subjects of the EVALSHA path, checked at once with new ones
    // below (a batch across subjects).
    for i in 0..8 {
        check_counts(&evalsha, &format!("held-across-{i}"), &policies, 1).await;
    }
    // One whole-microsecond GCRA policy: the fast function and its twin.
    let fast = [Policy::per_hour(1_000).name("fast").build().unwrap()];
    assert!(functions
        .check("held-fast", &fast, 1)
        .await
        .unwrap()
        .is_allowed());
    // Each algorithm alone, checked at once below (coalesced batches).
    for policy in &policies {
        check_counts(&functions, "held-batch", std::slice::from_ref(policy), 1).await;
    }
    let mut raw = redis_common::raw(&server.url());
    portcullis_tests::reliability::fill_past_maxmemory(&server.url()).await;
    // Coalesced (Functions): the first check alone, the others as one
    // batch, by each one-policy batch function's allow-oom twin: a held
    // subject's checks are decided exactly, one after another; a new
    // subject's are each refused.
    for policy in &policies {
        let one = std::slice::from_ref(policy);
        let held = join_all((0..16).map(|_| functions.check("held-batch", one, 1))).await;
        let left: Vec<u64> = held
            .into_iter()
            .map(|verdict| verdict.unwrap().decisions()[0].remaining())
            .collect();
        let expected: Vec<u64> = (0..16).map(|j| 998 - j).collect();
        assert_eq!(left, expected, "{}: held, at maxmemory", policy.algorithm());
        let fresh = join_all((0..16).map(|_| functions.check("fresh-batch", one, 1))).await;
        for verdict in fresh {
            assert!(
                matches!(verdict, Err(StoreError::OutOfMemory { .. })),
                "{}: {verdict:?}",
                policy.algorithm()
            );
        }
    }
    // Across subjects on EVALSHA: held and new subjects made at once, the
    // first two alone and the others as one call of the batch script,
    // which Redis refuses at its first write and which runs again as its
    // allow-oom twin: each held subject decided exactly, each new one
    // refused, as alone.
    let subjects: Vec<(String, bool)> = (0..8)
        .flat_map(|i| {
            [
                (format!("held-across-{i}"), true),
                (format!("fresh-across-{i}"), false),
            ]
        })
        .collect();
    let got = join_all(
        subjects
            .iter()
            .map(|(subject, _)| evalsha.check(subject, &policies, 1)),
    )
    .await;
    for ((subject, held), verdict) in subjects.iter().zip(got) {
        if *held {
            let verdict = verdict.unwrap_or_else(|e| panic!("{subject}, at maxmemory: {e}"));
            assert!(verdict.is_allowed(), "{subject}, at maxmemory");
            for decision in verdict.decisions() {
                assert_eq!(decision.remaining(), 998, "{subject}, at maxmemory");
            }
        } else {
            assert!(
                matches!(verdict, Err(StoreError::OutOfMemory { .. })),
                "{subject}: {verdict:?}"
            );
        }
    }
    for (store, held) in [(&functions, "held-f"), (&evalsha, "held-e")] {
        check_counts(store, held, &policies, 2).await;
        let fresh = store.check("fresh", &policies, 1).await;
        assert!(
            matches!(fresh, Err(StoreError::OutOfMemory { .. })),
            "{:?}: {fresh:?}",
            store.call_path()
        );
    }
    let held = functions.check("held-fast", &fast, 1).await.unwrap();
    assert!(held.is_allowed());
    assert_eq!(held.decisions()[0].remaining(), 998);
    let fresh = functions.check("fresh-fast", &fast, 1).await;
    assert!(
        matches!(fresh, Err(StoreError::OutOfMemory { .. })),
        "{fresh:?}"
    );
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut raw)
        .unwrap();
}

/// Lean calls: an admitted single-policy check writes once (SET ... PXAT,
/// no PEXPIREAT); a denial and a peek write nothing.
#[tokio::test(flavor = "multi_thread")]
async fn one_write_per_admitted_check_and_none_for_denials_or_peeks() {
    let server = OwnedRedis::start(&[]);
    let store = store(server.url()).await;
    let mut raw = redis_common::raw(&server.url());
    let calls = |raw: &mut redis::Connection, command: &str| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(raw).unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let policy = [Policy::per_minute(2)
            .algorithm(algorithm)
            .name("lean")
            .build()
            .unwrap()];
        let subject = format!("lean-{algorithm}");
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut raw)
            .unwrap();
        assert!(store
            .check(&subject, &policy, 1)
            .await
            .unwrap()
            .is_allowed());
        assert!(store
            .check(&subject, &policy, 1)
            .await
            .unwrap()
            .is_allowed());
        assert_eq!(calls(&mut raw, "set"), 2, "{algorithm}: one SET per admit");
        assert_eq!(
            calls(&mut raw, "pexpireat"),
            0,
            "{algorithm}: PXAT, not PEXPIREAT"
        );
        assert!(!store
            .check(&subject, &policy, 1)
            .await
            .unwrap()
            .is_allowed());
        store.check(&subject, &policy, 0).await.unwrap();
        assert_eq!(
            calls(&mut raw, "set"),
            2,
            "{algorithm}: a denial and a peek write nothing"
        );
        let ttl: i64 = redis::cmd("PTTL")
            .arg(store.key_for(&subject, "lean"))
            .query(&mut raw)
            .unwrap();
        // At most two periods (the sliding window keeps the previous one).
        assert!(ttl > 0 && ttl <= 121_000, "{algorithm}: PTTL {ttl}");
    }
}

/// What the Lua relies on: a number passed to redis.call on its own reaches
/// Redis exactly for every integer below 2^53 (%.17g), while `..` rounds.
#[test]
fn redis_converts_lua_integers_below_2_pow_53_exactly() {
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    let key = unique_prefix("lua-number");
    for n in [
        0_u64,
        1,
        999_999,
        1_700_000_000_123_457,
        (1 << 53) - 1,
        1 << 52,
        (1 << 52) + 1,
    ] {
        let stored: String = redis::cmd("EVAL")
            .arg("redis.call('SET', KEYS[1], tonumber(ARGV[1]), 'PX', 60000) return redis.call('GET', KEYS[1])")
            .arg(1)
            .arg(&key)
            .arg(n)
            .query(&mut raw)
            .unwrap();
        assert_eq!(stored, n.to_string());
    }
    let joined: String = redis::cmd("EVAL")
        .arg("return '' .. tonumber(ARGV[1])")
        .arg(0)
        .arg(1_700_000_000_123_457_u64)
        .query(&mut raw)
        .unwrap();
    assert_ne!(
        joined, "1700000000123457",
        "`..` rounds: fmt() stays for strings"
    );
}

/// The next `FCALL` line a `MONITOR` connection prints.
fn next_fcall(monitor: &mut std::io::BufReader<std::net::TcpStream>) -> String {
    use std::io::BufRead as _;
    let mut line = String::new();
    loop {
        line.clear();
        let read = monitor.read_line(&mut line).expect("a MONITOR line");
        assert!(read > 0, "MONITOR closed");
        if line.contains("\"FCALL") {
            return line;
        }
    }
}

/// The stored values the fast GCRA functions are tested from: absent, a
/// plain lead, one beyond the clock tolerance (repaired by the general
/// check), a tagged remainder, garbage, and a key of another type.
fn gcra_starts(now: u64) -> [(&'static str, redis::Value); 8] {
    [
        ("absent", redis::Value::Nil),
        (
            "ahead",
            redis::Value::BulkString(format!("{:x}", now + 30_000).into_bytes()),
        ),
        (
            "beyond the tolerance",
            redis::Value::BulkString(format!("{:x}", now + 10_000_000).into_bytes()),
        ),
        (
            "tagged remainder",
            redis::Value::BulkString(format!("gcra:{}:2", now + 20_000).into_bytes()),
        ),
        // Past the burst of `per_second(3).burst(5)` (1.67 s) but within
        // its tolerance: denied by the general check's arithmetic.
        (
            "ahead of the burst",
            redis::Value::BulkString(format!("{:x}", now + 2_500_000).into_bytes()),
        ),
        // A remainder of a policy with a larger scale: carried by the
        // general check.
        (
            "remainder past the scale",
            redis::Value::BulkString(format!("gcra:{}:7", now + 20_000).into_bytes()),
        ),
        ("garbage", redis::Value::BulkString(b"not a state".to_vec())),
        ("another type", redis::Value::Array(Vec::new())),
    ]
}

/// One exact GCRA policy takes the fast function (one integer back),
/// whether its interval is a whole number of microseconds or not; several
/// whole-microsecond policies gcra_multi (one integer per policy); anything
/// else the general check. Every
/// state the fast function cannot read itself (a tagged state with a
/// remainder, a time further ahead than the tolerance, a value of another
/// type, garbage) is handed to the general check inside the same call, and
/// the decisions and stored states equal the EVALSHA path's, step by step.
#[tokio::test(flavor = "multi_thread")]
async fn the_fast_gcra_function_agrees_with_the_general_check() {
    use std::sync::Arc;

    use portcullis_core::Clock as _;

    let server = OwnedRedis::start(&[]);
    let clock = redis_common::manual_clock();
    let build = |url: String, label: &str| {
        RedisStore::builder()
            .url(url)
            .prefix(unique_prefix(label))
            .timeout(redis_common::TEST_TIMEOUT)
            .clock(ClockMode::Client(Arc::new(clock.clone())))
            .client_clock_tolerance(Duration::MAX)
            .build()
    };
    let fast = build(server.url(), "fast").await.unwrap();
    let general = build(
        redis_common::without_functions(&server.url(), "no-fn-fast"),
        "general",
    )
    .await
    .unwrap();
    assert_eq!(fast.call_path(), CallPath::Functions);
    assert_eq!(general.call_path(), CallPath::Evalsha);

    let mut monitor = redis_common::monitor(&server.url());
    let mut raw = redis_common::raw(&server.url());

    let whole = [Policy::per_second(100).burst(5).name("p").build().unwrap()];
    let fractional = [Policy::per_second(3).burst(5).name("p").build().unwrap()];
    let set = |raw: &mut redis::Connection, store: &RedisStore, value: redis::Value| {
        let key = store.key_for("s", "p");
        let _: () = redis::cmd("DEL").arg(&key).query(raw).unwrap();
        match value {
            redis::Value::BulkString(bytes) => {
                let () = redis::cmd("SET").arg(&key).arg(bytes).query(raw).unwrap();
            }
            redis::Value::Array(_) => {
                let _: i64 = redis::cmd("RPUSH").arg(&key).arg("x").query(raw).unwrap();
            }
            _ => {}
        }
    };
    let stored = |raw: &mut redis::Connection, store: &RedisStore| -> Option<String> {
        redis::cmd("GET")
            .arg(store.key_for("s", "p"))
            .query(raw)
            .ok()
            .flatten()
    };
    // A whole-microsecond interval (the lead answered in µs), one whose
    // burst × period passes 2^52 (5 per 10^9 s: a whole 2·10^8 s
    // interval, which the core holds at a reduced scale) and a fractional
    // one (333 333.3 µs, the lead in thirds of a µs): costs of 1 and 2,
    // through admissions and denials.
    let huge = [Policy::per(5, Duration::from_secs(1_000_000_000))
        .name("p")
        .build()
        .unwrap()];
    assert!(!huge[0].is_exact());
    for policies in [&whole, &huge, &fractional] {
        for i in 0..gcra_starts(clock.now_micros()).len() {
            // Each start written relative to the clock's time at that
            // start, so an "ahead" start is still ahead after the steps of
            // the starts before it.
            let (label, start) = gcra_starts(clock.now_micros())[i].clone();
            set(&mut raw, &fast, start.clone());
            set(&mut raw, &general, start);
            for step in 0..8 {
                let cost = 1 + step % 2;
                let a = fast.check("s", policies, cost).await;
                let line = next_fcall(&mut monitor);
                assert!(line.contains("_gcra\""), "{label}, step {step}: {line}");
                let b = general.check("s", policies, cost).await;
                match (&a, &b) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{policies:?}, {label}, step {step}"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("{label}, step {step}: {a:?} / {b:?}"),
                }
                if label != "another type" {
                    assert_eq!(
                        stored(&mut raw, &fast),
                        stored(&mut raw, &general),
                        "{policies:?}, {label}, step {step}"
                    );
                }
                clock.advance(Duration::from_millis(3));
            }
        }
    }

    // Two GCRA policies of the fast path: gcra_multi, one integer per
    // policy, the same decisions and states as the general check, from
    // every start (set on the first policy's key; the second's is absent),
    // through denials by one policy and by both.
    let two = [
        Policy::per_second(100).burst(5).name("p").build().unwrap(),
        Policy::per_second(50).burst(3).name("q").build().unwrap(),
    ];
    let stored_q = |raw: &mut redis::Connection, store: &RedisStore| -> Option<String> {
        redis::cmd("GET")
            .arg(store.key_for("s", "q"))
            .query(raw)
            .ok()
            .flatten()
    };
    // The second policy also one whose burst × period passes 2^52 (a whole
    // interval at a reduced scale in the core).
    let with_huge = [
        Policy::per_second(100).burst(5).name("p").build().unwrap(),
        Policy::per(5, Duration::from_secs(1_000_000_000))
            .name("q")
            .build()
            .unwrap(),
    ];
    for two in [&two, &with_huge] {
        for i in 0..gcra_starts(clock.now_micros()).len() {
            // Each start written relative to the clock's time at that
            // start, so an "ahead" start is still ahead after the steps of
            // the starts before it.
            let (label, start) = gcra_starts(clock.now_micros())[i].clone();
            set(&mut raw, &fast, start.clone());
            set(&mut raw, &general, start);
            for store in [&fast, &general] {
                let _: () = redis::cmd("DEL")
                    .arg(store.key_for("s", "q"))
                    .query(&mut raw)
                    .unwrap();
            }
            for step in 0..8 {
                let a = fast.check("s", two, 1 + step % 2).await;
                let line = next_fcall(&mut monitor);
                assert!(
                    line.contains("_gcra_multi\""),
                    "{label}, step {step}: {line}"
                );
                let b = general.check("s", two, 1 + step % 2).await;
                match (&a, &b) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{two:?}, {label}, step {step}"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("{two:?}, {label}, step {step}: {a:?} / {b:?}"),
                }
                if label != "another type" {
                    assert_eq!(
                        stored(&mut raw, &fast),
                        stored(&mut raw, &general),
                        "{label}"
                    );
                }
                assert_eq!(
                    stored_q(&mut raw, &fast),
                    stored_q(&mut raw, &general),
                    "{label}"
                );
                clock.advance(Duration::from_millis(3));
            }
        }
    }

    // A peek, or a fractional interval whose burst × period passes 2^52:
    // the general check.
    let inexact = [Policy::per_day(u64::from(u32::MAX))
        .name("p")
        .build()
        .unwrap()];
    assert!(86_400_000_000 % u64::from(u32::MAX) != 0 && !inexact[0].is_exact());
    fast.check("s", &inexact, 1).await.unwrap();
    assert!(next_fcall(&mut monitor).contains("_check\""));
    fast.check("s", &whole, 0).await.unwrap();
    assert!(next_fcall(&mut monitor).contains("_peek\""));
}

/// Two stores on one server and one manual clock, the first on Redis
/// Functions and the second on the `EVALSHA` path, and a `MONITOR` of the
/// server: what the fast-function tests compare.
struct FastAndGeneral {
    server: OwnedRedis,
    clock: portcullis_core::ManualClock,
    fast: RedisStore,
    general: RedisStore,
    monitor: std::io::BufReader<std::net::TcpStream>,
}

impl FastAndGeneral {
    async fn start(label: &str) -> Self {
        use std::sync::Arc;

        let server = OwnedRedis::start(&[]);
        let clock = redis_common::manual_clock();
        let build = |url: String, label: String| {
            RedisStore::builder()
                .url(url)
                .prefix(unique_prefix(&label))
                .timeout(redis_common::TEST_TIMEOUT)
                .clock(ClockMode::Client(Arc::new(clock.clone())))
                .client_clock_tolerance(Duration::MAX)
                .build()
        };
        let fast = build(server.url(), format!("{label}-fast")).await.unwrap();
        let general = build(
            redis_common::without_functions(&server.url(), &format!("no-fn-{label}")),
            format!("{label}-general"),
        )
        .await
        .unwrap();
        assert_eq!(fast.call_path(), CallPath::Functions);
        assert_eq!(general.call_path(), CallPath::Evalsha);
        let monitor = redis_common::monitor(&server.url());
        Self {
            server,
            clock,
            fast,
            general,
            monitor,
        }
    }

    /// From each start (a value for the key of policy `p`, `Some(empty)`
    /// for a key of another type), ten checks of costs 1, 2, 3, … on both
    /// stores, `step` apart: each goes through the function named
    /// `function` and both stores decide and store alike. `starts` is
    /// called with the clock's time before each start is written, so a
    /// start placed relative to now (ahead of it, in its window) is still
    /// there after the steps of the starts before it.
    async fn agree(
        &mut self,
        policy: &Policy,
        function: &str,
        starts: impl Fn(u64) -> Vec<(&'static str, Option<Vec<u8>>)>,
        step: Duration,
    ) {
        use portcullis_core::Clock as _;

        let mut raw = redis_common::raw(&self.server.url());
        let policy = std::slice::from_ref(policy);
        for i in 0..starts(self.clock.now_micros()).len() {
            let (label, start) = starts(self.clock.now_micros()).swap_remove(i);
            let start = &start;
            for store in [&self.fast, &self.general] {
                let key = store.key_for("s", "p");
                let _: () = redis::cmd("DEL").arg(&key).query(&mut raw).unwrap();
                match start {
                    Some(bytes) if !bytes.is_empty() => {
                        let () = redis::cmd("SET")
                            .arg(&key)
                            .arg(bytes)
                            .query(&mut raw)
                            .unwrap();
                    }
                    Some(_) => {
                        let _: i64 = redis::cmd("RPUSH")
                            .arg(&key)
                            .arg("x")
                            .query(&mut raw)
                            .unwrap();
                    }
                    None => {}
                }
            }
            for n in 0..10_u64 {
                let cost = 1 + n % 3;
                let a = self.fast.check("s", policy, cost).await;
                let line = next_fcall(&mut self.monitor);
                assert!(
                    line.contains(&format!("_{function}\"")),
                    "{label}, step {n}: {line}"
                );
                let b = self.general.check("s", policy, cost).await;
                match (&a, &b) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{label}, step {n}"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("{label}, step {n}: {a:?} / {b:?}"),
                }
                if start.as_ref().is_none_or(|bytes| !bytes.is_empty()) {
                    let mut stored = |store: &RedisStore| -> Option<String> {
                        redis::cmd("GET")
                            .arg(store.key_for("s", "p"))
                            .query(&mut raw)
                            .ok()
                            .flatten()
                    };
                    let (fast, general) = (stored(&self.fast), stored(&self.general));
                    assert_eq!(fast, general, "{label}, step {n}");
                }
                self.clock.advance(step);
            }
        }
    }
}

/// A one-policy token bucket takes the fast token-bucket function (one
/// integer back, the level after the refill). Every state it does not read
/// as plain (a level over full, a last refill after now, another form,
/// garbage, another type) is handed to the general check inside the same
/// call; decisions and stored states equal the EVALSHA path's, step by
/// step, through refills, admissions and denials.
#[tokio::test(flavor = "multi_thread")]
async fn the_fast_token_bucket_function_agrees_with_the_general_check() {
    let mut stores = FastAndGeneral::start("tb").await;
    let starts = |now: u64| {
        vec![
            ("absent", None),
            (
                "half",
                Some(format!("token_bucket:2000000:{}", now - 50_000).into_bytes()),
            ),
            (
                "over full",
                Some(format!("token_bucket:999999999:{now}").into_bytes()),
            ),
            (
                "last after now",
                Some(format!("token_bucket:0:{}", now + 300_000).into_bytes()),
            ),
            ("garbage", Some(b"token_bucket:x:y".to_vec())),
            ("another type", Some(Vec::new())),
        ]
    };
    // Exact (10 per second, burst 4) and a fractional refill (3 per 7 s).
    for policy in [
        Policy::per_second(10).burst(4),
        Policy::per(3, Duration::from_secs(7)),
    ] {
        let policy = policy
            .algorithm(Algorithm::TokenBucket)
            .name("p")
            .build()
            .unwrap();
        stores
            .agree(&policy, "token_bucket", starts, Duration::from_millis(40))
            .await;
    }
}

/// A one-policy leaky bucket meter takes the fast bucket function in its
/// meter form (the water after the drain back); the same starts as the
/// token bucket's, in the meter's own form, go to the general check.
#[tokio::test(flavor = "multi_thread")]
async fn the_fast_leaky_meter_function_agrees_with_the_general_check() {
    let mut stores = FastAndGeneral::start("meter").await;
    let starts = |now: u64| {
        vec![
            ("absent", None),
            (
                "half",
                Some(format!("leaky_meter:2000000:{}", now - 50_000).into_bytes()),
            ),
            (
                "over full",
                Some(format!("leaky_meter:999999999:{now}").into_bytes()),
            ),
            (
                "last after now",
                Some(format!("leaky_meter:0:{}", now + 300_000).into_bytes()),
            ),
            ("garbage", Some(b"leaky_meter:x:y".to_vec())),
            ("another type", Some(Vec::new())),
        ]
    };
    for policy in [
        Policy::per_second(10).burst(4),
        Policy::per(3, Duration::from_secs(7)),
    ] {
        let policy = policy
            .algorithm(Algorithm::LeakyBucket(portcullis_core::LeakyMode::Meter))
            .name("p")
            .build()
            .unwrap();
        stores
            .agree(&policy, "leaky_meter", starts, Duration::from_millis(40))
            .await;
    }
}

/// A one-policy fixed window (limit × period within 2^52) takes the fast
/// fixed-window function (one integer back: the count and the time into
/// the window). A later window, a count over the limit, another form,
/// garbage or another type go to the general check in the same call; the
/// decisions and stored states equal the EVALSHA path's across window
/// ends.
#[tokio::test(flavor = "multi_thread")]
async fn the_fast_fixed_window_function_agrees_with_the_general_check() {
    let mut stores = FastAndGeneral::start("fw").await;
    let policy = Policy::per(5, Duration::from_millis(300))
        .algorithm(Algorithm::FixedWindow)
        .name("p")
        .build()
        .unwrap();
    let starts = |now: u64| {
        let window = now - now % 300_000;
        vec![
            ("absent", None),
            (
                "this window",
                Some(format!("fixed_window:{window}:3").into_bytes()),
            ),
            (
                "an older window",
                Some(format!("fixed_window:{}:5", window - 300_000).into_bytes()),
            ),
            (
                "a later window",
                Some(format!("fixed_window:{}:2", window + 300_000).into_bytes()),
            ),
            (
                "over the limit",
                Some(format!("fixed_window:{window}:9").into_bytes()),
            ),
            ("garbage", Some(b"fixed_window:x:y".to_vec())),
            ("another type", Some(Vec::new())),
        ]
    };
    stores
        .agree(&policy, "fixed_window", starts, Duration::from_millis(70))
        .await;
}

/// A one-policy sliding window counter whose `(limit + 1)² × period` is
/// within 2^52 takes the fast sliding-window function (one integer back:
/// the two counts it weighed and the time into the window). A window that
/// starts after now's, a count over the limit, another form, garbage or
/// another type go to the general check in the same call; the decisions
/// and stored states equal the EVALSHA path's across window ends, at
/// several steps (so the previous window's weight takes many values), and
/// a policy past the bound takes the general check.
#[tokio::test(flavor = "multi_thread")]
async fn the_fast_sliding_window_function_agrees_with_the_general_check() {
    let mut stores = FastAndGeneral::start("sw").await;
    let period = 300_000;
    let policy = Policy::per(5, Duration::from_micros(period))
        .algorithm(Algorithm::SlidingWindow)
        .name("p")
        .build()
        .unwrap();
    // Each start is written from the clock as it is then (the checks from
    // the one before moved it on).
    let starts = |now: u64| -> [(&'static str, Option<Vec<u8>>); 11] {
        let window = now - now % period;
        // A start within now's window but after its beginning (a period
        // that changed); the window's own start when now is on it.
        let inside = window + (now - window) / 2;
        [
            ("absent", None),
            (
                "this window",
                Some(format!("sliding_window:{window}:4:1").into_bytes()),
            ),
            (
                "the window before",
                Some(format!("sliding_window:{}:2:4", window - period).into_bytes()),
            ),
            (
                "an older window",
                Some(format!("sliding_window:{}:5:5", window - 2 * period).into_bytes()),
            ),
            (
                "a later window",
                Some(format!("sliding_window:{}:1:2", window + period).into_bytes()),
            ),
            (
                "a start inside the window",
                Some(format!("sliding_window:{inside}:1:1").into_bytes()),
            ),
            (
                "over the limit",
                Some(format!("sliding_window:{window}:9:1").into_bytes()),
            ),
            (
                "the window before, over the limit",
                Some(format!("sliding_window:{}:0:9", window - period).into_bytes()),
            ),
            (
                "past 2^53",
                Some(format!("sliding_window:{window}:99999999999999999:1").into_bytes()),
            ),
            ("garbage", Some(b"sliding_window:x:y:z".to_vec())),
            ("another type", Some(Vec::new())),
        ]
    };
    for step in [70, 130, 1, 290] {
        stores
            .agree(
                &policy,
                "sliding_window",
                |now| starts(now).to_vec(),
                Duration::from_millis(step),
            )
            .await;
    }
    // The benchmark's policy (100/s), from empty and through denials.
    let per_second = Policy::per_second(100)
        .algorithm(Algorithm::SlidingWindow)
        .name("p")
        .build()
        .unwrap();
    stores
        .agree(
            &per_second,
            "sliding_window",
            |_| vec![("absent", None)],
            Duration::from_millis(3),
        )
        .await;
    // (limit + 1)² × period past 2^52: the general check.
    let daily = [Policy::per_day(100_000)
        .algorithm(Algorithm::SlidingWindow)
        .name("p")
        .build()
        .unwrap()];
    stores.fast.check("s", &daily, 1).await.unwrap();
    assert!(next_fcall(&mut stores.monitor).contains("_check\""));
}

/// A one-policy leaky bucket queue of the GCRA fast path's policies (a
/// whole-microsecond interval) takes the fast queue function (one integer
/// back: the time until the queue is free, the admitted request's delay).
/// A remainder, a time beyond the clock tolerance, another form, garbage
/// or another type go to the general check in the same call; the
/// decisions (delays included) and stored states equal the EVALSHA
/// path's; a fractional interval takes the general check.
#[tokio::test(flavor = "multi_thread")]
async fn the_fast_leaky_queue_function_agrees_with_the_general_check() {
    let mut stores = FastAndGeneral::start("queue").await;
    let policy = Policy::per_second(10)
        .burst(4)
        .algorithm(Algorithm::LeakyBucket(portcullis_core::LeakyMode::Queue))
        .name("p")
        .build()
        .unwrap();
    // Each start is written from the clock as it is then (the checks from
    // the one before moved it on).
    let starts = |now: u64| -> [(&'static str, Option<Vec<u8>>); 10] {
        [
            ("absent", None),
            (
                "ahead",
                Some(format!("leaky_queue:{}:0", now + 150_000).into_bytes()),
            ),
            (
                "room for one, exactly",
                Some(format!("leaky_queue:{}:0", now + 300_000).into_bytes()),
            ),
            (
                "full",
                Some(format!("leaky_queue:{}:0", now + 400_000).into_bytes()),
            ),
            (
                "in the past",
                Some(format!("leaky_queue:{}:0", now - 5_000).into_bytes()),
            ),
            (
                "a remainder",
                Some(format!("leaky_queue:{}:3", now + 20_000).into_bytes()),
            ),
            (
                "within the tolerance",
                Some(format!("leaky_queue:{}:0", now + 900_000).into_bytes()),
            ),
            (
                "beyond the tolerance",
                Some(format!("leaky_queue:{}:0", now + 10_000_000).into_bytes()),
            ),
            ("garbage", Some(b"leaky_queue:x:0".to_vec())),
            ("another type", Some(Vec::new())),
        ]
    };
    for step in [40, 25, 7, 130] {
        stores
            .agree(
                &policy,
                "leaky_queue",
                |now| starts(now).to_vec(),
                Duration::from_millis(step),
            )
            .await;
    }
    let fractional = [Policy::per_second(3)
        .algorithm(Algorithm::LeakyBucket(portcullis_core::LeakyMode::Queue))
        .name("p")
        .build()
        .unwrap()];
    stores.fast.check("s", &fractional, 1).await.unwrap();
    assert!(next_fcall(&mut stores.monitor).contains("_check\""));
}

/// A one-policy sliding log takes the fast sliding-log function (only the
/// reads its plain case needs; the general check's five integers back).
/// More live entries than the limit, an entry after now (near or far),
/// or a key of another type go to the general check in the same call; the
/// decisions and the stored sorted sets (members, scores, expiry) equal
/// the EVALSHA path's, step by step, through expired entries, several
/// admissions in one microsecond, denials and window ends.
#[tokio::test(flavor = "multi_thread")]
async fn the_fast_sliding_log_function_agrees_with_the_general_check() {
    use portcullis_core::Clock as _;

    let mut stores = FastAndGeneral::start("log").await;
    let mut raw = redis_common::raw(&stores.server.url());
    let period: u64 = 300_000;
    let policy = [Policy::per(3, Duration::from_micros(period))
        .algorithm(Algorithm::SlidingLog)
        .name("p")
        .build()
        .unwrap()];
    // Entries (time, n) from now; None for a string key.
    type Start = (&'static str, Option<Vec<(u64, u64)>>);
    let starts = |now: u64| -> [Start; 11] {
        [
            ("absent", Some(vec![])),
            (
                "two live",
                Some(vec![(now - 200_000, 1), (now - 100_000, 1)]),
            ),
            (
                "full",
                Some(vec![(now - 250_000, 1), (now - 250_000, 2), (now - 10, 1)]),
            ),
            (
                "expired and live",
                Some(vec![
                    (now - 2 * period, 1),
                    (now - period, 1),
                    (now - period + 1, 1),
                ]),
            ),
            (
                "all expired",
                Some(vec![(now - period, 1), (now - period, 2)]),
            ),
            ("one at now", Some(vec![(now, 1)])),
            (
                "over the limit",
                Some((1..=5).map(|i| (now - 100_000 + i, 1)).collect()),
            ),
            ("just after now", Some(vec![(now - 5, 1), (now + 1_000, 1)])),
            ("far after now", Some(vec![(now + 100 * period, 1)])),
            (
                "past and full",
                Some(vec![(now - 1, 1), (now - 1, 2), (now - 1, 3)]),
            ),
            ("another type", None),
        ]
    };
    let dump = |raw: &mut redis::Connection, store: &RedisStore| -> (Vec<(String, String)>, i64) {
        let key = store.key_for("s", "p");
        let entries: Vec<(String, String)> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(raw)
            .unwrap_or_default();
        let expiry: i64 = redis::cmd("PEXPIRETIME").arg(&key).query(raw).unwrap();
        (entries, expiry)
    };
    for step in [70_000, 0, 1, 130_000] {
        for i in 0..11 {
            let now = stores.clock.now_micros();
            let (label, start) = starts(now)[i].clone();
            for store in [&stores.fast, &stores.general] {
                let key = store.key_for("s", "p");
                let _: () = redis::cmd("DEL").arg(&key).query(&mut raw).unwrap();
                match &start {
                    Some(entries) => {
                        for (t, n) in entries {
                            let _: i64 = redis::cmd("ZADD")
                                .arg(&key)
                                .arg(t)
                                .arg(format!("{t}:{n}"))
                                .query(&mut raw)
                                .unwrap();
                        }
                    }
                    None => {
                        let () = redis::cmd("SET")
                            .arg(&key)
                            .arg("x")
                            .query(&mut raw)
                            .unwrap();
                    }
                }
            }
            for n in 0..10_u64 {
                let cost = 1 + n % 3;
                let a = stores.fast.check("s", &policy, cost).await;
                let line = next_fcall(&mut stores.monitor);
                assert!(line.contains("_sliding_log\""), "{label}, step {n}: {line}");
                let b = stores.general.check("s", &policy, cost).await;
                match (&a, &b) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{label}, step {step} µs, check {n}"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("{label}, step {step} µs, check {n}: {a:?} / {b:?}"),
                }
                if start.is_some() {
                    assert_eq!(
                        dump(&mut raw, &stores.fast),
                        dump(&mut raw, &stores.general),
                        "{label}, step {step} µs, check {n}"
                    );
                }
                stores.clock.advance(Duration::from_micros(step));
            }
        }
    }
}
