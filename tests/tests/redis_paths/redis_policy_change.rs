//! A policy change is a first-class event (ALGORITHMS.md, "Changing a
//! policy"), in Redis as in memory: a stored state further ahead than the
//! current policy can leave is clamped to its worst case, written back with
//! its TTL re-armed, and a value that does not parse is no state, never an
//! error, and is overwritten on the next admit.

use crate::redis_common;

use std::time::Duration;

use portcullis_core::{Algorithm, Clock, LeakyMode, MemoryStore, Policy, Store, Verdict};
use portcullis_redis::{ClockMode, RedisStore};
use portcullis_tests::unique_prefix;
use redis::Commands;
use redis_common::{client, manual_clock};

const MINUTE_US: u64 = 60_000_000;
const TEN_YEARS_US: u64 = 10 * 365 * 86_400_000_000;

fn per_minute(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::per_minute(limit)
        .algorithm(algorithm)
        .name("api")
        .build()
        .expect("valid")
}

fn per_hour(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::per_hour(limit)
        .algorithm(algorithm)
        .name("api")
        .build()
        .expect("valid")
}

/// The longest the current policy can hold a subject back: its full reset
/// (two periods for a sliding window).
fn full_reset(policy: &Policy) -> Duration {
    match policy.algorithm() {
        Algorithm::SlidingWindow => policy.period() * 2,
        Algorithm::FixedWindow | Algorithm::SlidingLog => policy.period(),
        _ => Duration::from_micros(policy.capacity() * policy.period_micros() / policy.limit()),
    }
}

/// Redis' clock, in microseconds.
fn redis_now(raw: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(raw).expect("TIME");
    secs * 1_000_000 + micros
}

/// A valid-looking state of `algorithm` ten years ahead of `now`.
fn far_ahead(raw: &mut redis::Connection, key: &str, algorithm: Algorithm, now: u64) {
    let later = now + TEN_YEARS_US;
    let aligned = later - later % MINUTE_US;
    let mut pipe = redis::pipe();
    pipe.atomic().del(key).ignore();
    match algorithm {
        Algorithm::Gcra => pipe.set(key, format!("gcra:{later}:0")).ignore(),
        Algorithm::LeakyBucket(LeakyMode::Queue) => {
            pipe.set(key, format!("leaky_queue:{later}:0")).ignore()
        }
        Algorithm::TokenBucket => pipe.set(key, format!("token_bucket:0:{later}")).ignore(),
        Algorithm::LeakyBucket(LeakyMode::Meter) => pipe
            .set(key, format!("leaky_meter:60000000:{later}"))
            .ignore(),
        Algorithm::FixedWindow => pipe.set(key, format!("fixed_window:{aligned}:3")).ignore(),
        Algorithm::SlidingWindow => pipe
            .set(key, format!("sliding_window:{aligned}:3:3"))
            .ignore(),
        _ => pipe
            .zadd(key, format!("{later}:1"), later)
            .zadd(key, format!("{later}:2"), later)
            .ignore(),
    };
    // Every key of the tests carries a TTL: a long one, as a stale policy
    // would have left.
    pipe.pexpire(key, 86_400_000).ignore();
    let () = pipe.query(raw).expect("setup");
}

/// A state ten years ahead (a clock that jumped back, a corrupt value): the
/// subject is held no longer than the policy's full reset, and the key's
/// TTL is re-armed to at most that.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_far_ahead_is_clamped_and_its_ttl_rearmed() {
    let store = redis_common::standalone(&unique_prefix("clamp"), ClockMode::Redis).await;
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let policy = per_minute(algorithm, 5);
        let bound = full_reset(&policy);
        let subject = format!("s{i}");
        let key = store.key_for(&subject, "api");
        let now = redis_now(&mut raw);
        far_ahead(&mut raw, &key, algorithm, now);
        let policies = [policy];
        // A peek reads the clamped state but writes nothing.
        let peek = store.check(&subject, &policies, 0).await.unwrap();
        assert!(
            peek.binding().reset_after() <= bound,
            "{algorithm}: {peek:?}"
        );
        let ttl: i64 = raw.pttl(&key).unwrap();
        assert!(ttl > 3_600_000, "{algorithm}: a peek re-armed the TTL");
        // A charge: whatever its verdict, the clamped state is written.
        let verdict = store.check(&subject, &policies, 5).await.unwrap();
        let decision = verdict.binding();
        if let Some(retry) = decision.retry_after() {
            assert!(retry <= bound, "{algorithm}: held back {retry:?}");
        }
        assert!(decision.reset_after() <= bound, "{algorithm}: {decision:?}");
        let ttl: i64 = raw.pttl(&key).unwrap();
        let bound_ms = i64::try_from(bound.as_millis()).unwrap() + 1;
        assert!(
            (0..=bound_ms).contains(&ttl),
            "{algorithm}: TTL {ttl} ms, not re-armed to at most {bound_ms}"
        );
    }
}

/// Values that do not parse, or hold numbers past 2^53, are no state: the
/// check answers as for a new subject, never with an error, and the next
/// admit overwrites them.
#[tokio::test(flavor = "multi_thread")]
async fn corrupt_values_are_no_state_and_heal_on_the_next_admit() {
    let store = redis_common::standalone(&unique_prefix("corrupt"), ClockMode::Redis).await;
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    let tags = [
        (Algorithm::Gcra, "gcra"),
        (Algorithm::LeakyBucket(LeakyMode::Queue), "leaky_queue"),
        (Algorithm::TokenBucket, "token_bucket"),
        (Algorithm::LeakyBucket(LeakyMode::Meter), "leaky_meter"),
        (Algorithm::FixedWindow, "fixed_window"),
        (Algorithm::SlidingWindow, "sliding_window"),
    ];
    for (i, (algorithm, tag)) in tags.into_iter().enumerate() {
        let mut values = vec![
            // The value of issue 11: a number past 2^64.
            format!("{tag}:99999999999999999999:0"),
            format!("{tag}:9007199254740993:1"),
            format!("{tag}:1:99999999999999999"),
            format!("{tag}:1"),
            format!("{tag}:1:2:3:4"),
            format!("{tag}:-5:3"),
            format!("{tag}:1.5:3"),
            format!("{tag}:"),
            "garbage".to_owned(),
            String::new(),
        ];
        if algorithm == Algorithm::Gcra {
            // GCRA's hexadecimal state (issue 10): anything but hex digits
            // for a number below 2^53 is no state.
            for plain in [
                "20000000000000",
                "-5",
                "1.5",
                "inf",
                "nan",
                "ffffffffffffffffff",
                " ",
                "x1",
            ] {
                values.push(plain.to_owned());
            }
        }
        for (j, value) in values.iter().enumerate() {
            let subject = format!("c{i}-{j}");
            let key = store.key_for(&subject, "api");
            let () = redis::pipe()
                .atomic()
                .set(&key, value)
                .ignore()
                .pexpire(&key, 86_400_000)
                .ignore()
                .query(&mut raw)
                .unwrap();
            let policies = [per_minute(algorithm, 5)];
            let verdict: Verdict = store
                .check(&subject, &policies, 1)
                .await
                .unwrap_or_else(|e| panic!("{algorithm} over {value:?}: {e}"));
            assert!(verdict.is_allowed(), "{algorithm} over {value:?}");
            assert_eq!(
                verdict.binding().remaining(),
                4,
                "{algorithm} over {value:?}"
            );
            let stored: String = raw.get(&key).unwrap();
            // A bucket state ends in the units it was written in: its
            // policy's "@<limit>:<period_us>:<capacity>".
            let body = if algorithm.has_burst() {
                let (body, shape) = stored
                    .split_once('@')
                    .unwrap_or_else(|| panic!("{algorithm}: {stored:?} has no shape"));
                assert_eq!(shape, "5:60000000:5", "{algorithm}");
                body
            } else {
                stored.as_str()
            };
            // GCRA writes a whole time as a hexadecimal integer (issue 10).
            let plain = algorithm == Algorithm::Gcra && u64::from_str_radix(body, 16).is_ok();
            assert!(
                (plain || body.starts_with(&format!("{tag}:"))) && stored != *value,
                "{algorithm}: {value:?} not overwritten: {stored:?}"
            );
        }
    }
}

/// A policy lowered under the same name (60 per hour, then 5 per minute):
/// a subject that used the old one up is held no longer than the new
/// policy's full reset, in Redis and in memory alike, and both decide the
/// same on every call.
#[tokio::test(flavor = "multi_thread")]
async fn a_lowered_policy_never_holds_a_subject_beyond_its_own_reset() {
    let clock = manual_clock();
    // An hour boundary, so that windows of both policies start together.
    let start = clock.now_micros().div_ceil(3_600_000_000) * 3_600_000_000;
    clock.set(start);
    let redis: RedisStore =
        redis_common::standalone(&unique_prefix("lowered"), client(&clock)).await;
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        clock.set(start + i as u64 * 7_200_000_000);
        let subject = format!("l{i}");
        let old = [per_hour(algorithm, 60)];
        let new = [per_minute(algorithm, 5)];
        let bound = full_reset(&new[0]);
        for store in [&redis as &dyn DynCheck, &memory] {
            let verdict = store.check_now(&subject, &old, 60).await;
            assert!(verdict.is_allowed(), "{algorithm}: {verdict:?}");
        }
        let a = redis.check(&subject, &new, 1).await.unwrap();
        let b = memory.check(&subject, &new, 1).await.unwrap();
        assert_eq!(a, b, "{algorithm}");
        let decision = a.binding();
        assert!(!decision.is_allowed(), "{algorithm}: {decision:?}");
        let retry = decision.retry_after().unwrap();
        assert!(
            retry <= bound,
            "{algorithm}: held back {retry:?} > {bound:?}"
        );
        assert!(decision.reset_after() <= bound, "{algorithm}: {decision:?}");
        // At the new policy's full reset, the subject is back to full.
        clock.advance(bound);
        let a = redis.check(&subject, &new, 0).await.unwrap();
        let b = memory.check(&subject, &new, 0).await.unwrap();
        assert_eq!(a, b, "{algorithm}");
        assert_eq!(a.binding().remaining(), 5, "{algorithm}: {a:?}");
    }
}

/// `check` through either store (the trait's future type differs).
trait DynCheck {
    fn check_now<'a>(
        &'a self,
        subject: &'a str,
        policies: &'a [Policy],
        cost: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Verdict> + Send + 'a>>;
}

impl<S: Store + Sync> DynCheck for S {
    fn check_now<'a>(
        &'a self,
        subject: &'a str,
        policies: &'a [Policy],
        cost: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Verdict> + Send + 'a>> {
        Box::pin(async move { self.check(subject, policies, cost).await.expect("a check") })
    }
}

/// A plan change under the same name (issue 32): 6 of 6 used at 6 per
/// hour, the customer raised to 10 per hour gets the 4 more at once, then
/// is denied; cut to 3 per hour, the 6 used keep the subject at 0 and
/// never beyond the new full reset; half an hour on, the state has drained
/// at the old rate until the change. Redis decides as memory does on every
/// call, for every algorithm, on the one-integer fast functions (cost 1)
/// and the general check (two policies).
#[tokio::test(flavor = "multi_thread")]
async fn a_plan_change_carries_the_permits_used_into_the_new_limit() {
    let clock = manual_clock();
    let start = clock.now_micros().div_ceil(3_600_000_000) * 3_600_000_000;
    clock.set(start);
    let redis: RedisStore =
        redis_common::standalone(&unique_prefix("plan-change"), client(&clock)).await;
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let minute_cap = |algorithm| {
        Policy::per_minute(1_000)
            .algorithm(algorithm)
            .name("cap")
            .build()
            .unwrap()
    };
    for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for general in [false, true] {
            clock.set(start + (2 * i as u64 + u64::from(general)) * 7_200_000_000);
            let subject = format!("p{i}-{general}");
            let with = |p: Policy| {
                if general {
                    vec![p, minute_cap(algorithm)]
                } else {
                    vec![p]
                }
            };
            let (six, ten, three) = (
                with(per_hour(algorithm, 6)),
                with(per_hour(algorithm, 10)),
                with(per_hour(algorithm, 3)),
            );
            let same = |a: Verdict, b: Verdict, what: &str| {
                assert_eq!(a, b, "{algorithm} ({what}, general {general})");
                a
            };
            for _ in 0..6 {
                let a = DynCheck::check_now(&redis, &subject, &six, 1).await;
                let b = DynCheck::check_now(&memory, &subject, &six, 1).await;
                assert!(same(a, b, "six").is_allowed());
            }
            let a = DynCheck::check_now(&redis, &subject, &ten, 0).await;
            let b = DynCheck::check_now(&memory, &subject, &ten, 0).await;
            assert_eq!(
                same(a, b, "peek at ten").binding().remaining(),
                4,
                "{algorithm}"
            );
            for left in (0..4).rev() {
                let a = DynCheck::check_now(&redis, &subject, &ten, 1).await;
                let b = DynCheck::check_now(&memory, &subject, &ten, 1).await;
                let verdict = same(a, b, "ten");
                assert!(verdict.is_allowed(), "{algorithm}: {verdict:?}");
                assert_eq!(verdict.binding().remaining(), left, "{algorithm}");
            }
            let a = DynCheck::check_now(&redis, &subject, &ten, 1).await;
            let b = DynCheck::check_now(&memory, &subject, &ten, 1).await;
            assert!(!same(a, b, "eleventh").is_allowed(), "{algorithm}");
            // Cut to 3 per hour: held at most the new full reset.
            let a = DynCheck::check_now(&redis, &subject, &three, 1).await;
            let b = DynCheck::check_now(&memory, &subject, &three, 1).await;
            let verdict = same(a, b, "three");
            assert!(!verdict.is_allowed(), "{algorithm}");
            assert!(
                verdict.binding().reset_after() <= full_reset(&three[0]),
                "{algorithm}: {verdict:?}"
            );
            // Later, both read the same state the same way.
            clock.advance(Duration::from_secs(1_800));
            let a = DynCheck::check_now(&redis, &subject, &six, 0).await;
            let b = DynCheck::check_now(&memory, &subject, &six, 0).await;
            same(a, b, "six again, later");
            let a = DynCheck::check_now(&redis, &subject, &ten, 1).await;
            let b = DynCheck::check_now(&memory, &subject, &ten, 1).await;
            same(a, b, "ten again, later");
        }
    }
}

/// A state written before states recorded their shape (a plain
/// hexadecimal TAT, `token_bucket:<level>:<last>` without a tail) is read
/// in the current policy's units, as before, and written back with the
/// shape.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_without_a_shape_is_read_in_the_current_units() {
    let clock = manual_clock();
    let now = clock.now_micros();
    let prefix = unique_prefix("shapeless");
    let redis: RedisStore = redis_common::standalone(&prefix, client(&clock)).await;
    let mut raw = redis_common::raw(&portcullis_tests::redis_url());
    for (algorithm, value) in [
        // Three of six used at 6 per hour: 30 minutes owed.
        (Algorithm::Gcra, format!("{:x}", now + 1_800_000_000)),
        (
            Algorithm::TokenBucket,
            format!("token_bucket:{}:{now}", 3 * 3_600_000_000u64),
        ),
    ] {
        let policies = [per_hour(algorithm, 6)];
        let key = redis.key_for("legacy", "api");
        let _: () = raw.set_ex(&key, &value, 3_600).unwrap();
        let verdict = redis.check("legacy", &policies, 1).await.unwrap();
        assert!(verdict.is_allowed(), "{algorithm}");
        assert_eq!(verdict.binding().remaining(), 2, "{algorithm}");
        let stored: String = raw.get(&key).unwrap();
        assert!(stored.ends_with("@6:3600000000:6"), "{algorithm}: {stored}");
    }
}
