//! Helpers shared by the `redis_*` tests (a module, not a test target).
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, ManualClock, SystemClock};
use tollgate_redis::{ClockMode, RedisStore};

/// Generous per-call timeout: tests share two cores with builds and other
/// tests, and a timeout would make counts uncertain.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A manual clock one day ahead of the wall clock: keys written on it
/// expire (PEXPIREAT on its times) no earlier than Redis' clock says they
/// may, so a test never sees Redis forget state the memory store keeps.
pub(crate) fn manual_clock() -> ManualClock {
    ManualClock::new(SystemClock.now_micros() + 86_400_000_000)
}

/// A store on the standalone test server.
pub(crate) async fn standalone(prefix: &str, clock: ClockMode) -> RedisStore {
    RedisStore::builder()
        .url(tollgate_tests::redis_url())
        .prefix(prefix)
        .timeout(TEST_TIMEOUT)
        .clock(clock)
        .build()
        .await
        .expect("the store should build")
}

/// A store on the test Cluster.
pub(crate) async fn cluster(prefix: &str, clock: ClockMode) -> RedisStore {
    RedisStore::builder()
        .cluster(tollgate_tests::cluster_urls())
        .prefix(prefix)
        .timeout(TEST_TIMEOUT)
        .clock(clock)
        .build()
        .await
        .expect("the store should build")
}

/// A client clock mode on `clock`.
pub(crate) fn client(clock: &ManualClock) -> ClockMode {
    ClockMode::Client(Arc::new(clock.clone()))
}

/// A plain synchronous connection to `url`, for inspecting keys.
pub(crate) fn raw(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .unwrap_or_else(|e| panic!("could not connect to {url}: {e}"))
}

/// Every key matching `pattern` on the server at `url`, with its PTTL.
pub(crate) fn scan_ttls(url: &str, pattern: &str) -> Vec<(String, i64)> {
    let mut connection = raw(url);
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(&mut connection)
            .expect("SCAN should work");
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.into_iter()
        .map(|key| {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query(&mut connection)
                .expect("PTTL should work");
            (key, ttl)
        })
        .collect()
}
