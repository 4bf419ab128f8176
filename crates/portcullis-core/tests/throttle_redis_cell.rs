//! `algorithms::throttle` against redis-cell 0.5's `CL.THROTTLE`: a table of
//! known replies (redis-cell's README and the replies a real redis-cell
//! 0.5.0 gives, quoted in issue 11), and random sequences against a model of
//! redis-cell written here from its published algorithm, independently of
//! portcullis's arithmetic.
//!
//! redis-cell 0.5's model, in exact rational time (it keeps nanoseconds;
//! every time below is a whole millisecond, where the two agree):
//!
//! - emission interval `T = period / count`, tolerance `τ = (max_burst + 1)·T`,
//!   increment `quantity·T`; the key holds the theoretical arrival time
//!   `tat` (absent: now).
//! - `new_tat = max(tat, now) + increment`; limited when
//!   `new_tat − τ > now`, with `retry_after = new_tat − τ − now` (-1 when the
//!   increment alone passes τ: `quantity > max_burst + 1`) and
//!   `reset_after = max(tat, now) − now`; else `new_tat` is stored and
//!   `reset_after = new_tat − now`.
//! - `remaining = floor((τ − reset_after) / T)`.
//! - Seconds in the reply: the whole seconds, plus one when at least a whole
//!   millisecond remains; -1 stays -1.

use portcullis_core::algorithms::{throttle, GcraState};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000_000;

/// A key as `throttle` keeps it.
#[derive(Debug, Default, Clone)]
struct Portcullis(Option<GcraState>);

impl Portcullis {
    fn call(&mut self, now: u64, max_burst: u64, count: u64, period: u64, qty: u64) -> [i64; 5] {
        let (reply, state) =
            throttle(self.0.as_ref(), now, max_burst, count, period, qty).expect("valid arguments");
        if let Some(state) = state {
            self.0 = Some(state);
        }
        reply.to_array()
    }
}

/// The model: times in units of `1 / count` microsecond, so that `T` is the
/// whole number `period · 10^6`.
#[derive(Debug, Default, Clone)]
struct Cell {
    tat: Option<i128>,
}

fn cell_secs(units: i128, count: i128) -> i64 {
    // Units of 1/count µs, in whole microseconds rounded up: redis-cell
    // keeps nanoseconds, and a remainder under a microsecond never reaches
    // the millisecond test below at whole-millisecond times.
    let us = (units + count - 1) / count;
    let secs = us / 1_000_000;
    let sub_ms = (us % 1_000_000) / 1_000;
    (secs + i128::from(sub_ms >= 1)) as i64
}

impl Cell {
    fn call(&mut self, now: u64, max_burst: u64, count: u64, period: u64, qty: u64) -> [i64; 5] {
        let count = i128::from(count);
        let t = i128::from(period) * 1_000_000;
        let tau = (i128::from(max_burst) + 1) * t;
        let now = i128::from(now) * count;
        let increment = i128::from(qty) * t;
        let base = self.tat.unwrap_or(now).max(now);
        let new_tat = base + increment;
        let allow_at = new_tat - tau;
        let (limited, retry, reset) = if allow_at > now {
            let retry = if increment > tau {
                -1
            } else {
                cell_secs(allow_at - now, count)
            };
            (1, retry, base - now)
        } else {
            if qty > 0 {
                self.tat = Some(new_tat);
            }
            (0, -1, new_tat - now)
        };
        // A quantity above the burst can never pass: redis-cell answers it
        // limited with the key's figures, which its peek would give.
        let (limited, reset) = if increment > tau {
            (1, base - now)
        } else {
            (limited, reset)
        };
        let remaining = ((tau - reset) / t).max(0);
        [
            limited,
            (max_burst + 1) as i64,
            remaining as i64,
            retry,
            cell_secs(reset, count),
        ]
    }
}

include!("common/cl_throttle_known.rs");

#[test]
fn known_cl_throttle_replies() {
    let mut keys: std::collections::HashMap<&str, (Portcullis, Cell)> = Default::default();
    for (i, &(key, max_burst, count, period, qty, at_ms, expected)) in KNOWN.iter().enumerate() {
        let now = T0 + at_ms * 1_000;
        let (portcullis, cell) = keys.entry(key).or_default();
        assert_eq!(
            portcullis.call(now, max_burst, count, period, qty),
            expected,
            "row {i}: portcullis"
        );
        assert_eq!(
            cell.call(now, max_burst, count, period, qty),
            expected,
            "row {i}: the model"
        );
    }
}

#[test]
fn a_remainder_under_a_millisecond_is_dropped() {
    // 1 per second, burst 1: after one request the key is full for 1 s.
    let mut key = Portcullis::default();
    key.call(T0, 0, 1, 1, 1);
    // 999.5 ms left: 0 whole seconds + 999 ms ≥ 1 ms → 1.
    assert_eq!(key.call(T0 + 500, 0, 1, 1, 1), [1, 1, 0, 1, 1]);
    // 0.5 ms left: under a millisecond, dropped → 0.
    assert_eq!(key.call(T0 + 999_500, 0, 1, 1, 1), [1, 1, 0, 0, 0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random sequences in whole milliseconds, against the model.
    #[test]
    fn random_sequences_match_the_model(
        max_burst in 0u64..=20,
        count in 1u64..=120,
        period in 1u64..=120,
        calls in prop::collection::vec((0u64..=5_000, 0u64..=23), 1..40),
    ) {
        let mut portcullis = Portcullis::default();
        let mut cell = Cell::default();
        let mut now = T0;
        for (i, (step_ms, qty)) in calls.into_iter().enumerate() {
            now += step_ms * 1_000;
            let a = portcullis.call(now, max_burst, count, period, qty);
            let b = cell.call(now, max_burst, count, period, qty);
            prop_assert_eq!(a, b, "call {} at +{} µs, quantity {}", i, now - T0, qty);
        }
    }
}
