//! The local budget (`LocalBudget`) obeys resets and plan changes, across
//! two OS processes driven on one client clock: instance A is a store in
//! this test, instance B a `budget_worker` process. After A's `reset()`, A
//! answers from Redis at once and B within one lease period; after a plan
//! raised a hundredfold under the same name, both admit what Redis admits
//! under the new plan from their first check; and one lease takes no more
//! than one lease period's worth of the rate (a daily quota leased for an
//! hour takes an hour of it).
//!
//! Each test runs on Redis Functions (xtask skips those by name before
//! Redis 7) and again on the `EVALSHA` path (`..._on_the_evalsha_path`:
//! A and B log in as a user without Redis Functions; every server).

use crate::budget_common;
use crate::redis_common;

use std::time::Duration;

use budget_common::{Setup, Worker};
use portcullis_core::{Clock, ManualClock, Policy, Store, Verdict};
use portcullis_redis::{CallPath, LocalBudget, RedisStore};
use portcullis_tests::unique_prefix;
use redis_common::{client, manual_clock};

use crate::redis_budget::Path;

const MAX_PERMITS: u64 = 16;
/// The lease period: the stated time within which another instance obeys
/// a reset.
const LEASE_MS: u64 = 1_000;
const LEASE_US: u64 = LEASE_MS * 1_000;

fn policy(limit: u64, period_ms: u64, burst: u64) -> Policy {
    Policy::per(limit, Duration::from_millis(period_ms))
        .burst(burst)
        .name("budget")
        .build()
        .expect("a valid policy")
}

/// Instance A: a store on `clock` with a local budget (or without one: the
/// exact reference), checked from this test.
struct Instance {
    runtime: tokio::runtime::Runtime,
    store: RedisStore,
    clock: ManualClock,
}

impl Instance {
    fn new(prefix: &str, clock: &ManualClock, budget: Option<LocalBudget>, path: Path) -> Self {
        assert!(
            path == Path::Evalsha || portcullis_tests::server_has_functions(),
            "the Redis Functions path needs Redis 7 or later; xtask skips it on older servers"
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut builder = RedisStore::builder()
            .url(path.url(&portcullis_tests::redis_url()))
            .prefix(prefix)
            .timeout(redis_common::TEST_TIMEOUT)
            .clock(client(clock))
            // The manual clock runs a day ahead of Redis on purpose.
            .client_clock_tolerance(Duration::MAX);
        if let Some(budget) = budget {
            builder = builder.local_budget(budget);
        }
        let store = runtime
            .block_on(builder.build())
            .expect("the store should build");
        let expected = match path {
            Path::Functions => CallPath::Functions,
            Path::Evalsha => CallPath::Evalsha,
        };
        assert_eq!(store.call_path(), expected);
        Self {
            runtime,
            store,
            clock: clock.clone(),
        }
    }

    fn with_budget(
        prefix: &str,
        clock: &ManualClock,
        max_permits: u64,
        lease_ms: u64,
        path: Path,
    ) -> Self {
        let budget = LocalBudget::new()
            .max_permits(max_permits)
            .grant_period(Duration::from_millis(lease_ms));
        Self::new(prefix, clock, Some(budget), path)
    }

    fn check(&self, subject: &str, policy: &Policy, now: u64, cost: u64) -> Verdict {
        self.clock.set(now);
        self.runtime
            .block_on(
                self.store
                    .check(subject, std::slice::from_ref(policy), cost),
            )
            .expect("a check")
    }

    /// `checks` checks of cost 1 at `now`: how many were admitted.
    fn step(&self, subject: &str, policy: &Policy, now: u64, checks: u64) -> u64 {
        (0..checks)
            .filter(|_| self.check(subject, policy, now, 1).is_allowed())
            .count() as u64
    }

    /// The answer this instance has without Redis, if any.
    fn local_answer(&self, subject: &str, policy: &Policy, now: u64) -> Option<Verdict> {
        self.clock.set(now);
        self.store
            .check_now(subject, std::slice::from_ref(policy), 1)
            .map(|answer| answer.expect("a local answer is a verdict"))
    }

    fn reset(&self, subject: &str, policy: &Policy) {
        self.runtime
            .block_on(self.store.reset(subject, std::slice::from_ref(policy)))
            .expect("a reset");
    }
}

/// Instance B, on `path`.
fn worker(
    path: Path,
    prefix: &str,
    subject: &str,
    limit: u64,
    period_ms: u64,
    burst: u64,
) -> Worker {
    let url = path.url(&portcullis_tests::redis_url());
    Worker::start_on(
        &url,
        &Setup {
            prefix: prefix.to_owned(),
            subject: subject.to_owned(),
            limit,
            period_ms,
            burst,
            max_permits: MAX_PERMITS,
            lease_ms: LEASE_MS,
        },
    )
}

#[test]
fn a_reset_is_obeyed_at_once_here_and_within_one_lease_period_by_another_process() {
    reset_obeyed(Path::Functions);
}

#[test]
fn a_reset_is_obeyed_on_the_evalsha_path() {
    reset_obeyed(Path::Evalsha);
}

/// After A's reset, A answers from Redis at once and B within one lease
/// period, on `path`.
fn reset_obeyed(path: Path) {
    let prefix = unique_prefix("budget-reset");
    let clock = manual_clock();
    let a = Instance::with_budget(&prefix, &clock, MAX_PERMITS, LEASE_MS, path);
    let t0 = clock.now_micros();

    // A plan the budget leases: 10 a second, burst 10, 10 a lease. Busy
    // for two lease periods on both instances: the second spends the
    // burst from leases and is denied, and both repeat that denial.
    let fast = policy(10, 1_000, 10);
    let mut b = worker(path, &prefix, "fast", 10, 1_000, 10);
    for k in 0..2 {
        let now = t0 + k * LEASE_US;
        a.step("fast", &fast, now, 30);
        b.step(now, 30);
    }
    let now = t0 + LEASE_US;
    let held = a.local_answer("fast", &fast, now);
    assert!(
        held.as_ref().is_some_and(|v| !v.is_allowed()),
        "A should repeat Redis' denial locally before the reset, got {held:?}"
    );
    a.reset("fast", &fast);
    // A: at once, at the same instant.
    assert!(
        a.local_answer("fast", &fast, now).is_none(),
        "A kept a local answer from before its reset"
    );
    assert!(
        a.check("fast", &fast, now, 1).is_allowed(),
        "A denied right after its reset"
    );
    // B: one lease period later, a full burst (A's lease taken at the reset
    // has been paid back by then).
    assert_eq!(b.step(now + LEASE_US, 30), 10);

    // A slow plan (6 a minute: retry-after 10 s, longer than a lease
    // period), exhausted by both.
    let slow = policy(6, 60_000, 6);
    let mut b = worker(path, &prefix, "slow", 6, 60_000, 6);
    let t1 = t0 + 10 * LEASE_US;
    let mut admitted = 0;
    for k in 0..2 {
        let now = t1 + k * LEASE_US;
        admitted += a.step("slow", &slow, now, 20);
        admitted += b.step(now, 20);
    }
    assert_eq!(admitted, 6, "the burst, then denials");
    a.reset("slow", &slow);
    assert!(a.local_answer("slow", &slow, t1 + LEASE_US).is_none());
    // B, one lease period after the reset: the fresh burst, as Redis says.
    assert_eq!(b.step(t1 + 2 * LEASE_US, 20), 6);
}

#[test]
fn a_plan_raised_a_hundredfold_under_the_same_name_is_obeyed_by_both_processes() {
    plan_raise_obeyed(Path::Functions);
}

#[test]
fn a_plan_raised_a_hundredfold_is_obeyed_on_the_evalsha_path() {
    plan_raise_obeyed(Path::Evalsha);
}

/// After a plan raised a hundredfold under the same name, both processes
/// admit what Redis admits under it from their first check, on `path`.
fn plan_raise_obeyed(path: Path) {
    let prefix = unique_prefix("budget-raise");
    let clock = manual_clock();
    let a = Instance::with_budget(&prefix, &clock, MAX_PERMITS, LEASE_MS, path);
    // The exact answers: a store without a budget, on a subject with the
    // same history.
    let exact = Instance::new(&prefix, &clock, None, path);
    let t0 = clock.now_micros();
    let old = policy(6, 60_000, 6);
    let raised = policy(600, 60_000, 600);
    let mut b = worker(path, &prefix, "plan", 6, 60_000, 6);
    // Both exhaust the old plan over two lease periods.
    for k in 0..2 {
        let now = t0 + k * LEASE_US;
        let admitted = a.step("plan", &old, now, 20) + b.step(now, 20);
        assert_eq!(admitted, exact.step("ref", &old, now, 40));
    }

    // The raise, at the start of the next lease period.
    let now = t0 + 2 * LEASE_US;
    assert!(
        !exact.check("ref", &old, now, 0).is_allowed(),
        "the old plan should still deny here (else the test shows nothing)"
    );
    let redis = exact.check("ref", &raised, now, 0);
    assert!(redis.is_allowed(), "Redis admits under the raised plan");
    let fits = redis.binding().remaining();
    assert!(
        a.local_answer("plan", &raised, now).is_none(),
        "A answered the raised plan from what it took under the old one"
    );
    // Each process's first check under the raised plan is admitted.
    assert!(
        a.check("plan", &raised, now, 1).is_allowed(),
        "A denied its first check under the raised plan"
    );
    b.send_plan(now, 1, 600, 600);
    assert_eq!(
        b.admitted(),
        1,
        "B denied its first check under the raised plan"
    );
    // And together they admit what Redis admits, less at most each one's
    // unspent lease (9 permits: a lease is at most 10 under the raised
    // plan).
    let admitted = 2 + a.step("plan", &raised, now, 30) + b.step(now, 30);
    let most = fits.min(62);
    assert!(
        admitted <= most && admitted + 18 >= most,
        "{admitted} admitted at the raise, Redis fits {fits} (62 checks)"
    );
    // And the budget serves the raised plan: the next lease period's first
    // check takes a share (A's demand over this one), and A answers the
    // check after it here.
    let next = now + LEASE_US;
    a.check("plan", &raised, next, 1);
    let here = a.local_answer("plan", &raised, next);
    assert!(
        here.is_some(),
        "A took no share under the raised plan (its answer: {here:?})"
    );
}

#[test]
fn a_daily_quota_leased_for_an_hour_takes_no_more_than_an_hour_of_it() {
    an_hour_of_a_daily_quota(Path::Functions);
}

#[test]
fn a_daily_quota_leased_for_an_hour_on_the_evalsha_path_takes_an_hour_of_it() {
    an_hour_of_a_daily_quota(Path::Evalsha);
}

/// One lease of a daily quota for an hour takes an hour of it, on `path`.
fn an_hour_of_a_daily_quota(path: Path) {
    let prefix = unique_prefix("budget-cap");
    let clock = manual_clock();
    const HOUR_MS: u64 = 3_600_000;
    let a = Instance::with_budget(&prefix, &clock, 10_000, HOUR_MS, path);
    let daily = Policy::per_day(10_000)
        .name("budget")
        .build()
        .expect("valid");
    // 10 000 a day over an hour: ⌈416.7⌉.
    let hour_of_it = 417;
    assert_eq!(
        LocalBudget::new()
            .grant_period(Duration::from_millis(HOUR_MS))
            .overshoot_bound(&daily, 1_000),
        hour_of_it
    );
    let t0 = clock.now_micros();
    // A busy hour, checked exactly (no demand seen before it).
    assert_eq!(a.step("day", &daily, t0, 1_000), 1_000);
    // The next hour's first check leases; Redis' remaining tells how many.
    let now = t0 + HOUR_MS * 1_000;
    let before = a.check("day", &daily, now, 0).binding().remaining();
    assert!(a.check("day", &daily, now, 1).is_allowed());
    let after = a.check("day", &daily, now, 0).binding().remaining();
    assert_eq!(before - after, hour_of_it, "permits one lease took");
    // And it pays the next 416 checks locally.
    for _ in 1..hour_of_it {
        assert!(a
            .local_answer("day", &daily, now)
            .is_some_and(|v| v.is_allowed()));
    }
    assert!(a.local_answer("day", &daily, now).is_none());
}
