// The redis-cell replies both `throttle_redis_cell` (portcullis-core's
// `algorithms::throttle`) and the tests crate's `redis_compat`
// (`RedisStore::throttle`) must give; `include!`d by both so the two can
// never disagree on what redis-cell answers.

/// Known `CL.THROTTLE` replies (redis-cell's README and a real redis-cell
/// 0.5.0, quoted in issue 11), each row a call on the named key in order:
/// (key, max_burst, count, period, quantity, ms after the start, reply).
type Row = (&'static str, u64, u64, u64, u64, u64, [i64; 5]);

const KNOWN: &[Row] = &[
    // Issue 11, against a real redis-cell 0.5.0: a fresh key; 60 per second
    // leaves 16.7 ms to reset, reported as 1 s.
    ("a", 3, 60, 1, 1, 0, [0, 4, 3, -1, 1]),
    // redis-cell's README: `CL.THROTTLE user123 15 30 60 1` on a fresh key.
    ("c", 15, 30, 60, 1, 0, [0, 16, 15, -1, 2]),
    // Issue 11: the second call answers a reset of 4 s.
    ("c", 15, 30, 60, 1, 0, [0, 16, 14, -1, 4]),
    // Issue 11: sub-second intervals compare exactly; 100 ms reports 1 s.
    ("b", 0, 10, 1, 1, 0, [0, 1, 0, -1, 1]),
    ("b", 0, 10, 1, 1, 0, [1, 1, 0, 1, 1]),
    // 100 ms later the next passes.
    ("b", 0, 10, 1, 1, 100, [0, 1, 0, -1, 1]),
    // A peek never is limited and changes nothing.
    ("b", 0, 10, 1, 0, 150, [0, 1, 0, -1, 1]),
    // A quantity above the burst can never pass: -1.
    ("b", 0, 10, 1, 2, 150, [1, 1, 0, -1, 1]),
    // 1 per second, burst 5, 0.5 s after 5 at once: retry 0.5 s → 1, reset
    // 4.5 s → 5.
    ("d", 4, 1, 1, 5, 0, [0, 5, 0, -1, 5]),
    ("d", 4, 1, 1, 1, 500, [1, 5, 0, 1, 5]),
    // 1.999 s later: retry 1 ms → 1; exactly on time it passes.
    ("d", 4, 1, 1, 1, 999, [1, 5, 0, 1, 5]),
    ("d", 4, 1, 1, 1, 1_000, [0, 5, 0, -1, 5]),
];
