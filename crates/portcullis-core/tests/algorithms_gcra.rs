//! GCRA through the public API, and `throttle` against redis-cell's
//! `CL.THROTTLE`: its README example and its own test table, with every
//! expected number derived from the algorithm's definition.

use std::time::Duration;

use portcullis_core::algorithms::{self, throttle, GcraState, State, ThrottleReply};
use portcullis_core::{Algorithm, Policy};

mod common;
use common::Key;

/// 2023-11-14T22:13:20Z, a whole second.
const T0: u64 = 1_700_000_000_000_000;
const SECOND: u64 = 1_000_000;

/// Microseconds as redis-cell 0.5 reports them in seconds: the whole
/// seconds, plus one when at least a whole millisecond remains.
fn cell_secs(us: u64) -> i64 {
    (us / SECOND + u64::from(us % SECOND >= 1_000)) as i64
}

/// One `CL.THROTTLE` call on a key kept between calls.
#[derive(Debug, Default)]
struct CellKey(Option<GcraState>);

impl CellKey {
    fn throttle(
        &mut self,
        now: u64,
        max_burst: u64,
        count: u64,
        period: u64,
        qty: u64,
    ) -> ThrottleReply {
        let (reply, state) = throttle(self.0.as_ref(), now, max_burst, count, period, qty).unwrap();
        if let Some(state) = state {
            self.0 = Some(state);
        }
        reply
    }
}

#[test]
fn readme_example_and_its_first_denial() {
    // CL.THROTTLE user123 15 30 60 1 → [0, 16, 15, -1, 2].
    let mut key = CellKey::default();
    assert_eq!(
        key.throttle(T0, 15, 30, 60, 1).to_array(),
        [0, 16, 15, -1, 2]
    );

    // In GCRA terms: L = 30, P = 60 s, B = 16, emission interval P/L = 2 s.
    let (limit, period, burst) = (30u64, 60 * SECOND, 16u64);
    let interval = period / limit;
    // k admissions at one instant put the TAT k intervals ahead:
    // remaining = B − k, reset_after = k intervals.
    for k in 2..=16 {
        let reply = key.throttle(T0, 15, 30, 60, 1);
        let reset_secs = cell_secs(k * interval);
        assert_eq!(
            reply.to_array(),
            [0, 16, (burst - k) as i64, -1, reset_secs],
            "request {k}"
        );
    }
    // The 17th would put the TAT 17 intervals ahead, one more than B allows:
    // retry_after = ceil((17·P − 16·P) / L) = one interval = 2 s,
    // reset_after = ceil(16·P / L) = 32 s, nothing remains.
    let reply = key.throttle(T0, 15, 30, 60, 1);
    let retry_us = (17 * period - burst * period).div_ceil(limit);
    let reset_us = (16 * period).div_ceil(limit);
    assert_eq!(retry_us, 2 * SECOND);
    assert_eq!(reset_us, 32 * SECOND);
    assert_eq!(
        reply,
        ThrottleReply {
            limited: true,
            limit: 16,
            remaining: 0,
            retry_after_secs: cell_secs(retry_us),
            reset_after_secs: cell_secs(reset_us),
        }
    );
    // A limited request wrote nothing: the same answer a microsecond later
    // with the retry shortened by that microsecond (1.999999 s, reported
    // as 2 s since at least a millisecond remains).
    let reply = key.throttle(T0 + 1, 15, 30, 60, 1);
    assert_eq!(reply.to_array(), [1, 16, 0, 2, 32]);
    // Less than a millisecond past a whole second is dropped: a retry of
    // 1.0009 s and a reset of 31.0009 s.
    let reply = key.throttle(T0 + retry_us - SECOND - 900, 15, 30, 60, 1);
    assert_eq!(reply.to_array(), [1, 16, 0, 1, 31]);
    // And exactly one interval later one request passes again.
    assert_eq!(
        key.throttle(T0 + retry_us - 1, 15, 30, 60, 1).to_array()[0],
        1
    );
    assert_eq!(
        key.throttle(T0 + retry_us, 15, 30, 60, 1).to_array(),
        [0, 16, 0, -1, 32]
    );
}

/// One row of redis-cell's `it_rate_limits` table (max_burst 4, 1 per
/// second, so B = 5 and one emission interval is 1 s), with the exact
/// microsecond values portcullis's `check` returns.
struct Row {
    at_ms: u64,
    quantity: u64,
    limited: bool,
    remaining: u64,
    /// `None`: redis-cell's -1.
    retry_after_us: Option<u64>,
    reset_after_us: u64,
}

const fn row(
    at_ms: u64,
    quantity: u64,
    limited: bool,
    remaining: u64,
    retry: Option<u64>,
    reset: u64,
) -> Row {
    Row {
        at_ms,
        quantity,
        limited,
        remaining,
        retry_after_us: retry,
        reset_after_us: reset,
    }
}

/// The table, derived from the definition (`span` is `(TAT − now)·L` after
/// the request, B·P = 5 s; remaining = (B·P − span) div P, reset_after =
/// span / L):
///
/// - 0: quantity 6 > B on a new key: limited, can never pass (-1); the key
///   is full: remaining 5, reset 0.
/// - 1–5 at 0 s: TAT 1 s … 5 s ahead: remaining 4 … 0, reset 1 s … 5 s.
/// - 6 at 0 s: would be 6 s ahead > 5 s: limited, retry 6 − 5 = 1 s,
///   remaining 0, reset 5 s (the TAT written by request 5).
/// - 7 at 3.0 s: TAT 5 s → 6 s, 3 s ahead: remaining 2, reset 3 s.
/// - 8 at 3.1 s: TAT 7 s, 3.9 s ahead: remaining 1, reset 3.9 s.
/// - 9 at 4.0 s: TAT 8 s, 4 s ahead: remaining 1, reset 4 s.
/// - 10 at 8.0 s: TAT reached; 9 s, 1 s ahead: remaining 4, reset 1 s.
/// - 11 at 9.5 s: TAT passed; 10.5 s: remaining 4, reset 1 s.
/// - 12 peek at 9.5 s: nothing written: remaining 4, reset 1 s.
/// - 13 quantity 2 at 9.5 s: TAT 12.5 s, 3 s ahead: remaining 2, reset 3 s.
/// - 14 quantity 5 at 9.5 s: 8 s ahead > 5 s: limited, retry 3 s,
///   remaining 2, reset 3 s.
const TABLE: [Row; 15] = [
    row(0, 6, true, 5, None, 0),
    row(0, 1, false, 4, None, SECOND),
    row(0, 1, false, 3, None, 2 * SECOND),
    row(0, 1, false, 2, None, 3 * SECOND),
    row(0, 1, false, 1, None, 4 * SECOND),
    row(0, 1, false, 0, None, 5 * SECOND),
    row(0, 1, true, 0, Some(SECOND), 5 * SECOND),
    row(3_000, 1, false, 2, None, 3 * SECOND),
    row(3_100, 1, false, 1, None, 3_900_000),
    row(4_000, 1, false, 1, None, 4 * SECOND),
    row(8_000, 1, false, 4, None, SECOND),
    row(9_500, 1, false, 4, None, SECOND),
    row(9_500, 0, false, 4, None, SECOND),
    row(9_500, 2, false, 2, None, 3 * SECOND),
    row(9_500, 5, true, 2, Some(3 * SECOND), 3 * SECOND),
];

#[test]
fn redis_cell_test_table_through_throttle() {
    let mut key = CellKey::default();
    for (i, row) in TABLE.iter().enumerate() {
        let now = T0 + row.at_ms * 1_000;
        let reply = key.throttle(now, 4, 1, 1, row.quantity);
        let expected = [
            i64::from(row.limited),
            5,
            row.remaining as i64,
            row.retry_after_us.map_or(-1, cell_secs),
            cell_secs(row.reset_after_us),
        ];
        assert_eq!(reply.to_array(), expected, "case {i}");
    }
}

#[test]
fn redis_cell_test_table_through_check_in_microseconds() {
    // The same table as a portcullis policy: 1 per second, burst 5.
    let policy = Policy::per_second(1).burst(5).build().unwrap();
    let mut key = Key::default();
    for (i, row) in TABLE.iter().enumerate() {
        let now = T0 + row.at_ms * 1_000;
        let step = key.check(&policy, now, row.quantity);
        let d = step.decision;
        assert_eq!(d.limit(), 5, "case {i}");
        // A peek of a key that has room is "allowed" in portcullis too.
        assert_eq!(d.is_allowed(), !row.limited, "case {i}");
        assert_eq!(d.remaining(), row.remaining, "case {i}");
        assert_eq!(
            d.reset_after(),
            Duration::from_micros(row.reset_after_us),
            "case {i}"
        );
        let retry = match row.retry_after_us {
            Some(us) => Some(Duration::from_micros(us)),
            None if row.limited => Some(Duration::MAX),
            None => None,
        };
        assert_eq!(d.retry_after(), retry, "case {i}");
        assert_eq!(step.expires_at_us, now + row.reset_after_us, "case {i}");
        assert_eq!(
            step.new_state.is_some(),
            !row.limited && row.quantity > 0,
            "case {i}"
        );
    }
}

#[test]
fn throttle_peek_is_never_limited_and_writes_nothing() {
    let mut key = CellKey::default();
    for _ in 0..2 {
        key.throttle(T0, 1, 1, 10, 1);
    }
    let before = key.0;
    // Full: a cost-1 request is limited, a peek is not (redis-cell), and
    // neither writes.
    assert_eq!(key.throttle(T0, 1, 1, 10, 1).to_array(), [1, 2, 0, 10, 20]);
    let (reply, state) = throttle(before.as_ref(), T0, 1, 1, 10, 0).unwrap();
    assert_eq!(reply.to_array(), [0, 2, 0, -1, 20]);
    assert_eq!(state, None);
    assert_eq!(key.0, before);
}

#[test]
fn sub_second_intervals_compare_exactly_as_redis_cell_0_5_does() {
    // 10 per second, max_burst 0: one request every 100 ms. redis-cell 0.5
    // compares exactly (0.3 compared in whole seconds and admitted early):
    // `CL.THROTTLE b 0 10 1 1` twice answers [1, 1, 0, 1, 1].
    let mut key = CellKey::default();
    assert_eq!(key.throttle(T0, 0, 10, 1, 1).to_array(), [0, 1, 0, -1, 1]);
    let policy = Policy::per_second(10).burst(1).build().unwrap();
    let state = key.0.map(State::Gcra);
    let step = algorithms::check(&policy, state.as_ref(), T0, 1);
    assert_eq!(
        step.decision.retry_after(),
        Some(Duration::from_millis(100))
    );
    // 100 ms is reported as 1 s: at least a millisecond remains.
    assert_eq!(key.throttle(T0, 0, 10, 1, 1).to_array(), [1, 1, 0, 1, 1]);
}

#[test]
fn gcra_sequence_with_burst_and_smooth_rate() {
    // 5 per second (200 ms apart), burst 2.
    let policy = Policy::per_second(5)
        .burst(2)
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let mut key = Key::default();
    let ms = |m: u64| T0 + m * 1_000;
    let expected: [(u64, bool, u64); 8] = [
        // (at ms, allowed, remaining)
        (0, true, 1),
        (0, true, 0),
        (0, false, 0),
        (199, false, 0),
        (200, true, 0),
        (400, true, 0),
        (1_000, true, 1),
        (1_000, true, 0),
    ];
    for (i, (at, allowed, remaining)) in expected.into_iter().enumerate() {
        let d = key.check(&policy, ms(at), 1).decision;
        assert_eq!(
            (d.is_allowed(), d.remaining()),
            (allowed, remaining),
            "request {i} at {at} ms"
        );
    }
    // At 1000 ms the TAT is 1400 ms, B = 2 intervals ahead: the next
    // request waits one interval (200 ms); the key is full after 400 ms.
    let mut probe = Key(key.0.clone());
    let d = probe.check(&policy, ms(1_000), 1).decision;
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
    assert_eq!(d.reset_after(), Duration::from_millis(400));
}
