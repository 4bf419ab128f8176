//! Support code for the cross-crate tests in `tests/tests/`.
//!
//! Redis tests run against real `redis-server` processes that
//! `cargo xtask test` starts on free ports and announces through environment
//! variables. When a variable is missing the tests fail loudly: they never
//! skip.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Every key the Redis tests write starts with this (the TTL test scans it).
pub const TEST_PREFIX: &str = "pc-test";

/// A key prefix no other call in this process, nor any other process, uses:
/// `pc-test-<what>-<pid>-<nanos>-<n>`, so runs sharing a server never share
/// state.
#[must_use]
pub fn unique_prefix(what: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    format!(
        "{TEST_PREFIX}-{what}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// URL of the standalone server (`PORTCULLIS_REDIS_URL`), e.g. `redis://127.0.0.1:6390`.
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn redis_url() -> String {
    required_env("PORTCULLIS_REDIS_URL")
}

/// URLs of the Cluster's masters (`PORTCULLIS_REDIS_CLUSTER_URLS`, comma separated).
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn cluster_urls() -> Vec<String> {
    required_env("PORTCULLIS_REDIS_CLUSTER_URLS")
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// Path of the `redis-server` binary (`PORTCULLIS_REDIS_SERVER`, else `redis-server` on PATH).
#[must_use]
pub fn redis_server_bin() -> PathBuf {
    std::env::var_os("PORTCULLIS_REDIS_SERVER")
        .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

/// The version of the test `redis-server` binary ([`redis_server_bin`]) as
/// `(major, minor)`, from its `--version` line (`v=7.0.15`; Valkey prints
/// its own version, and Valkey 7.2 and later have what Redis 7.2 has).
///
/// # Panics
///
/// When the binary does not run or prints no version.
#[must_use]
pub fn server_version() -> (u32, u32) {
    static VERSION: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        let bin = redis_server_bin();
        let output = Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("could not run {} --version: {e}", bin.display()));
        let text = String::from_utf8_lossy(&output.stdout);
        parse_server_version(&text)
            .unwrap_or_else(|| panic!("no version in `{} --version`: {text}", bin.display()))
    })
}

fn parse_server_version(text: &str) -> Option<(u32, u32)> {
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The arguments that let a test server run `DEBUG` (`--enable-debug-command
/// yes` on Redis 7 and later; Redis 6.2 allows it without).
#[must_use]
pub fn debug_command_args() -> &'static [&'static str] {
    if server_version().0 >= 7 {
        &["--enable-debug-command", "yes"]
    } else {
        &[]
    }
}

/// Whether the test server has Redis Functions and `allow-oom` scripts
/// (Redis 7 and later, every Valkey): on Redis 6.2 stores run on `EVALSHA`
/// and a full server refuses every subject.
#[must_use]
pub fn server_has_functions() -> bool {
    server_version().0 >= 7
}

fn required_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => value,
        _ => panic!(
            "{name} is not set: Redis tests need the servers that `cargo xtask test` starts \
             (it runs `redis-server` from PATH on free ports); run `cargo xtask test`, \
             or `cargo xtask redis` in another terminal and export the variables it prints"
        ),
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
///
/// # Panics
///
/// When the OS has no free port.
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("the OS should hand out a free port on 127.0.0.1")
}

/// A free port on 127.0.0.1 whose Cluster bus port (+10000) is free too,
/// for servers before Redis 7, which have no `cluster-port` setting.
///
/// # Panics
///
/// When no such port is found in 1000 tries.
#[must_use]
pub fn free_port_with_bus() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = u64::from(std::process::id()) * 7919;
    for attempt in 0..1000 {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed) * 37 + attempt) % 25_000;
        let port = 20_000 + u16::try_from(offset).unwrap_or(0);
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port with a free bus port (+10000) on 127.0.0.1");
}

/// A private `redis-server` a test may kill and restart (for fault tests).
/// Killed when dropped.
#[derive(Debug)]
pub struct OwnedRedis {
    port: u16,
    child: Option<Child>,
    extra_args: Vec<String>,
}

impl OwnedRedis {
    /// Starts `redis-server` on a free port with persistence off.
    ///
    /// A free port can be taken by another process (another test's
    /// outgoing connection) between the moment it is picked and the moment
    /// the server binds it; a server that exits at start is then started
    /// again on another port, up to five times.
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be started or does not accept connections
    /// within 10 seconds.
    #[must_use]
    pub fn start(extra_args: &[&str]) -> Self {
        Self::start_anywhere(|| (free_port(), Vec::new()), extra_args)
    }

    /// Starts `redis-server` on a port from `pick` (with arguments of its
    /// own, such as a Cluster bus port), picking again when a server exits
    /// at start (its port taken meanwhile), up to five times.
    ///
    /// # Panics
    ///
    /// As [`OwnedRedis::start`].
    pub fn start_anywhere(
        mut pick: impl FnMut() -> (u16, Vec<String>),
        extra_args: &[&str],
    ) -> Self {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let (port, own) = pick();
            let mut args: Vec<&str> = extra_args.to_vec();
            args.extend(own.iter().map(String::as_str));
            match Self::try_start_on(port, &args) {
                Ok(server) => return server,
                Err(error) => failures.push(error),
            }
        }
        panic!("redis-server did not start on five ports: {failures:#?}");
    }

    /// Starts `redis-server` on `port` with persistence off.
    ///
    /// # Panics
    ///
    /// As [`OwnedRedis::start`], and when the server exits at start (for
    /// instance because `port` is taken).
    #[must_use]
    pub fn start_on(port: u16, extra_args: &[&str]) -> Self {
        Self::try_start_on(port, extra_args).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Starts `redis-server` on `port`, or says why it exited at start.
    ///
    /// # Errors
    ///
    /// When the server exits before it accepts connections.
    ///
    /// # Panics
    ///
    /// As [`OwnedRedis::start`].
    pub fn try_start_on(port: u16, extra_args: &[&str]) -> Result<Self, String> {
        let mut server = Self {
            port,
            child: None,
            extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.spawn()?;
        Ok(server)
    }

    /// The server's URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (killing it first if running).
    ///
    /// # Panics
    ///
    /// As [`OwnedRedis::start_on`].
    pub fn restart(&mut self) {
        if let Err(error) = self.spawn() {
            panic!("{error}");
        }
    }

    /// Kills the server if running and starts it on its port; an error when
    /// it exits before it accepts connections, with the end of its log.
    fn spawn(&mut self) -> Result<(), String> {
        self.kill();
        let bin = redis_server_bin();
        // The server's log (what it says when it cannot bind, say), read
        // back only when it exits at start.
        let log_path = std::env::temp_dir().join(format!(
            "portcullis-redis-{}-{}.log",
            std::process::id(),
            self.port
        ));
        let log = std::fs::File::create(&log_path).map_or_else(|_| Stdio::null(), Stdio::from);
        let child = Command::new(&bin)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(&self.extra_args)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "could not start {}: {e}; install redis-server (apt-get install redis-server)",
                    bin.display()
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = self.child.as_ref().map_or(0, Child::id);
        // Ours once it answers on the port with its own process id (another
        // process's server on a port taken since it was picked answers
        // with another; one that asks for a password, or does not say,
        // counts as ours).
        while serves(self.port, pid) != Some(true) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                let said = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = said.lines().rev().take(3).collect();
                return Err(format!(
                    "redis-server on port {} exited at start ({status}): {}",
                    self.port,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ));
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(&log_path);
        Ok(())
    }
}

/// Whether the server on `port` is process `pid`: `None` when nothing
/// accepts there, `Some(true)` when its `INFO server` names `pid` or it
/// does not say (a password asked, no answer within a second).
fn serves(port: u16, pid: u32) -> Option<bool> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream
        .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
        .is_err()
    {
        return Some(true);
    }
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while reply.len() < 64 * 1024 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
        let text = String::from_utf8_lossy(&reply);
        if let Some(rest) = text.split("process_id:").nth(1)
            && let Some((id, _)) = rest.split_once('\r')
        {
            return Some(id.trim() == pid.to_string());
        }
        if text.starts_with('-') {
            break;
        }
    }
    Some(true)
}

impl Drop for OwnedRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `--name value` pairs of a helper binary's arguments (`hammer`,
/// `latency`, `budget_worker`, `scale`, the workers of [`worker_main`]), names without their dashes.
///
/// # Errors
///
/// A message naming the first argument that is not in such a pair.
pub fn option_pairs(
    program: &str,
    args: &[String],
) -> Result<std::collections::HashMap<String, String>, String> {
    let mut options = std::collections::HashMap::new();
    for pair in args.chunks(2) {
        match pair {
            [key, value] if key.starts_with("--") => {
                options.insert(key.trim_start_matches("--").to_owned(), value.clone());
            }
            _ => {
                return Err(format!(
                    "{program}: arguments come in `--name value` pairs, got {pair:?}"
                ))
            }
        }
    }
    Ok(options)
}

/// The `main` of a worker binary started by a multi-process test
/// (`lease_worker`, `reservation_worker`): `<mode> --name value ...`, run
/// on a multi-thread Tokio runtime; a bad argument, a runtime that cannot
/// start or an error of `run` is printed as `<program>: <message>` and
/// exits with 2.
pub fn worker_main<F, Fut>(program: &str, run: F) -> std::process::ExitCode
where
    F: FnOnce(String, std::collections::HashMap<String, String>) -> Fut,
    Fut: std::future::Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>,
{
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    let options = match option_pairs(program, &rest) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{program}: no Tokio runtime: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    match runtime.block_on(run(mode, options)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error}");
            std::process::ExitCode::from(2)
        }
    }
}

pub mod cpu;
pub mod reliability;
mod sentinel;

pub use sentinel::{OwnedSentinelSet, OWNED_SENTINEL_MASTER};

/// URL of the TLS server whose client certificates are optional
/// (`PORTCULLIS_REDIS_TLS_URL`, `rediss://portcullis:<password>@127.0.0.1:<port>`,
/// the ACL user). Trust [`tls_ca`].
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn tls_url() -> String {
    required_env("PORTCULLIS_REDIS_TLS_URL")
}

/// URL of the TLS server that requires a client certificate
/// (`PORTCULLIS_REDIS_MTLS_URL`, the ACL user); see [`tls_client_cert`].
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn mtls_url() -> String {
    required_env("PORTCULLIS_REDIS_MTLS_URL")
}

/// The test CA (PEM) that signed the TLS servers' and the client's
/// certificates (the file named by `PORTCULLIS_REDIS_TLS_CA`).
///
/// # Panics
///
/// When the variable is not set or the file cannot be read.
#[must_use]
pub fn tls_ca() -> Vec<u8> {
    read_env_file("PORTCULLIS_REDIS_TLS_CA")
}

/// The client certificate and key (PEM) for mutual TLS
/// (`PORTCULLIS_REDIS_TLS_CLIENT_CERT`, `PORTCULLIS_REDIS_TLS_CLIENT_KEY`).
///
/// # Panics
///
/// When a variable is not set or a file cannot be read.
#[must_use]
pub fn tls_client_cert() -> (Vec<u8>, Vec<u8>) {
    (
        read_env_file("PORTCULLIS_REDIS_TLS_CLIENT_CERT"),
        read_env_file("PORTCULLIS_REDIS_TLS_CLIENT_KEY"),
    )
}

/// Plain-TCP URL of the TLS server as the ACL user
/// (`PORTCULLIS_REDIS_ACL_URL`): the same server and user as [`tls_url`],
/// without TLS.
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn acl_url() -> String {
    required_env("PORTCULLIS_REDIS_ACL_URL")
}

/// Password-only URL of the ACL server's `default` user
/// (`PORTCULLIS_REDIS_ACL_ADMIN_URL`, `redis://:<password>@…`), allowed
/// everything: tests create users with it.
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn acl_admin_url() -> String {
    required_env("PORTCULLIS_REDIS_ACL_ADMIN_URL")
}

/// TLS URLs of the masters of the TLS Cluster `cargo xtask test` starts
/// (`PORTCULLIS_REDIS_TLS_CLUSTER_URLS`, comma separated,
/// `rediss://:<password>@127.0.0.1:<tls port>`); trust [`tls_ca`]. The
/// nodes have the same users as the TLS servers.
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn tls_cluster_urls() -> Vec<String> {
    required_env("PORTCULLIS_REDIS_TLS_CLUSTER_URLS")
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// URLs of the Sentinels `cargo xtask test` starts
/// (`PORTCULLIS_REDIS_SENTINEL_URLS`, comma separated).
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn sentinel_urls() -> Vec<String> {
    required_env("PORTCULLIS_REDIS_SENTINEL_URLS")
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// `rediss://` URLs of the TLS Sentinels `cargo xtask test` starts
/// (`PORTCULLIS_REDIS_TLS_SENTINEL_URLS`, comma separated): a primary, a
/// replica and three Sentinels speaking TLS to clients and to each other,
/// monitoring [`sentinel_master`]; trust [`tls_ca`].
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn tls_sentinel_urls() -> Vec<String> {
    required_env("PORTCULLIS_REDIS_TLS_SENTINEL_URLS")
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// The master name those Sentinels monitor (`PORTCULLIS_REDIS_SENTINEL_MASTER`).
///
/// # Panics
///
/// When the variable is not set: run the tests with `cargo xtask test`.
#[must_use]
pub fn sentinel_master() -> String {
    required_env("PORTCULLIS_REDIS_SENTINEL_MASTER")
}

fn read_env_file(name: &str) -> Vec<u8> {
    let path = required_env(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{name}={path}: cannot read it: {e}"))
}

/// The priority-class tests' policy (`tests/redis_options.rs` and the
/// `priority_worker` binary): 10 per hour, named `api`, with the classes
/// `critical` (may spend all of it), `interactive` (while 20 % remains)
/// and `batch` (while 50 % remains).
///
/// # Panics
///
/// Never: the policy is valid.
#[must_use]
pub fn priority_policy() -> portcullis_core::Policy {
    portcullis_core::Policy::per_hour(10)
        .name("api")
        .class("critical", 0)
        .class("interactive", 20)
        .class("batch", 50)
        .build()
        .expect("the priority policy is valid")
}

#[cfg(test)]
mod tests {
    use super::parse_server_version;
    use crate::{free_port, OwnedRedis};

    #[test]
    fn server_versions_are_read_from_redis_and_valkey_lines() {
        assert_eq!(
            parse_server_version("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0"),
            Some((7, 0))
        );
        assert_eq!(
            parse_server_version("Valkey server v=8.0.1 sha=00000000:1 malloc=libc bits=64"),
            Some((8, 0))
        );
        assert_eq!(
            parse_server_version("Redis server v=6.2.16 sha=00000000:0"),
            Some((6, 2))
        );
        assert_eq!(parse_server_version("no version here"), None);
    }

    /// A server that cannot bind its port (here: one already serving it)
    /// is reported as exited at start, with what it logged, rather than
    /// waited for until the start timeout; `start_anywhere` then takes
    /// another port.
    #[test]
    fn a_server_that_cannot_bind_is_reported_and_another_port_taken() {
        let first = OwnedRedis::start(&[]);
        let error = OwnedRedis::try_start_on(first.port(), &[])
            .expect_err("the port is taken, so the second server must exit");
        assert!(error.contains("exited at start"), "{error}");
        let mut picks = vec![free_port(), first.port()];
        let second = OwnedRedis::start_anywhere(|| (picks.pop().unwrap_or(0), Vec::new()), &[]);
        assert_ne!(second.port(), first.port());
    }
}
