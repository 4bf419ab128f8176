//! Token bucket and leaky bucket (meter and queue) through the public API:
//! burst, idle refill, exact fractional refill, queue delays.

use std::time::Duration;

use portcullis_core::{Algorithm, LeakyMode, Policy};

mod common;
use common::Key;

const T0: u64 = 1_700_000_000_000_000;
const SECOND: u64 = 1_000_000;
const MS: u64 = 1_000;

fn policy(algorithm: Algorithm, limit: u64, period: Duration, burst: u64) -> Policy {
    Policy::per(limit, period)
        .algorithm(algorithm)
        .burst(burst)
        .build()
        .unwrap()
}

const BUCKETS: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyBucket(LeakyMode::Meter),
    Algorithm::LeakyBucket(LeakyMode::Queue),
];

/// A small deterministic generator for step sizes (xorshift64).
struct Steps(u64);

impl Steps {
    fn next_in(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        low + self.0 % (high - low + 1)
    }
}

#[test]
fn fractional_refill_is_never_lost() {
    // 3 per second: one permit every 333 333⅓ µs, burst 3. Drain the bucket,
    // then walk time forward in steps of 1 µs to 333 334 µs, taking every
    // permit as soon as it is there. However the steps fall, the total
    // admitted by `elapsed` is exactly B + floor(elapsed · 3 / 1 s): no
    // fraction of a permit is ever lost or invented. (Steps of at most
    // 333 334 µs never let the bucket fill up, which would cap the refill.)
    for algorithm in BUCKETS {
        let policy = policy(algorithm, 3, Duration::from_secs(1), 3);
        let mut key = Key::default();
        let mut admitted = 0u64;
        let mut take_all = |key: &mut Key, now: u64| {
            while key.check(&policy, now, 1).decision.is_allowed() {
                admitted += 1;
            }
            admitted
        };
        assert_eq!(take_all(&mut key, T0), 3, "{algorithm}");
        let mut steps = Steps(0x9E37_79B9_7F4A_7C15);
        let mut now = T0;
        for i in 0..5_000 {
            let step = match i % 7 {
                0 => 1,
                1 => 333_334,
                2 => 333_333,
                _ => steps.next_in(1, 333_334),
            };
            now += step;
            let elapsed = now - T0;
            assert_eq!(
                take_all(&mut key, now),
                3 + elapsed * 3 / SECOND,
                "{algorithm} after {elapsed} µs"
            );
        }
    }
}

#[test]
fn token_bucket_burst_then_idle_refill() {
    // 2 per second, burst 4.
    let policy = policy(Algorithm::TokenBucket, 2, Duration::from_secs(1), 4);
    let mut key = Key::default();
    let first = key.check(&policy, T0, 4);
    assert!(first.decision.is_allowed(), "cost = capacity on a new key");
    assert_eq!(first.decision.remaining(), 0);
    assert_eq!(first.decision.reset_after(), Duration::from_secs(2));
    assert_eq!(first.expires_at_us, T0 + 2 * SECOND);
    let denied = key.check(&policy, T0, 1).decision;
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(500)));
    // 750 ms idle: 1.5 tokens. One passes, the half token is kept.
    let peek = key.check(&policy, T0 + 750 * MS, 0).decision;
    assert_eq!((peek.is_allowed(), peek.remaining()), (true, 1));
    assert_eq!(peek.reset_after(), Duration::from_millis(1_250));
    let d = key.check(&policy, T0 + 750 * MS, 1).decision;
    assert_eq!((d.is_allowed(), d.remaining()), (true, 0));
    let d = key.check(&policy, T0 + 750 * MS, 1).decision;
    assert_eq!(d.retry_after(), Some(Duration::from_millis(250)));
    assert!(!key.check(&policy, T0 + 999_999, 1).decision.is_allowed());
    assert!(key.check(&policy, T0 + SECOND, 1).decision.is_allowed());
    // A long idle spell fills the bucket to 4, never above.
    let d = key.check(&policy, T0 + 3_600 * SECOND, 0).decision;
    assert_eq!(d.remaining(), 4);
    assert_eq!(d.reset_after(), Duration::ZERO);
    let d = key.check(&policy, T0 + 3_600 * SECOND, 4).decision;
    assert!(d.is_allowed());
    assert!(!key
        .check(&policy, T0 + 3_600 * SECOND, 1)
        .decision
        .is_allowed());
}

#[test]
fn leaky_meter_sequence() {
    // Holds 3, drains 1 per 2 seconds.
    let policy = policy(
        Algorithm::LeakyBucket(LeakyMode::Meter),
        1,
        Duration::from_secs(2),
        3,
    );
    let mut key = Key::default();
    let d = key.check(&policy, T0, 2).decision;
    assert_eq!((d.is_allowed(), d.remaining()), (true, 1));
    assert_eq!(d.reset_after(), Duration::from_secs(4));
    let d = key.check(&policy, T0 + SECOND, 2).decision;
    // 1.5 permits of water left, 2 more would make 3.5 > 3: half a permit
    // must drain first, 1 s.
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(d.remaining(), 1);
    assert_eq!(d.reset_after(), Duration::from_secs(3));
    let d = key.check(&policy, T0 + 2 * SECOND, 2).decision;
    assert_eq!((d.is_allowed(), d.remaining()), (true, 0));
    assert_eq!(d.reset_after(), Duration::from_secs(6));
}

#[test]
fn leaky_queue_delays_then_rejects() {
    // Burst 3, 1 per second: delays 0, 1 s, 2 s, then the queue is full.
    let policy = policy(
        Algorithm::LeakyBucket(LeakyMode::Queue),
        1,
        Duration::from_secs(1),
        3,
    );
    let mut key = Key::default();
    for (i, delay_secs) in [0u64, 1, 2].into_iter().enumerate() {
        let step = key.check(&policy, T0, 1);
        assert!(step.decision.is_allowed(), "request {i}");
        assert_eq!(
            step.decision.delay(),
            Duration::from_secs(delay_secs),
            "request {i}"
        );
        assert_eq!(
            step.decision.reset_after(),
            Duration::from_secs(delay_secs + 1)
        );
    }
    let full = key.check(&policy, T0, 1);
    assert!(!full.decision.is_allowed());
    assert_eq!(full.new_state, None);
    assert_eq!(full.decision.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(full.decision.delay(), Duration::ZERO);
    // Half a second on, half a slot is free: wait another 500 ms.
    let d = key.check(&policy, T0 + 500 * MS, 1).decision;
    assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
    // A peek with room reports the delay a request would get.
    let peek = key.check(&policy, T0 + SECOND, 0);
    assert!(peek.decision.is_allowed());
    assert_eq!(peek.decision.delay(), Duration::from_secs(2));
    assert_eq!(peek.new_state, None);
    let d = key.check(&policy, T0 + SECOND, 1).decision;
    assert!(d.is_allowed());
    assert_eq!(d.delay(), Duration::from_secs(2));
    // Once the queue has drained, no delay.
    let d = key.check(&policy, T0 + 10 * SECOND, 1).decision;
    assert_eq!(d.delay(), Duration::ZERO);
}

#[test]
fn leaky_queue_cost_counts_as_several_requests() {
    // 10 per second, queue of 10: a cost-4 request takes 400 ms of the
    // queue; the next one waits for it.
    let policy = policy(
        Algorithm::LeakyBucket(LeakyMode::Queue),
        10,
        Duration::from_secs(1),
        10,
    );
    let mut key = Key::default();
    let d = key.check(&policy, T0, 4).decision;
    assert_eq!((d.delay(), d.remaining()), (Duration::ZERO, 6));
    let d = key.check(&policy, T0 + 100 * MS, 6).decision;
    // 300 ms of the first request are still queued ahead of it; 9 of the
    // 10 places are taken.
    assert_eq!(
        (d.is_allowed(), d.delay(), d.remaining()),
        (true, Duration::from_millis(300), 1)
    );
    let d = key.check(&policy, T0 + 100 * MS, 2).decision;
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
}
