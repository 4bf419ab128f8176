//! Helpers shared by the `redis_*` tests (a module, not a test target).
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{Algorithm, Clock, ManualClock, Policy, SystemClock};
use portcullis_redis::{CallPath, ClockMode, RedisStore};

/// Generous per-call timeout: tests share two cores with builds and other
/// tests, and a timeout would make counts uncertain.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A manual clock one day ahead of the wall clock: keys written on it
/// expire (PEXPIREAT on its times) no earlier than Redis' clock says they
/// may, so a test never sees Redis forget state the memory store keeps.
pub(crate) fn manual_clock() -> ManualClock {
    ManualClock::new(SystemClock.now_micros() + 86_400_000_000)
}

/// Whether the tests run on the `EVALSHA` path (`PORTCULLIS_REDIS_CALL_PATH=evalsha`):
/// the stores then connect as [`EVALSHA_USER`], an ACL user without
/// `FCALL`, `FCALL_RO` and `FUNCTION`, so they fall back at their first
/// check. Otherwise they take the default Redis Functions path.
pub(crate) fn evalsha_path() -> bool {
    std::env::var("PORTCULLIS_REDIS_CALL_PATH").is_ok_and(|path| path == "evalsha")
}

/// The ACL user of the `EVALSHA` path (on the throwaway test servers).
pub(crate) const EVALSHA_USER: &str = "portcullis-test-evalsha";

/// Creates (or resets) `user` on the server at `url`, allowed everything
/// but Redis Functions, and returns `url` logged in as that user.
pub(crate) fn without_functions(url: &str, user: &str) -> String {
    let mut connection = raw(url);
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(">no-functions")
        .arg("~*")
        .arg("&*")
        .arg("+@all");
    // A server without Functions (Redis 6.2) knows no such commands: the
    // user is on EVALSHA there anyway.
    if portcullis_tests::server_has_functions() {
        setuser.arg("-fcall").arg("-fcall_ro").arg("-function");
    }
    let () = setuser
        .query(&mut connection)
        .unwrap_or_else(|e| panic!("ACL SETUSER {user} on {url}: {e}"));
    url.replacen("redis://", &format!("redis://{user}:no-functions@"), 1)
}

/// The URL a test store uses for `url`: as is, or as [`EVALSHA_USER`] on
/// the `EVALSHA` path.
pub(crate) fn path_url(url: String) -> String {
    if evalsha_path() {
        without_functions(&url, EVALSHA_USER)
    } else {
        url
    }
}

/// A store on the standalone test server.
pub(crate) async fn standalone(prefix: &str, clock: ClockMode) -> RedisStore {
    let store = RedisStore::builder()
        .url(path_url(portcullis_tests::redis_url()))
        .prefix(prefix)
        .timeout(TEST_TIMEOUT)
        .clock(clock)
        // The tests' manual clock runs a day ahead on purpose.
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .expect("the store should build");
    on_the_chosen_path(store)
}

/// A store on the test Cluster.
pub(crate) async fn cluster(prefix: &str, clock: ClockMode) -> RedisStore {
    let store = RedisStore::builder()
        .cluster(
            portcullis_tests::cluster_urls()
                .into_iter()
                .map(path_url)
                .collect::<Vec<_>>(),
        )
        .prefix(prefix)
        .timeout(TEST_TIMEOUT)
        .clock(clock)
        // The tests' manual clock runs a day ahead on purpose.
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .expect("the store should build");
    on_the_chosen_path(store)
}

/// `store`, after checking that `build()` put it on the path this run
/// tests (`PORTCULLIS_REDIS_CALL_PATH`), so a suite never passes on the
/// other path by mistake.
fn on_the_chosen_path(store: RedisStore) -> RedisStore {
    let expected = if evalsha_path() || !portcullis_tests::server_has_functions() {
        CallPath::Evalsha
    } else {
        CallPath::Functions
    };
    assert_eq!(store.call_path(), expected, "{store:?}");
    store
}

/// One policy of every algorithm, 1 000 per hour each, named `p0`, `p1`, …
pub(crate) fn every_algorithm() -> Vec<Policy> {
    Algorithm::ALL
        .iter()
        .enumerate()
        .map(|(i, algorithm)| {
            Policy::per(1_000, Duration::from_secs(3600))
                .algorithm(*algorithm)
                .name(format!("p{i}"))
                .build()
                .unwrap()
        })
        .collect()
}

/// A client clock mode on `clock`.
pub(crate) fn client(clock: &ManualClock) -> ClockMode {
    ClockMode::Client(Arc::new(clock.clone()))
}

/// `cmdstat_fcall`'s call count on the server of `connection` (`INFO
/// commandstats`: server-wide, so a test reading it runs its steps in
/// turn).
pub(crate) fn fcalls(connection: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(connection)
        .expect("INFO commandstats");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// `EVALSHA` calls the server at `connection` has run so far, and how many
/// of them failed (a `NOSCRIPT` before the script is loaded among them).
pub(crate) fn evalshas(connection: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(connection)
        .expect("INFO commandstats");
    let line = info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .unwrap_or_default();
    let field = |name: &str| {
        line.split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("failed_calls"))
}

/// `start()` (which makes checks) while the server at `connection` holds
/// every write (`CLIENT PAUSE WRITE`; checks are writes), unpaused as soon
/// as it returns. The calls the checks start reach the server but none is
/// answered before every check is made, so how checks made at once fall
/// into calls does not depend on the thread making them keeping its core:
/// on a loaded machine a call could otherwise end while the checks were
/// still being made, and the rest go as two batches instead of one. The
/// pause's own 10 s only bounds a test that panics inside `start`.
pub(crate) fn with_writes_held<T>(
    connection: &mut redis::Connection,
    start: impl FnOnce() -> T,
) -> T {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(10_000)
        .arg("WRITE")
        .query(connection)
        .expect("CLIENT PAUSE");
    let started = start();
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(connection)
        .expect("CLIENT UNPAUSE");
    started
}

/// A plain synchronous connection to `url`, for inspecting keys.
pub(crate) fn raw(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .unwrap_or_else(|e| panic!("could not connect to {url}: {e}"))
}

/// A `MONITOR` connection to the server at `url` (no password: the
/// tests' own servers), its lines read with a 10 s timeout.
pub(crate) fn monitor(url: &str) -> std::io::BufReader<std::net::TcpStream> {
    use std::io::Write as _;
    let address = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let stream = std::net::TcpStream::connect(&address)
        .unwrap_or_else(|e| panic!("could not connect to {address}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    (&stream).write_all(b"MONITOR\r\n").expect("MONITOR sent");
    std::io::BufReader::new(stream)
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

/// `PEXPIRETIME key` (ms since the epoch; -1 without a TTL, -2 without the
/// key). Redis 6.2 has no `PEXPIRETIME`: there a script reads `TIME`, then
/// `PTTL`, then `TIME` again, and the sum is taken once both times fall in
/// the same millisecond (so it is exact, as `PEXPIRETIME` is).
pub(crate) fn pexpiretime(
    connection: &mut redis::Connection,
    key: &str,
) -> redis::RedisResult<i64> {
    if portcullis_tests::server_has_functions() {
        return redis::cmd("PEXPIRETIME").arg(key).query(connection);
    }
    const SCRIPT: &str = "local a = redis.call('TIME') \
        local pttl = redis.call('PTTL', KEYS[1]) \
        local b = redis.call('TIME') \
        local a_ms = a[1] * 1000 + math.floor(a[2] / 1000) \
        local b_ms = b[1] * 1000 + math.floor(b[2] / 1000) \
        if a_ms ~= b_ms then return false end \
        if pttl < 0 then return pttl end \
        return a_ms + pttl";
    loop {
        let at: Option<i64> = redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(1)
            .arg(key)
            .query(connection)?;
        if let Some(at) = at {
            return Ok(at);
        }
    }
}

/// A Redis of its own with `noeviction`, and a store on it for each call
/// path (Functions, then `EVALSHA` as a user without Functions), for the
/// tests of what a full Redis still does. Fill it with
/// `portcullis_tests::reliability::fill_past_maxmemory`, and give the
/// room back with [`lift_maxmemory`] before the server is dropped.
pub(crate) async fn full_redis_stores(
    prefix: &str,
) -> (portcullis_tests::OwnedRedis, RedisStore, RedisStore) {
    let server = portcullis_tests::OwnedRedis::start(&["--maxmemory-policy", "noeviction"]);
    let build = |url: String| async move {
        RedisStore::builder()
            .url(url)
            .prefix(portcullis_tests::unique_prefix(prefix))
            .timeout(TEST_TIMEOUT)
            .build()
            .await
            .unwrap()
    };
    let functions = build(server.url()).await;
    let evalsha = build(without_functions(&server.url(), "no-fn")).await;
    assert_eq!(functions.call_path(), CallPath::Functions);
    assert_eq!(evalsha.call_path(), CallPath::Evalsha);
    (server, functions, evalsha)
}

/// Lifts the `maxmemory` that `fill_past_maxmemory` set on `server`.
pub(crate) fn lift_maxmemory(server: &portcullis_tests::OwnedRedis) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut raw(&server.url()))
        .unwrap();
}
