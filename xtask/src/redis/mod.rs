//! Local `redis-server` processes for tests and benches: a standalone
//! server ([`Standalone`]) and a Redis Cluster ([`Cluster`]), each on free
//! ports, each stopped (killed, its directory removed) when dropped.
//!
//! Every server runs under a tiny `sh` supervisor (see [`SUPERVISOR`]) that
//! holds the read end of a pipe whose write end only xtask has. However
//! xtask ends (normal return, panic, Ctrl-C, `kill -9`), the pipe closes and
//! the supervisor kills its server: no `redis-server` outlives xtask. The
//! supervisors run in their own process group, so a Ctrl-C in the terminal
//! reaches xtask and cargo but not them (they would die before killing
//! their server).

use std::collections::BTreeSet;
use std::fs;
use std::hash::BuildHasher;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Connection, Reply};
use crate::{Error, Result};

mod cluster;

pub(crate) use cluster::{info_field, slot_ranges, Cluster};

/// The number of hash slots of a Redis Cluster.
pub(crate) const CLUSTER_SLOTS: u32 = 16384;

/// Lowest port handed out for a server; ports are drawn from
/// `PORT_LOW..PORT_LOW + PORT_SPAN`, below Linux's ephemeral range.
const PORT_LOW: u16 = 20000;
/// Size of the port range servers are drawn from.
const PORT_SPAN: u16 = 10000;
/// Redis Cluster's bus port is the client port plus this offset; it must be
/// free as well.
const BUS_OFFSET: u16 = 10000;

/// How long a server may take to answer PING after it was spawned.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a Cluster may take to reach `cluster_state:ok` everywhere.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of every connect, read and write of the control connections.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a server is started on a new port when its port was
/// taken between the free-port check and the server's bind.
const PORT_ATTEMPTS: usize = 5;

/// The supervisor every `redis-server` runs under
/// (`sh -c SUPERVISOR sh <dir> <redis-server> <args>...`, stdin a pipe from
/// xtask).
///
/// It starts the server in the background, and a watcher that blocks
/// reading stdin: when the pipe closes (xtask dropped the server or
/// exited in any way) the watcher kills the server with SIGKILL. The
/// supervisor exits with the server's status, so xtask sees a server that
/// died on its own; when the server was killed (status 137) it also
/// removes the server's directory.
pub(crate) const SUPERVISOR: &str = r#"
dir=$1; shift
exec 3<&0 0</dev/null
"$@" 3<&- &
server=$!
( read -r _ <&3; kill -9 "$server" 2>/dev/null ) &
watcher=$!
exec 3<&-
wait "$server"
status=$?
kill "$watcher" 2>/dev/null
if [ "$status" -eq 137 ]; then rm -rf -- "$dir"; fi
exit "$status"
"#;

/// Ports handed out by [`pick_port`] in this process, so two servers
/// started back to back never get the same one.
static RESERVED_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The Redis binaries found on PATH, and `promtool` (which checks the
/// metrics export in the `metrics-dashboard` example's test).
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    /// Absolute path of `redis-server` (not canonicalized: on Debian it is
    /// a symlink to a multi-call binary that looks at its own name).
    pub(crate) server: PathBuf,
    /// `redis-cli`, if installed.
    pub(crate) cli: Option<PathBuf>,
    /// `redis-benchmark`, if installed.
    pub(crate) benchmark: Option<PathBuf>,
    /// `promtool` (Debian's `prometheus` package), if installed.
    pub(crate) promtool: Option<PathBuf>,
}

impl Tools {
    /// Finds the Redis binaries: the server named by `REDIS_SERVER` (any
    /// build: another Redis version, `valkey-server`), else `redis-server`
    /// on PATH; `redis-cli` (or `valkey-cli`) beside that server, else on
    /// PATH.
    ///
    /// # Errors
    ///
    /// When `REDIS_SERVER` names no executable, or no `redis-server` is on
    /// PATH: the Redis tests need a server, and they never skip.
    pub(crate) fn discover() -> Result<Self> {
        let server = match std::env::var_os("REDIS_SERVER").filter(|v| !v.is_empty()) {
            Some(named) => {
                let named = PathBuf::from(named);
                let found = if named.components().count() > 1 {
                    fs::metadata(&named)
                        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
                        .then(|| std::path::absolute(&named).ok())
                        .flatten()
                } else {
                    find_on_path(&named.to_string_lossy())
                };
                found.ok_or_else(|| {
                    Error::new(format!(
                        "REDIS_SERVER={} is not an executable file: set it to a redis-server or \
                         valkey-server binary, or unset it to use redis-server from PATH",
                        named.display()
                    ))
                })?
            }
            None => find_on_path("redis-server").ok_or_else(|| {
                Error::new(
                    "redis-server not found on PATH: install it (apt-get install redis-server), \
                     or set REDIS_SERVER to a server binary — the Redis tests need real servers",
                )
            })?,
        };
        let beside = |names: &[&str]| {
            let dir = server.parent()?;
            names
                .iter()
                .map(|name| dir.join(name))
                .find(|candidate| candidate.is_file())
        };
        Ok(Self {
            cli: beside(&["redis-cli", "valkey-cli"]).or_else(|| find_on_path("redis-cli")),
            benchmark: beside(&["redis-benchmark", "valkey-benchmark"])
                .or_else(|| find_on_path("redis-benchmark")),
            promtool: find_on_path("promtool"),
            server,
        })
    }

    /// The environment variables announcing these binaries to tests and
    /// benches (`PORTCULLIS_REDIS_SERVER`, `PORTCULLIS_REDIS_CLI`,
    /// `PORTCULLIS_REDIS_BENCHMARK`; the last two only when found).
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![("PORTCULLIS_REDIS_SERVER", display(&self.server))];
        if let Some(cli) = &self.cli {
            vars.push(("PORTCULLIS_REDIS_CLI", display(cli)));
        }
        if let Some(benchmark) = &self.benchmark {
            vars.push(("PORTCULLIS_REDIS_BENCHMARK", display(benchmark)));
        }
        if let Some(promtool) = &self.promtool {
            vars.push(("PORTCULLIS_PROMTOOL", display(promtool)));
        }
        vars
    }

    /// The first line of `redis-server --version`, for logs.
    pub(crate) fn server_version(&self) -> String {
        Command::new(&self.server)
            .arg("--version")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "unknown version".to_owned())
    }
}

/// A standalone `redis-server` on a free port of 127.0.0.1, persistence
/// off. Killed, and its directory removed, when dropped.
#[derive(Debug)]
pub(crate) struct Standalone {
    /// The running server.
    server: Server,
}

impl Standalone {
    /// Starts the server and waits until it answers PING.
    ///
    /// # Errors
    ///
    /// When the server cannot be spawned or does not answer in time (the
    /// message includes the tail of its log).
    pub(crate) fn start(tools: &Tools) -> Result<Self> {
        Ok(Self {
            server: Server::start(tools, &[])?,
        })
    }

    /// The server's port.
    pub(crate) fn port(&self) -> u16 {
        self.server.port
    }

    /// The server's URL, `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        url(self.port())
    }

    /// `PORTCULLIS_REDIS_URL` for tests and benches.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![("PORTCULLIS_REDIS_URL", self.url())]
    }
}

/// One supervised `redis-server` process.
#[derive(Debug)]
pub(crate) struct Server {
    /// The client port.
    pub(crate) port: u16,
    /// The server's working directory (`target/xtask/redis-<port>`).
    dir: PathBuf,
    /// The `sh` supervisor (see [`SUPERVISOR`]).
    supervisor: Child,
    /// The write end of the supervisor's stdin; closing it stops the server.
    lifeline: Option<ChildStdin>,
}

/// Why a server did not start.
#[derive(Debug)]
enum StartError {
    /// Its port was taken by someone else before it could bind: retry on
    /// another port.
    PortTaken,
    /// Anything else.
    Failed(Error),
}

impl Server {
    /// Starts `redis-server` with `extra_args` on a free port, trying
    /// another port when the first one was taken meanwhile.
    pub(crate) fn start(tools: &Tools, extra_args: &[&str]) -> Result<Self> {
        for _ in 0..PORT_ATTEMPTS {
            let port = pick_port()?;
            match Self::start_on(tools, port, extra_args) {
                Ok(server) => return Ok(server),
                Err(StartError::PortTaken) => continue,
                Err(StartError::Failed(error)) => return Err(error),
            }
        }
        Err(Error::new(format!(
            "redis-server could not bind a free port in {PORT_ATTEMPTS} attempts \
             (another process keeps taking them); retry, or check `ss -ltnp`"
        )))
    }

    /// Starts `redis-server` on `port` and waits until it answers PING.
    fn start_on(tools: &Tools, port: u16, extra_args: &[&str]) -> Result<Self, StartError> {
        let dir = xtask_dir().join(format!("redis-{port}"));
        let failed = |what: String| StartError::Failed(Error::new(what));
        // A directory left by a killed run; its port is free, so no server uses it.
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)
            .map_err(|e| failed(format!("could not create {}: {e}", dir.display())))?;
        let log = dir.join("redis.log");
        let port_text = port.to_string();
        let mut args: Vec<&str> = vec![
            "--port",
            &port_text,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ];
        let dir_text = display(&dir);
        let log_text = display(&log);
        args.extend(["--dir", &dir_text, "--logfile", &log_text]);
        args.extend(extra_args);
        let mut supervisor = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("sh")
            .arg(&dir)
            .arg(&tools.server)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| {
                failed(format!(
                    "could not spawn `sh` to supervise {}: {e}",
                    tools.server.display()
                ))
            })?;
        let lifeline = supervisor.stdin.take();
        let mut server = Self {
            port,
            dir,
            supervisor,
            lifeline,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Waits until the server answers PING and is the server we started
    /// (its `dir` is ours: another process may have won the port).
    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.supervisor.try_wait() {
                let log = self.log_tail();
                if log.contains("Address already in use") {
                    return Err(StartError::PortTaken);
                }
                return Err(StartError::Failed(Error::new(format!(
                    "redis-server on port {} exited during startup ({status}); \
                     its log {} ends with:\n{log}",
                    self.port,
                    self.dir.join("redis.log").display()
                ))));
            }
            match self.ping_and_identify() {
                Ok(true) => return Ok(()),
                Ok(false) => return Err(StartError::PortTaken),
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(25)),
                Err(e) => {
                    return Err(StartError::Failed(Error::new(format!(
                        "redis-server on port {} did not answer PING within {} s (last error: \
                         {e}); its log {} ends with:\n{}",
                        self.port,
                        START_TIMEOUT.as_secs(),
                        self.dir.join("redis.log").display(),
                        self.log_tail()
                    ))))
                }
            }
        }
    }

    /// PINGs the server; `Ok(true)` when it answers PONG and its working
    /// directory is ours, `Ok(false)` when another server owns the port.
    fn ping_and_identify(&self) -> io::Result<bool> {
        let mut conn = Connection::open(self.port, Duration::from_millis(500))?;
        let pong = conn.command(&["PING"])?;
        if pong != Reply::Status("PONG".to_owned()) {
            return Err(io::Error::other(format!("PING replied {pong}")));
        }
        let reply = conn.command(&["CONFIG", "GET", "dir"])?;
        let dir = match &reply {
            Reply::Array(Some(items)) if items.len() == 2 => items[1].text(),
            _ => None,
        }
        .ok_or_else(|| io::Error::other(format!("CONFIG GET dir replied {reply}")))?;
        Ok(same_dir(Path::new(&dir), &self.dir))
    }

    /// The last lines of the server's log (or why it could not be read).
    pub(crate) fn log_tail(&self) -> String {
        let path = self.dir.join("redis.log");
        match fs::read_to_string(&path) {
            Ok(text) => tail(&text, 20),
            Err(e) => format!("(could not read {}: {e})", path.display()),
        }
    }

    /// Opens a control connection to this server.
    pub(crate) fn connect(&self) -> Result<Connection> {
        Connection::open(self.port, IO_TIMEOUT)
            .map_err(|e| Error::new(format!("could not connect to 127.0.0.1:{}: {e}", self.port)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Closing the pipe makes the supervisor kill the server.
        drop(self.lifeline.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.supervisor.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    eprintln!(
                        "xtask: the supervisor of redis-server on port {} did not exit; killing it",
                        self.port
                    );
                    let _ = self.supervisor.kill();
                    let _ = self.supervisor.wait();
                    break;
                }
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A port in `PORT_LOW..PORT_LOW + PORT_SPAN` that is free on 127.0.0.1,
/// whose bus port (+10000) is free as well, and that this process has not
/// handed out before.
///
/// # Errors
///
/// When no such port is found in 500 random tries.
pub(crate) fn pick_port() -> Result<u16> {
    let random = std::collections::hash_map::RandomState::new();
    let mut reserved = RESERVED_PORTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for attempt in 0..500_u32 {
        let offset =
            u16::try_from(random.hash_one(attempt) % u64::from(PORT_SPAN)).unwrap_or_default(); // less than PORT_SPAN, a u16
        let port = PORT_LOW + offset;
        if reserved.contains(&port) {
            continue;
        }
        if port_is_free(port) && port_is_free(port + BUS_OFFSET) {
            reserved.insert(port);
            return Ok(port);
        }
    }
    Err(Error::new(format!(
        "found no free port pair (p, p+{BUS_OFFSET}) in {PORT_LOW}..{} on 127.0.0.1; \
         stop stray servers (`pgrep -a redis-server`) and retry",
        PORT_LOW + PORT_SPAN
    )))
}

/// Whether `port` can be bound on 127.0.0.1 right now.
fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Finds an executable file `name` in the directories of PATH, as an
/// absolute (but not canonicalized) path.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
        .and_then(|found| std::path::absolute(found).ok())
}

/// The directory holding the servers' working directories:
/// `<workspace>/target/xtask`.
pub(crate) fn xtask_dir() -> PathBuf {
    crate::workspace_root().join("target").join("xtask")
}

/// `redis://127.0.0.1:<port>`.
pub(crate) fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// Whether two paths name the same directory (compared canonicalized when
/// both exist).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// A path as text (lossy for non-UTF-8 paths, which servers would not
/// accept in their arguments anyway).
pub(crate) fn display(path: &Path) -> String {
    path.display().to_string()
}

/// The last `lines` lines of `text`, newline terminated.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    let mut out = String::new();
    for line in &all[start..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Writes `export NAME=value` lines (values shell-quoted) for `vars`.
pub(crate) fn write_exports(out: &mut impl io::Write, vars: &[(&str, String)]) -> io::Result<()> {
    for (name, value) in vars {
        writeln!(out, "export {name}={}", shell_quote(value))?;
    }
    out.flush()
}

/// Quotes `value` for a POSIX shell when it contains anything but safe
/// characters.
pub(crate) fn shell_quote(value: &str) -> String {
    let safe = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/:.,_-+=@%".contains(c));
    if safe {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_field_reads_crlf_info_text() {
        let info =
            "# Cluster\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\nrole:slave\r\n";
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "cluster_slots_assigned"), Some("16384"));
        assert_eq!(info_field(info, "role"), Some("slave"));
        assert_eq!(info_field(info, "cluster"), None);
        assert_eq!(info_field(info, "# Cluster"), None);
    }

    #[test]
    fn picked_ports_are_distinct_and_leave_room_for_the_bus_port() {
        let a = pick_port().unwrap();
        let b = pick_port().unwrap();
        assert_ne!(a, b);
        for port in [a, b] {
            assert!((PORT_LOW..PORT_LOW + PORT_SPAN).contains(&port), "{port}");
        }
    }

    #[test]
    fn shell_quote_quotes_only_when_needed() {
        assert_eq!(
            shell_quote("redis://127.0.0.1:1,redis://x:2"),
            "redis://127.0.0.1:1,redis://x:2"
        );
        assert_eq!(
            shell_quote("/usr/bin/redis-server"),
            "/usr/bin/redis-server"
        );
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a", 5), "a\n");
        assert_eq!(tail("", 5), "");
    }

    /// Connects to `port` on 127.0.0.1.
    fn connect(port: u16) -> Connection {
        Connection::open(port, IO_TIMEOUT).unwrap()
    }

    #[test]
    fn standalone_server_serves_and_is_gone_after_drop() {
        let tools = Tools::discover().unwrap();
        let server = Standalone::start(&tools).unwrap();
        let port = server.port();
        assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
        let dir = xtask_dir().join(format!("redis-{port}"));
        assert!(dir.join("redis.log").is_file());
        let mut conn = connect(port);
        assert_eq!(conn.text(&["SET", "k", "v"]).unwrap(), "OK");
        assert_eq!(conn.text(&["GET", "k"]).unwrap(), "v");
        let save = conn.command(&["CONFIG", "GET", "save"]).unwrap();
        assert_eq!(save.to_string(), "[save, ]", "persistence must be off");
        drop(conn);
        drop(server);
        assert!(!dir.exists(), "{} should be removed", dir.display());
        assert!(
            Connection::open(port, IO_TIMEOUT).is_err(),
            "server still up"
        );
    }

    #[test]
    fn find_on_path_finds_sh_but_not_nonsense() {
        let sh = find_on_path("sh").expect("sh is on PATH on every Unix");
        assert!(sh.is_absolute());
        assert!(find_on_path("no-such-binary-xtask-test").is_none());
    }
}
