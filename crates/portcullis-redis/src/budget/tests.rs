//! Unit tests of the local budget (`budget/table.rs`): the bound's figures, when
//! a subject is granted, how long a grant and a repeated denial last, and
//! that a reset or other policy numbers drop what was taken before.

use super::*;

fn policy() -> Policy {
    Policy::per_second(1_000).name("api").build().unwrap()
}

#[test]
fn the_bound_is_the_smaller_of_grants_and_rate() {
    let budget = LocalBudget::new()
        .max_permits(32)
        .grant_period(Duration::from_millis(100));
    assert_eq!(budget.overshoot_bound(&policy(), 3), 96);
    assert_eq!(budget.overshoot_bound(&policy(), 10), 100);
    let slow = Policy::per_minute(60).name("api").build().unwrap();
    // 60 per minute over 100 ms: 0.1, rounded up to 1.
    assert_eq!(budget.overshoot_bound(&slow, 3), 1);
}

const MS: u64 = 1_000;

#[test]
fn a_quiet_subject_is_never_granted_and_a_busy_one_is() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    // One check per grant period: exact every time.
    for i in 0..5 {
        assert!(matches!(
            budget.take("k", &policy, 1, i * 150 * MS),
            Take::Exact
        ));
    }
    // Ten checks in one period: the next period grants ten.
    for _ in 0..10 {
        assert!(matches!(budget.take("busy", &policy, 1, 0), Take::Exact));
    }
    let Take::Grant(want) = budget.take("busy", &policy, 1, 100 * MS) else {
        panic!("a busy subject should grant");
    };
    assert_eq!(want.permits, 10);
    // While the grant is in flight, checks are exact.
    assert!(matches!(
        budget.take("busy", &policy, 1, 100 * MS),
        Take::Exact
    ));
    let decision = Decision::allowed(1_000, 900, Duration::from_millis(100));
    budget.grant_ended("busy", want, 1, want.permits, 100 * MS, Some(&decision));
    for left in (0..9).rev() {
        let Take::Local(verdict) = budget.take("busy", &policy, 1, 101 * MS) else {
            panic!("the grant should admit");
        };
        assert_eq!(verdict.binding().remaining(), 900 - (9 - left));
    }
    // Spent: the next check grants again (or goes exact).
    assert!(!matches!(
        budget.take("busy", &policy, 1, 102 * MS),
        Take::Local(_)
    ));
}

#[test]
fn a_grant_ends_one_period_after_it_was_sent() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    for _ in 0..20 {
        budget.take("k", &policy, 1, 0);
    }
    let Take::Grant(want) = budget.take("k", &policy, 1, 100 * MS) else {
        panic!("a busy subject should grant");
    };
    let decision = Decision::allowed(1_000, 500, Duration::ZERO);
    // Sent at 100 ms, answered at 150 ms: spendable until 200 ms.
    budget.grant_ended("k", want, 1, want.permits, 100 * MS, Some(&decision));
    assert!(matches!(
        budget.take("k", &policy, 1, 199 * MS),
        Take::Local(_)
    ));
    assert!(!matches!(
        budget.take("k", &policy, 1, 200 * MS),
        Take::Local(_)
    ));
}

#[test]
fn a_denial_is_repeated_locally_until_its_retry_after() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    for _ in 0..20 {
        budget.take("k", &policy, 2, 0);
    }
    let Take::Grant(want) = budget.take("k", &policy, 2, 100 * MS) else {
        panic!("a busy subject should grant");
    };
    let denied = Decision::denied(10, 0, Duration::from_millis(30), Duration::from_secs(1));
    budget.grant_ended("k", want, 2, 0, 100 * MS, Some(&denied));
    let Take::Local(verdict) = budget.take("k", &policy, 2, 110 * MS) else {
        panic!("the denial should be repeated here");
    };
    assert!(!verdict.is_allowed());
    assert_eq!(verdict.retry_after(), Some(Duration::from_millis(20)));
    // A smaller cost may fit: asked of Redis. So is any cost once the
    // retry-after has passed.
    assert!(!matches!(
        budget.take("k", &policy, 1, 110 * MS),
        Take::Local(_)
    ));
    assert!(!matches!(
        budget.take("k", &policy, 2, 130 * MS),
        Take::Local(_)
    ));
}

#[test]
fn a_full_table_checks_new_subjects_exactly() {
    let budget = Budget::new(LocalBudget::new().max_subjects(SHARDS));
    let policy = policy();
    let exact = (0..1_000)
        .filter(|i| matches!(budget.take(&format!("s{i}"), &policy, 1, 0), Take::Exact))
        .count();
    assert_eq!(exact, 1_000);
    let held: usize = budget
        .shards
        .iter()
        .map(|s| s.lock().unwrap().slots.len())
        .sum();
    assert!(held <= SHARDS, "{held} subjects held, at most {SHARDS}");
}

/// `key` of `policy`, busy at 0, asking for a grant at 100 ms.
fn busy(budget: &Budget, key: &str, policy: &Policy) -> Ask {
    for _ in 0..20 {
        budget.take(key, policy, 1, 0);
    }
    let Take::Grant(want) = budget.take(key, policy, 1, 100 * MS) else {
        panic!("a busy subject should grant");
    };
    want
}

#[test]
fn a_grant_takes_no_more_than_one_grant_period_of_the_rate() {
    // A daily quota with hour-long grants: 10 000 × 1 h / 24 h = 416.7.
    let budget = Budget::new(
        LocalBudget::new()
            .max_permits(10_000)
            .grant_period(Duration::from_secs(3_600)),
    );
    let daily = Policy::per_day(10_000).name("api").build().unwrap();
    for _ in 0..1_000 {
        assert!(matches!(budget.take("k", &daily, 1, 0), Take::Exact));
    }
    let Take::Grant(want) = budget.take("k", &daily, 1, 3_600_000 * MS) else {
        panic!("a busy subject should grant");
    };
    assert_eq!(want.permits, 417);
    // Less than two permits per grant period: never granted.
    let slow = Policy::per_minute(6).name("api").build().unwrap();
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_secs(1)));
    for i in 0..100 {
        assert!(matches!(
            budget.take("k", &slow, 1, i * 100 * MS),
            Take::Exact
        ));
    }
}

#[test]
fn a_denial_is_held_no_longer_than_a_grant_period() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    let want = busy(&budget, "k", &policy);
    // A state far ahead (a lowered plan): Redis said 10 s.
    let denied = Decision::denied(10, 0, Duration::from_secs(10), Duration::from_secs(20));
    budget.grant_ended("k", want, 1, 0, 100 * MS, Some(&denied));
    assert!(budget.local("k", &policy, 1, 199 * MS).is_some());
    assert!(budget.local("k", &policy, 1, 200 * MS).is_none());
}

#[test]
fn a_reset_drops_the_grant_the_denial_and_the_call_in_flight() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    let allowed = Decision::allowed(1_000, 900, Duration::ZERO);
    let want = busy(&budget, "a", &policy);
    budget.grant_ended("a", want, 1, want.permits, 100 * MS, Some(&allowed));
    assert!(budget.local("a", &policy, 1, 100 * MS).is_some());
    budget.forget("a");
    assert!(budget.local("a", &policy, 1, 100 * MS).is_none());

    let denied = Decision::denied(10, 0, Duration::from_millis(50), Duration::ZERO);
    let want = busy(&budget, "b", &policy);
    budget.grant_ended("b", want, 1, 0, 100 * MS, Some(&denied));
    assert!(budget.local("b", &policy, 1, 100 * MS).is_some());
    budget.forget("b");
    assert!(budget.local("b", &policy, 1, 100 * MS).is_none());

    // Sent before the reset, answered after it: ignored, and the next
    // check may grant again.
    let want = busy(&budget, "c", &policy);
    budget.forget("c");
    budget.grant_ended("c", want, 1, 0, 100 * MS, Some(&denied));
    assert!(budget.local("c", &policy, 1, 100 * MS).is_none());
    assert!(matches!(
        budget.take("c", &policy, 1, 100 * MS),
        Take::Grant(_)
    ));
}

#[test]
fn other_numbers_never_get_an_answer_taken_under_the_old_ones() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    let raised = Policy::per_second(100_000).name("api").build().unwrap();
    let denied = Decision::denied(10, 0, Duration::from_millis(50), Duration::ZERO);
    let want = busy(&budget, "k", &policy);
    budget.grant_ended("k", want, 1, 0, 100 * MS, Some(&denied));
    assert!(budget.local("k", &raised, 1, 100 * MS).is_none());
    // The raised plan's first check asks Redis, and drops the denial:
    // the old plan asks Redis too.
    assert!(!matches!(
        budget.take("k", &raised, 1, 100 * MS),
        Take::Local(_)
    ));
    assert!(budget.local("k", &policy, 1, 100 * MS).is_none());

    // A grant asked under the old numbers, answered after the change:
    // ignored.
    let allowed = Decision::allowed(1_000, 900, Duration::ZERO);
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let want = busy(&budget, "k", &policy);
    assert!(!matches!(
        budget.take("k", &raised, 1, 100 * MS),
        Take::Local(_)
    ));
    budget.grant_ended("k", want, 1, want.permits, 100 * MS, Some(&allowed));
    assert!(budget.local("k", &raised, 1, 100 * MS).is_none());
    assert!(budget.local("k", &policy, 1, 100 * MS).is_none());
}
