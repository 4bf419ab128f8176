//! The coalesced batch functions of one policy of the fast paths other
//! than GCRA (batch_fast.lua), called directly: from each start, one call
//! of `<library>_<algorithm>_batch` with a list of costs answers and stores
//! exactly what `<library>_<algorithm>` (the fast function) answers and
//! stores when called once per cost at the same instant: the same replies,
//! the same state, the same expiry. A start the fast function hands to the
//! general check makes the batch answer `GENERAL` having written nothing
//! (the client then sends the general batch); the allow-oom twin answers
//! `NOROOM` for a new key and decides a held one as the function does.
//! (A module of `redis_coalesce`, which runs it: Redis Functions only.)

use redis::Value;

/// How a start is written to a key.
pub(crate) enum Start {
    Absent,
    /// A string value.
    Text(String),
    /// A sorted set: (score, member) pairs.
    Log(Vec<(u64, String)>),
    /// A list: a key of another type.
    OtherType,
}

/// One algorithm's batch function, policy and starts.
struct Case {
    /// The fast function's suffix (`fixed_window`); the batch function is
    /// `<suffix>_batch`.
    function: &'static str,
    /// `<limit>:<period_us>:<capacity>`.
    policy: &'static str,
    /// The largest cost the fast function takes (the capacity; the limit
    /// for the windows and the log).
    most: u64,
    /// Each start at now: its label, the start, and whether the fast
    /// function hands it to the general check (the batch then answers
    /// `GENERAL`).
    starts: fn(u64) -> Vec<(&'static str, Start, bool)>,
}

fn text(value: String) -> Start {
    Start::Text(value)
}

fn cases() -> Vec<Case> {
    const P: u64 = 1_000_000;
    vec![
        Case {
            function: "fixed_window",
            policy: "5:1000000:5",
            most: 5,
            starts: |now| {
                let ws = now - now % P;
                vec![
                    ("absent", Start::Absent, false),
                    (
                        "two in now's window",
                        text(format!("fixed_window:{ws}:2")),
                        false,
                    ),
                    // The batch is the first of its window.
                    (
                        "full, the window before",
                        text(format!("fixed_window:{}:5", ws - P)),
                        false,
                    ),
                    ("over the limit", text(format!("fixed_window:{ws}:9")), true),
                    (
                        "a later window",
                        text(format!("fixed_window:{}:1", ws + P)),
                        true,
                    ),
                    ("garbage", text("fixed_window:x:1".to_owned()), true),
                    ("another type", Start::OtherType, true),
                ]
            },
        },
        Case {
            function: "sliding_window",
            policy: "5:1000000:5",
            most: 5,
            starts: |now| {
                let ws = now - now % P;
                vec![
                    ("absent", Start::Absent, false),
                    (
                        "now's window",
                        text(format!("sliding_window:{ws}:3:1")),
                        false,
                    ),
                    // Its current count weighs as the previous one.
                    (
                        "the window before",
                        text(format!("sliding_window:{}:2:4", ws - P)),
                        false,
                    ),
                    (
                        "an older window",
                        text(format!("sliding_window:{}:5:5", ws - 2 * P)),
                        false,
                    ),
                    (
                        "over the limit",
                        text(format!("sliding_window:{ws}:0:7")),
                        true,
                    ),
                    (
                        "a later window",
                        text(format!("sliding_window:{}:0:1", ws + P)),
                        true,
                    ),
                    ("garbage", text("sliding_window:1:x:2".to_owned()), true),
                    ("another type", Start::OtherType, true),
                ]
            },
        },
        Case {
            // 2 per second, burst 6: costs above the limit.
            function: "token_bucket",
            policy: "2:1000000:6",
            most: 6,
            starts: |now| {
                vec![
                    ("absent", Start::Absent, false),
                    (
                        "two tokens, refilling",
                        text(format!("token_bucket:2000000:{}@2:1000000:6", now - 50_000)),
                        false,
                    ),
                    (
                        "an earlier version's, no tail",
                        text(format!("token_bucket:3500000:{}", now - 10)),
                        false,
                    ),
                    (
                        "empty a second ago",
                        text(format!("token_bucket:0:{}@2:1000000:6", now - P)),
                        false,
                    ),
                    (
                        "over full",
                        text(format!("token_bucket:9000000:{now}@2:1000000:6")),
                        true,
                    ),
                    (
                        "last after now",
                        text(format!("token_bucket:0:{}@2:1000000:6", now + 300_000)),
                        true,
                    ),
                    (
                        "another policy's",
                        text(format!("token_bucket:0:{now}@3:1000000:6")),
                        true,
                    ),
                    ("garbage", text("token_bucket:x:y".to_owned()), true),
                    ("another type", Start::OtherType, true),
                ]
            },
        },
        Case {
            function: "leaky_meter",
            policy: "2:1000000:6",
            most: 6,
            starts: |now| {
                vec![
                    ("absent", Start::Absent, false),
                    (
                        "half, draining",
                        text(format!("leaky_meter:3000000:{}@2:1000000:6", now - 50_000)),
                        false,
                    ),
                    (
                        "full a second ago",
                        text(format!("leaky_meter:6000000:{}@2:1000000:6", now - P)),
                        false,
                    ),
                    (
                        "over full",
                        text(format!("leaky_meter:9000000:{now}@2:1000000:6")),
                        true,
                    ),
                    (
                        "last after now",
                        text(format!("leaky_meter:0:{}@2:1000000:6", now + 300_000)),
                        true,
                    ),
                    ("garbage", text("leaky_meter:x:y".to_owned()), true),
                    ("another type", Start::OtherType, true),
                ]
            },
        },
        Case {
            // An interval of 500 ms, burst 6: a queue of 3 s.
            function: "leaky_queue",
            policy: "2:1000000:6",
            most: 6,
            starts: |now| {
                vec![
                    ("absent", Start::Absent, false),
                    (
                        "free in 1.2 s",
                        text(format!("leaky_queue:{}:0@2:1000000:6", now + 1_200_000)),
                        false,
                    ),
                    (
                        "free since before now",
                        text(format!("leaky_queue:{}:0@2:1000000:6", now - 5)),
                        false,
                    ),
                    (
                        "a remainder",
                        text(format!("leaky_queue:{}:1@2:1000000:6", now + 10)),
                        true,
                    ),
                    (
                        "past the tolerance",
                        text(format!("leaky_queue:{}:0@2:1000000:6", now + 9_000_000)),
                        true,
                    ),
                    ("another type", Start::OtherType, true),
                ]
            },
        },
        Case {
            function: "sliding_log",
            policy: "6:1000000:6",
            most: 6,
            starts: |now| {
                let at = |t: u64, n: u32| (t, format!("{t}:{n}"));
                vec![
                    ("absent", Start::Absent, false),
                    (
                        "expired and live entries",
                        Start::Log(vec![
                            at(now - P - 10, 1),
                            at(now - P, 1),
                            at(now - 800_000, 1),
                            at(now - 300_000, 1),
                            at(now - 300_000, 2),
                            at(now - 1, 1),
                        ]),
                        false,
                    ),
                    ("only expired", Start::Log(vec![at(now - 2 * P, 1)]), false),
                    // Numbered after it (by the general check, one by one).
                    (
                        "an entry at now",
                        Start::Log(vec![at(now - 5, 1), at(now, 1)]),
                        false,
                    ),
                    ("an entry after now", Start::Log(vec![at(now + 5, 1)]), true),
                    (
                        "more live than the limit",
                        Start::Log((1..=8).map(|n| at(now - 1_000 * n, 1)).collect()),
                        true,
                    ),
                    ("another type", text("x".to_owned()), true),
                ]
            },
        },
    ]
}

/// The costs a batch decides: mixed, so admissions and denials alternate,
/// each at most `most`.
fn costs(most: u64) -> Vec<u64> {
    [1, 3, 2, 1, 6, 1, 4, 1, 2, 5, 1, 1, 3, 1]
        .into_iter()
        .map(|cost: u64| cost.min(most))
        .collect()
}

/// The replies of a sliding log's checks with each admission as the
/// general check answers it (the fast function answers its first with one
/// integer, the live entries before it; the next admissions at the same
/// instant find entries at now and go to the general check): admitted,
/// `6 - live - cost` left, no retry, reset after the period. The other
/// algorithms' replies as they are.
fn log_admissions(function: &str, replies: &[Value], costs: &[u64]) -> Vec<Value> {
    replies
        .iter()
        .zip(costs)
        .map(|(reply, &cost)| match reply {
            Value::Int(live) if function == "sliding_log" => {
                let left = 6 - live - i64::try_from(cost).unwrap();
                Value::Array([1, left, -1, 1_000_000, 0].map(Value::Int).to_vec())
            }
            reply => reply.clone(),
        })
        .collect()
}

fn write(raw: &mut redis::Connection, key: &str, start: &Start) {
    let _: i64 = redis::cmd("DEL").arg(key).query(raw).unwrap();
    match start {
        Start::Absent => {}
        Start::Text(value) => {
            let () = redis::cmd("SET").arg(key).arg(value).query(raw).unwrap();
        }
        Start::Log(entries) => {
            for (score, member) in entries {
                let _: i64 = redis::cmd("ZADD")
                    .arg(key)
                    .arg(score)
                    .arg(member)
                    .query(raw)
                    .unwrap();
            }
        }
        Start::OtherType => {
            let _: i64 = redis::cmd("RPUSH").arg(key).arg("x").query(raw).unwrap();
        }
    }
}

/// A key's state (whatever its type) and its expiry in ms.
fn state(raw: &mut redis::Connection, key: &str) -> (Value, i64) {
    let kind: String = redis::cmd("TYPE").arg(key).query(raw).unwrap();
    let value = match kind.as_str() {
        "string" => redis::cmd("GET").arg(key).query(raw).unwrap(),
        "zset" => redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(raw)
            .unwrap(),
        "list" => redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query(raw)
            .unwrap(),
        _ => Value::Nil,
    };
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(raw).unwrap();
    (value, at)
}

/// Deletes a start's keys (some have no expiry, and every test key must
/// have one: `redis_ttl`).
fn forget(raw: &mut redis::Connection, keys: [&String; 3]) {
    let _: i64 = redis::cmd("DEL").arg(&keys[..]).query(raw).unwrap();
}

fn fcall(raw: &mut redis::Connection, function: &str, key: &str, args: &[String]) -> Value {
    redis::cmd("FCALL")
        .arg(function)
        .arg(1)
        .arg(key)
        .arg(args)
        .query(raw)
        .unwrap_or_else(|e| panic!("FCALL {function} {key} {args:?}: {e}"))
}

/// Every case and start (see the module docs), on the library `library`
/// of the server of `raw`, with keys under `prefix`, at `now` (µs, ahead
/// of Redis' clock, so no key expires during the test).
pub(crate) fn batches_agree_with_their_fast_functions(
    raw: &mut redis::Connection,
    library: &str,
    prefix: &str,
    now: u64,
) {
    for case in cases() {
        let fast = format!("{library}_{}", case.function);
        let batch = format!("{library}_{}_batch", case.function);
        let costs = costs(case.most);
        for (label, start, general) in (case.starts)(now) {
            let what = format!("{}, {label}", case.function);
            let (one, all, twin) = (
                format!("{prefix}:{{one}}:{}", case.function),
                format!("{prefix}:{{all}}:{}", case.function),
                format!("{prefix}:{{twin}}:{}", case.function),
            );
            for key in [&one, &all, &twin] {
                write(raw, key, &start);
            }
            let before = state(raw, &all);
            let singles: Vec<Value> = costs
                .iter()
                .map(|cost| {
                    let args = [format!("{}:{cost}", case.policy), now.to_string()];
                    fcall(raw, &fast, &one, &args)
                })
                .collect();
            let mut args = vec![case.policy.to_owned(), now.to_string()];
            args.extend(costs.iter().map(u64::to_string));
            let replies = fcall(raw, &batch, &all, &args);
            if general {
                assert_eq!(
                    replies,
                    Value::SimpleString("GENERAL".to_owned()),
                    "{what}: a start the fast function hands to the general check"
                );
                assert_eq!(state(raw, &all), before, "{what}: GENERAL writes nothing");
                forget(raw, [&one, &all, &twin]);
                continue;
            }
            let Value::Array(replies) = replies else {
                panic!("{what}: the batch answered {replies:?}");
            };
            assert_eq!(
                log_admissions(case.function, &replies, &costs),
                log_admissions(case.function, &singles, &costs),
                "{what}: the batch's replies"
            );
            assert_eq!(
                state(raw, &all),
                state(raw, &one),
                "{what}: the state and expiry after the batch"
            );
            let admitted = log_admissions(case.function, &singles, &costs)
                .iter()
                .filter(|reply| match reply {
                    Value::Int(n) => *n >= 0,
                    Value::Array(figures) => figures.first() == Some(&Value::Int(1)),
                    _ => false,
                })
                .count();
            // Each start is chosen so that its batch admits some checks
            // and denies others (a sliding log's denial is five integers).
            assert!(
                admitted > 0 && admitted < costs.len(),
                "{what}: {admitted} of {} admitted",
                costs.len()
            );
            // The allow-oom twin decides a held key as the function does,
            // and refuses a new one (its first check would create it).
            let held = fcall(raw, &format!("{batch}_oom"), &twin, &args);
            if matches!(start, Start::Absent) {
                assert_eq!(held, Value::SimpleString("NOROOM".to_owned()), "{what}");
                assert_eq!(
                    state(raw, &twin).0,
                    Value::Nil,
                    "{what}: NOROOM writes nothing"
                );
            } else {
                assert_eq!(held, Value::Array(replies), "{what}: the allow-oom twin");
                assert_eq!(
                    state(raw, &twin),
                    state(raw, &all),
                    "{what}: the twin's state"
                );
            }
            forget(raw, [&one, &all, &twin]);
        }
    }
}
