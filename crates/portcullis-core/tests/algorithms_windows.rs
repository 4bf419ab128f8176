//! Fixed window, sliding window counter and sliding log through the public
//! API, with explicit timestamps and expected values computed by hand.

use std::time::Duration;

use portcullis_core::algorithms::{SlidingLogState, State};
use portcullis_core::{Algorithm, Policy};

mod common;
use common::Key;

const SECOND: u64 = 1_000_000;
/// A multiple of one day: 2023-11-15T00:00:00Z.
const DAY0: u64 = 1_700_006_400_000_000;
/// A multiple of one minute (DAY0 + 10 minutes).
const W0: u64 = DAY0 + 600 * SECOND;

fn policy(algorithm: Algorithm, limit: u64, period: Duration) -> Policy {
    Policy::per(limit, period)
        .algorithm(algorithm)
        .build()
        .unwrap()
}

#[test]
fn fixed_window_resets_exactly_at_the_aligned_end() {
    assert_eq!(W0 % (60 * SECOND), 0);
    let policy = policy(Algorithm::FixedWindow, 3, Duration::from_secs(60));
    let mut key = Key::default();
    // First hit 50 s into the window: the window still ends at W0 + 60 s,
    // not 60 s after the first hit.
    let first = key.check(&policy, W0 + 50 * SECOND, 2);
    assert!(first.decision.is_allowed());
    assert_eq!(first.decision.remaining(), 1);
    assert_eq!(first.decision.reset_after(), Duration::from_secs(10));
    assert_eq!(first.expires_at_us, W0 + 60 * SECOND);
    assert!(key
        .check(&policy, W0 + 55 * SECOND, 1)
        .decision
        .is_allowed());
    let denied = key.check(&policy, W0 + 60 * SECOND - 1, 1);
    assert!(!denied.decision.is_allowed());
    assert_eq!(
        denied.decision.retry_after(),
        Some(Duration::from_micros(1))
    );
    assert_eq!(denied.decision.remaining(), 0);
    assert_eq!(denied.expires_at_us, W0 + 60 * SECOND);
    // At the boundary the count starts from zero: a burst of 3 right after
    // the 3 at the end of the last window (the fixed window's known edge).
    let next = key.check(&policy, W0 + 60 * SECOND, 3);
    assert!(next.decision.is_allowed());
    assert_eq!(next.decision.remaining(), 0);
    assert_eq!(next.decision.reset_after(), Duration::from_secs(60));
    assert_eq!(next.expires_at_us, W0 + 120 * SECOND);
}

#[test]
fn fixed_window_steady_traffic_does_not_push_the_reset_back() {
    // The INCR + EXPIRE recipe renews the expiry on every hit; here each
    // window ends on its minute whatever the traffic.
    let policy = policy(Algorithm::FixedWindow, 6, Duration::from_secs(60));
    let mut key = Key::default();
    for i in 0..30u64 {
        let now = W0 + i * 10 * SECOND + 5 * SECOND;
        let step = key.check(&policy, now, 1);
        assert!(step.decision.is_allowed(), "hit {i}");
        // 6 hits per minute, at :05, :15, … :55.
        assert_eq!(step.decision.remaining(), 5 - i % 6, "hit {i}");
        let window_end = W0 + (i / 6 + 1) * 60 * SECOND;
        assert_eq!(step.expires_at_us, window_end, "hit {i}");
    }
}

#[test]
fn fixed_window_per_day_is_aligned_to_midnight_utc() {
    let policy = policy(Algorithm::FixedWindow, 2, Duration::from_secs(86_400));
    let mut key = Key::default();
    let evening = DAY0 + 23 * 3_600 * SECOND;
    assert!(key.check(&policy, evening, 2).decision.is_allowed());
    let d = key.check(&policy, evening, 1).decision;
    assert_eq!(d.retry_after(), Some(Duration::from_secs(3_600)));
    assert!(key
        .check(&policy, DAY0 + 86_400 * SECOND, 1)
        .decision
        .is_allowed());
}

#[test]
fn sliding_window_weights_the_previous_window() {
    // 100 per minute.
    let policy = policy(Algorithm::SlidingWindow, 100, Duration::from_secs(60));
    let mut key = Key::default();
    let d = key.check(&policy, W0 + 40 * SECOND, 84).decision;
    assert_eq!(d.remaining(), 16);
    // Full again when the 84 have left the previous-window slot: at the end
    // of the next window, W0 + 120 s.
    assert_eq!(d.reset_after(), Duration::from_secs(80));

    // 15 s into the next window the previous 84 weigh 84·45/60 = 63.
    let t1 = W0 + 75 * SECOND;
    let peek = key.check(&policy, t1, 0);
    assert_eq!(peek.decision.remaining(), 37);
    assert_eq!(peek.new_state, None);
    // The previous window alone keeps the key from full until its weight is
    // 0, at the end of this window.
    assert_eq!(peek.decision.reset_after(), Duration::from_secs(45));
    let d = key.check(&policy, t1, 30).decision;
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 7);
    assert_eq!(d.reset_after(), Duration::from_secs(105));
    // 63 + 30 + 8 > 100. Wait until 84·(60 − e)/60 + 38 ≤ 100, that is
    // e ≥ 60 − 62·60/84 = 15.714… s: the first whole microsecond is
    // 60 s − floor(62·60 000 000 / 84) µs = 15 714 286 µs.
    let d = key.check(&policy, t1, 8).decision;
    assert!(!d.is_allowed());
    assert_eq!(d.remaining(), 7);
    let e_min = 60 * SECOND - (62 * 60 * SECOND) / 84;
    assert_eq!(e_min, 15_714_286);
    assert_eq!(
        d.retry_after(),
        Some(Duration::from_micros(e_min - 15 * SECOND))
    );
    assert!(!key
        .check(&policy, W0 + 60 * SECOND + e_min - 1, 8)
        .decision
        .is_allowed());
    let d = key.check(&policy, W0 + 60 * SECOND + e_min, 8).decision;
    assert!(d.is_allowed());
    // 84·(60 − 15.714286)/60 = 61.99999… so 100 − 61.99999… − 38 = 0.00000…
    assert_eq!(d.remaining(), 0);

    // 30 s into the window: 84·30/60 = 42, plus 38 here: 20 remain.
    assert_eq!(
        key.check(&policy, W0 + 90 * SECOND, 0).decision.remaining(),
        20
    );
    // In the window after, the 38 become the previous window: at 30 s in
    // they weigh 19, so 81 remain; the 84 are gone.
    assert_eq!(
        key.check(&policy, W0 + 150 * SECOND, 0)
            .decision
            .remaining(),
        81
    );
    // Two windows later everything is gone.
    let peek = key.check(&policy, W0 + 180 * SECOND, 0).decision;
    assert_eq!(peek.remaining(), 100);
    assert_eq!(peek.reset_after(), Duration::ZERO);
}

#[test]
fn sliding_window_retry_when_this_window_is_already_full() {
    // 10 per 10 s; 9 taken 2 s into a window, then 5 more asked for: 9 + 5
    // > 10 in any part of this window. In the next one the 9 weigh
    // 9·(10 − e)/10 and 9·(10 − e)/10 + 5 ≤ 10 ⇔ e ≥ 10 − 50/9 s
    // = 4.444… s: 4 444 445 µs.
    let policy = policy(Algorithm::SlidingWindow, 10, Duration::from_secs(10));
    let mut key = Key::default();
    let start = W0 + 2 * SECOND;
    assert!(key.check(&policy, start, 9).decision.is_allowed());
    let d = key.check(&policy, start, 5).decision;
    let e_min = 10 * SECOND - (5 * 10 * SECOND) / 9;
    assert_eq!(e_min, 4_444_445);
    assert_eq!(
        d.retry_after(),
        Some(Duration::from_micros(8 * SECOND + e_min))
    );
    assert!(!key
        .check(&policy, W0 + 10 * SECOND + e_min - 1, 5)
        .decision
        .is_allowed());
    assert!(key
        .check(&policy, W0 + 10 * SECOND + e_min, 5)
        .decision
        .is_allowed());
}

#[test]
fn sliding_log_identical_timestamps_are_separate_entries() {
    let policy = policy(Algorithm::SlidingLog, 5, Duration::from_secs(60));
    let mut key = Key::default();
    let now = W0 + 123_456;
    for remaining in (0..5).rev() {
        let d = key.check(&policy, now, 1).decision;
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), remaining);
    }
    let Some(State::SlidingLog(SlidingLogState { entries })) = &key.0 else {
        panic!("the key has a log");
    };
    assert_eq!(entries.len(), 5);
    assert!(entries.iter().all(|&t| t == now));
    // Denials are not recorded, however many.
    for _ in 0..10 {
        let step = key.check(&policy, now + 1, 1);
        assert!(!step.decision.is_allowed());
        assert_eq!(step.new_state, None);
    }
    // All five leave together, exactly one period after they came.
    let d = key.check(&policy, now + 1, 1).decision;
    assert_eq!(
        d.retry_after(),
        Some(Duration::from_micros(60 * SECOND - 1))
    );
    assert!(!key
        .check(&policy, now + 60 * SECOND - 1, 5)
        .decision
        .is_allowed());
    assert!(key
        .check(&policy, now + 60 * SECOND, 5)
        .decision
        .is_allowed());
}

#[test]
fn sliding_log_retry_waits_for_enough_entries_to_leave() {
    let policy = policy(Algorithm::SlidingLog, 4, Duration::from_secs(10));
    let mut key = Key::default();
    for (at, cost) in [(0, 1), (2, 2), (5, 1)] {
        assert!(key
            .check(&policy, W0 + at * SECOND, cost)
            .decision
            .is_allowed());
    }
    // At 6 s: entries 0, 2, 2, 5. Cost 3 needs 3 to leave: the 3rd oldest
    // (at 2 s) leaves at 12 s, taking its twin with it.
    let d = key.check(&policy, W0 + 6 * SECOND, 3).decision;
    assert_eq!(d.retry_after(), Some(Duration::from_secs(6)));
    assert_eq!(d.reset_after(), Duration::from_secs(9));
    // Cost 1 needs only the oldest to leave, at 10 s.
    let d = key.check(&policy, W0 + 6 * SECOND, 1).decision;
    assert_eq!(d.retry_after(), Some(Duration::from_secs(4)));
    let d = key.check(&policy, W0 + 12 * SECOND, 3).decision;
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.reset_after(), Duration::from_secs(10));
}
