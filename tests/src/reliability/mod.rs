//! Fault, abuse and soak scenarios against real Redis servers, shared by the
//! `reliability_*` / `security_*` tests (small runs with assertions) and the
//! `reliability` binary (larger runs printed as a table, `cargo xtask
//! reliability`).
//!
//! Every scenario returns a [`Row`]: what was done, requests tried,
//! failures by kind, wrong decisions (must be 0), time to recover. A
//! "wrong decision" is an answer that contradicts the ground truth a
//! scenario has: more permits admitted for a subject than its policy allows
//! (or a denial before the limit was reached), an answer the configured
//! failure policy does not allow (a 503 under fail-open, an undecided pass
//! under fail-closed), a status nobody chose, or a request that hung.

mod abuse;
mod cluster;
mod counting;
mod http;
mod load;
mod report;
mod sentinel;
mod standalone;

pub use abuse::{
    fill_past_maxmemory, hot_subject, ipv6_rotation, key_flood, make_room, spoofed_forwarded_for,
    HotPhase, HotReport, HotSubject,
};
pub use cluster::{
    cluster_failover, crc16_slot, master_with_replica, slot_migration, subjects_in_slot,
    ClusterAdmin, ClusterNode, ClusterReport, Failover, FailoverHow, OwnedCluster, SlotMigration,
};
pub use counting::{CallRecord, CountingStore, FailureKind, Outcome, StoreStats};
pub use http::{http_client, serve_http};
pub use load::{
    classify, gcra_allowance, judge_admission, judge_calls, no_hang, percentile, probe_service,
    request_for, send, start_layer_load, start_store_load, subject_key, Admission, Load, Reply,
    ReplyCounts, ReplyRecord, Running, StoreCall, SUBJECT_HEADER,
};
pub use report::{ms, table, Row};
pub use sentinel::{sentinel_failover, SentinelFault, SentinelReport};
pub use standalone::{
    kill_restart, pool_exhaustion, slow_redis, FailureMode, KillRestart, KillRestartReport,
    PoolReport, SlowRedis, SlowReport, Slowdown,
};

use redis::aio::MultiplexedConnection;

/// An admin connection to `url` (for `INFO`, `CLIENT PAUSE`, `CLUSTER ...`).
///
/// # Panics
///
/// When the server cannot be reached.
pub async fn admin(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"));
    client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// Runs `args` as one command on `connection`.
///
/// # Errors
///
/// The server's error.
pub async fn command<T: redis::FromRedisValue>(
    connection: &mut MultiplexedConnection,
    args: &[&str],
) -> redis::RedisResult<T> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(connection).await
}

/// The value of `field` in an `INFO` text (`field:value` lines).
#[must_use]
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':').map(str::trim))
}

/// `calls=` of `cmdstat_<command>` in an `INFO commandstats` text (0 when
/// the command never ran). `command` is lower case, e.g. `evalsha` or
/// `script|load`.
#[must_use]
pub fn command_calls(info: &str, command: &str) -> u64 {
    info_field(info, &format!("cmdstat_{command}"))
        .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `INFO <section>` of the server at `url`.
///
/// # Panics
///
/// When the server cannot be reached.
pub async fn info(url: &str, section: &str) -> String {
    let mut connection = admin(url).await;
    command(&mut connection, &["INFO", section])
        .await
        .unwrap_or_else(|e| panic!("INFO {section} on {url} failed: {e}"))
}

/// A small deterministic pseudo-random generator (xorshift64*), so the
/// scenarios need no extra dependency and repeat run to run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_parsing() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=3,usec_per_call=0.25\r\ncmdstat_script|load:calls=2,usec=1\r\nused_memory:1024\r\n";
        assert_eq!(command_calls(info, "evalsha"), 12);
        assert_eq!(command_calls(info, "script|load"), 2);
        assert_eq!(command_calls(info, "get"), 0);
        assert_eq!(info_field(info, "used_memory"), Some("1024"));
    }
}
