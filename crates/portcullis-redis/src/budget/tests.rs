//! Unit tests of the local budget (`budget/table.rs`): the bound's figures, when
//! a subject is granted, how long a share and a held denial last, that a
//! share's slots are dispensed no earlier than their GCRA times, that a
//! grant call in flight under a flood is answered here, and that a reset
//! or other policy numbers drop what was taken before.

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

/// Redis answered the grant asked as `want` for `key` (cost 1), sent and
/// answered at `at`: `slots` slots at a lead of `lead` µs, the asking
/// check admitted or not.
fn answered(
    budget: &Budget,
    key: &str,
    want: Ask,
    (slots, lead): (u64, u64),
    admitted: bool,
    at: u64,
) {
    budget.grant_ended(
        key.as_bytes(),
        want,
        1,
        Some(Share { slots, lead }),
        admitted,
        (at, at),
    );
}

#[test]
fn a_quiet_subject_is_never_granted_and_a_busy_one_is() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    // One check per grant period: exact every time.
    for i in 0..5 {
        assert!(matches!(
            budget.take(b"k", &policy, 1, i * 150 * MS),
            Take::Exact
        ));
    }
    // Ten checks in one period: the next period grants ten.
    for _ in 0..10 {
        assert!(matches!(budget.take(b"busy", &policy, 1, 0), Take::Exact));
    }
    let Take::Grant(want) = budget.take(b"busy", &policy, 1, 100 * MS) else {
        panic!("a busy subject should grant");
    };
    assert_eq!(want.permits, 10);
    // While the grant is in flight, checks are exact.
    assert!(matches!(
        budget.take(b"busy", &policy, 1, 100 * MS),
        Take::Exact
    ));
    // Redis' state held 100 ms (100 permits) then: remaining 900 before
    // the share, 899 after the asking check.
    answered(
        &budget,
        "busy",
        want,
        (want.permits, 100 * MS),
        true,
        100 * MS,
    );
    for admitted in 2..=10 {
        let Take::Local(verdict) = budget.take(b"busy", &policy, 1, 101 * MS) else {
            panic!("the share should admit");
        };
        assert!(verdict.is_allowed());
        assert_eq!(verdict.binding().remaining(), 900 - admitted);
    }
    // Spent: the next check grants again (or goes exact).
    assert!(!matches!(
        budget.take(b"busy", &policy, 1, 102 * MS),
        Take::Local(_)
    ));
}

#[test]
fn a_grant_ends_one_period_after_it_was_sent() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    for _ in 0..20 {
        budget.take(b"k", &policy, 1, 0);
    }
    let Take::Grant(want) = budget.take(b"k", &policy, 1, 100 * MS) else {
        panic!("a busy subject should grant");
    };
    // Sent at 100 ms, answered at 150 ms: spendable until 200 ms.
    budget.grant_ended(
        b"k",
        want,
        1,
        Some(Share {
            slots: want.permits,
            lead: 0,
        }),
        true,
        (100 * MS, 150 * MS),
    );
    assert!(matches!(
        budget.take(b"k", &policy, 1, 199 * MS),
        Take::Local(_)
    ));
    assert!(!matches!(
        budget.take(b"k", &policy, 1, 200 * MS),
        Take::Local(_)
    ));
}

#[test]
fn a_denial_is_held_until_redis_could_admit_the_cost() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = Policy::per_second(100)
        .burst(10)
        .name("api")
        .build()
        .unwrap();
    for _ in 0..20 {
        budget.take(b"k", &policy, 2, 0);
    }
    let Take::Grant(want) = budget.take(b"k", &policy, 2, 100 * MS) else {
        panic!("a busy subject should grant");
    };
    // No slot fit this cost (the state 95 ms ahead, capacity 100 ms,
    // interval 10 ms): a cost of 2 fits Redis 15 ms after the call, a
    // cost of 1 after 5 ms.
    budget.grant_ended(
        b"k",
        want,
        2,
        Some(Share {
            slots: 0,
            lead: 95 * MS,
        }),
        false,
        (100 * MS, 100 * MS),
    );
    let Take::Local(verdict) = budget.take(b"k", &policy, 2, 110 * MS) else {
        panic!("the denial should be held here");
    };
    assert!(!verdict.is_allowed());
    assert_eq!(verdict.retry_after(), Some(Duration::from_millis(5)));
    assert!(matches!(budget.take(b"k", &policy, 1, 104 * MS), Take::Local(v) if !v.is_allowed()));
    // A cost of 1 may fit by 105 ms: asked of Redis. While that call is
    // in flight, the subject at its limit is denied here.
    assert!(matches!(
        budget.take(b"k", &policy, 1, 105 * MS),
        Take::Grant(_)
    ));
    assert!(matches!(budget.take(b"k", &policy, 2, 115 * MS), Take::Local(v) if !v.is_allowed()));
}

/// Under a flood (the state at its capacity), a share's slots are
/// dispensed one interval apart, each no earlier than the exact GCRA would
/// admit it; checks between them are denied here, with the time to the
/// next slot; when the share is spent, checks are denied until Redis could
/// admit one; and while the next grant call is in flight, too.
#[test]
fn a_rate_share_is_dispensed_on_the_gcra_schedule() {
    let budget = Budget::new(
        LocalBudget::new()
            .max_permits(64)
            .grant_period(Duration::from_millis(100)),
    );
    // 1 000 per second, burst 50: interval 1 ms, capacity 50 ms.
    let policy = Policy::per_second(1_000)
        .burst(50)
        .name("api")
        .build()
        .unwrap();
    let t = 100 * MS;
    // The state at its capacity: slot j is due at t + j ms. 64 slots.
    let Take::Grant(want) = ({
        for _ in 0..200 {
            budget.take(b"flood", &policy, 1, 0);
        }
        budget.take(b"flood", &policy, 1, t)
    }) else {
        panic!("a flooding subject should grant");
    };
    assert_eq!(
        want.permits, 64,
        "max_permits, below the demand and the rate"
    );
    answered(&budget, "flood", want, (64, 50 * MS), false, t);
    let mut admitted = 0;
    for tick in 0..(70 * 4) {
        // Four checks every quarter of a millisecond.
        let now = t + tick * 250;
        for _ in 0..4 {
            match budget.take(b"flood", &policy, 1, now) {
                Take::Local(verdict) if verdict.is_allowed() => {
                    admitted += 1;
                    // Slot `admitted` is due at t + admitted ms.
                    assert!(
                        now >= t + admitted * MS,
                        "slot {admitted} admitted at {now}"
                    );
                }
                Take::Local(verdict) => {
                    let retry = verdict.retry_after().expect("a denial says when");
                    assert!(retry > Duration::ZERO);
                    if admitted < 64 {
                        // The next slot's time, exactly.
                        let next = t + (admitted + 1) * MS;
                        assert_eq!(now + u64::try_from(retry.as_micros()).unwrap(), next);
                    }
                }
                Take::Grant(_) => {
                    // Spent: Redis could admit the next slot at t + 65 ms.
                    assert_eq!(admitted, 64);
                    assert!(now >= t + 65 * MS, "asked Redis at {now}");
                    // While the call is in flight, answered here.
                    assert!(matches!(
                        budget.take(b"flood", &policy, 1, now),
                        Take::Local(v) if !v.is_allowed()
                    ));
                    return;
                }
                Take::Exact => panic!("a flood should never go to Redis alone"),
            }
        }
    }
    panic!("the spent share should have asked for the next one");
}

/// A share of none (the other instances hold the horizon) holds the
/// denial for the rest of the grant period, then asks again.
#[test]
fn a_share_of_none_holds_the_denial_for_the_grant_period() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = Policy::per_second(1_000)
        .burst(50)
        .name("api")
        .build()
        .unwrap();
    let want = busy(&budget, "k", &policy);
    // 50 ms of capacity and the whole 100 ms horizon reserved.
    answered(&budget, "k", want, (0, 150 * MS), false, 100 * MS);
    assert!(matches!(budget.take(b"k", &policy, 1, 199 * MS), Take::Local(v) if !v.is_allowed()));
    assert!(matches!(
        budget.take(b"k", &policy, 1, 200 * MS),
        Take::Grant(_)
    ));
}

#[test]
fn a_full_table_checks_new_subjects_exactly() {
    let budget = Budget::new(LocalBudget::new().max_subjects(SHARDS));
    let policy = policy();
    let exact = (0..1_000)
        .filter(|i| {
            matches!(
                budget.take(format!("s{i}").as_bytes(), &policy, 1, 0),
                Take::Exact
            )
        })
        .count();
    assert_eq!(exact, 1_000);
    let held: usize = budget
        .shards
        .iter()
        .map(|s| s.lock().unwrap().slots.len())
        .sum();
    assert!(held <= SHARDS, "{held} subjects held, at most {SHARDS}");
}

#[test]
fn subjects_seen_once_are_forgotten_after_two_grant_periods() {
    // A large population's quiet subjects, one new subject every 100 µs
    // for 10 s (100 grant periods of 100 ms): the table keeps about the
    // last two periods' (2 000), not its bound of 65 536.
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    let mut most = 0;
    for i in 0..100_000_u64 {
        let taken = budget.take(format!("s{i}").as_bytes(), &policy, 1, i * 100);
        assert!(
            matches!(taken, Take::Exact),
            "a subject seen once is never granted"
        );
        if i % 1_000 == 0 {
            let held: usize = budget
                .shards
                .iter()
                .map(|s| s.lock().unwrap().slots.len())
                .sum();
            most = most.max(held);
        }
    }
    // Each shard sweeps at most two periods late: up to four periods'
    // subjects (4 000) are held at a time.
    assert!(most <= 4_000, "{most} subjects held");
    assert!(
        most >= 2_000,
        "{most} subjects held: the last two periods' are kept"
    );
}

/// `key` of `policy`, busy at 0, asking for a grant at 100 ms.
fn busy(budget: &Budget, key: &str, policy: &Policy) -> Ask {
    for _ in 0..20 {
        budget.take(key.as_bytes(), policy, 1, 0);
    }
    let Take::Grant(want) = budget.take(key.as_bytes(), policy, 1, 100 * MS) else {
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
        assert!(matches!(budget.take(b"k", &daily, 1, 0), Take::Exact));
    }
    let Take::Grant(want) = budget.take(b"k", &daily, 1, 3_600_000 * MS) else {
        panic!("a busy subject should grant");
    };
    assert_eq!(want.permits, 417);
    // Less than two permits per grant period: never granted.
    let slow = Policy::per_minute(6).name("api").build().unwrap();
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_secs(1)));
    for i in 0..100 {
        assert!(matches!(
            budget.take(b"k", &slow, 1, i * 100 * MS),
            Take::Exact
        ));
    }
}

#[test]
fn a_denial_is_held_no_longer_than_a_grant_period() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    let want = busy(&budget, "k", &policy);
    // A state far ahead (a lowered plan): Redis could admit in 10 s.
    answered(&budget, "k", want, (0, 10_000 * MS), false, 100 * MS);
    assert!(budget.local(b"k", &policy, 1, 199 * MS).is_some());
    assert!(budget.local(b"k", &policy, 1, 200 * MS).is_none());
}

#[test]
fn a_reset_drops_the_share_the_denial_and_the_call_in_flight() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    let want = busy(&budget, "a", &policy);
    answered(&budget, "a", want, (want.permits, 0), true, 100 * MS);
    assert!(budget.local(b"a", &policy, 1, 100 * MS).is_some());
    budget.forget(b"a");
    assert!(budget.local(b"a", &policy, 1, 100 * MS).is_none());

    // Denied (the state full): held, until the reset.
    let want = busy(&budget, "b", &policy);
    answered(&budget, "b", want, (0, 1_050 * MS), false, 100 * MS);
    assert!(budget.local(b"b", &policy, 1, 100 * MS).is_some());
    budget.forget(b"b");
    assert!(budget.local(b"b", &policy, 1, 100 * MS).is_none());

    // Sent before the reset, answered after it: ignored, and the next
    // check may grant again.
    let want = busy(&budget, "c", &policy);
    budget.forget(b"c");
    answered(&budget, "c", want, (0, 1_050 * MS), false, 100 * MS);
    assert!(budget.local(b"c", &policy, 1, 100 * MS).is_none());
    assert!(matches!(
        budget.take(b"c", &policy, 1, 100 * MS),
        Take::Grant(_)
    ));

    // A flood's grant in flight answers here, until the reset.
    let want = busy(&budget, "d", &policy);
    answered(&budget, "d", want, (1, 1_000 * MS), false, 100 * MS);
    assert!(budget.local(b"d", &policy, 1, 100 * MS).is_some());
    assert!(matches!(budget.take(b"d", &policy, 1, 101 * MS), Take::Local(v) if v.is_allowed()));
    assert!(matches!(
        budget.take(b"d", &policy, 1, 102 * MS),
        Take::Grant(_)
    ));
    assert!(budget.local(b"d", &policy, 1, 102 * MS).is_some());
    budget.forget(b"d");
    assert!(budget.local(b"d", &policy, 1, 102 * MS).is_none());
}

#[test]
fn other_numbers_never_get_an_answer_taken_under_the_old_ones() {
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let policy = policy();
    let raised = Policy::per_second(100_000).name("api").build().unwrap();
    let want = busy(&budget, "k", &policy);
    answered(&budget, "k", want, (0, 1_050 * MS), false, 100 * MS);
    assert!(budget.local(b"k", &policy, 1, 100 * MS).is_some());
    assert!(budget.local(b"k", &raised, 1, 100 * MS).is_none());
    // The raised plan's first check asks Redis, and drops the denial:
    // the old plan asks Redis too.
    assert!(!matches!(
        budget.take(b"k", &raised, 1, 100 * MS),
        Take::Local(_)
    ));
    assert!(budget.local(b"k", &policy, 1, 100 * MS).is_none());

    // A share asked under the old numbers, answered after the change:
    // ignored.
    let budget = Budget::new(LocalBudget::new().grant_period(Duration::from_millis(100)));
    let want = busy(&budget, "k", &policy);
    assert!(!matches!(
        budget.take(b"k", &raised, 1, 100 * MS),
        Take::Local(_)
    ));
    answered(&budget, "k", want, (want.permits, 0), true, 100 * MS);
    assert!(budget.local(b"k", &raised, 1, 100 * MS).is_none());
    assert!(budget.local(b"k", &policy, 1, 100 * MS).is_none());
}
