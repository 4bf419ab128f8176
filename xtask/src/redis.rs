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

/// The Redis binaries found on PATH.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    /// Absolute path of `redis-server` (not canonicalized: on Debian it is
    /// a symlink to a multi-call binary that looks at its own name).
    pub(crate) server: PathBuf,
    /// `redis-cli`, if installed.
    pub(crate) cli: Option<PathBuf>,
    /// `redis-benchmark`, if installed.
    pub(crate) benchmark: Option<PathBuf>,
}

impl Tools {
    /// Finds the Redis binaries on PATH.
    ///
    /// # Errors
    ///
    /// When `redis-server` is not on PATH: the Redis tests need it, and
    /// they never skip.
    pub(crate) fn discover() -> Result<Self> {
        let server = find_on_path("redis-server").ok_or_else(|| {
            Error::new(
                "redis-server not found on PATH: install it (apt-get install redis-server) \
                 — the Redis tests need real servers",
            )
        })?;
        Ok(Self {
            server,
            cli: find_on_path("redis-cli"),
            benchmark: find_on_path("redis-benchmark"),
        })
    }

    /// The environment variables announcing these binaries to tests and
    /// benches (`TOLLGATE_REDIS_SERVER`, `TOLLGATE_REDIS_CLI`,
    /// `TOLLGATE_REDIS_BENCHMARK`; the last two only when found).
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![("TOLLGATE_REDIS_SERVER", display(&self.server))];
        if let Some(cli) = &self.cli {
            vars.push(("TOLLGATE_REDIS_CLI", display(cli)));
        }
        if let Some(benchmark) = &self.benchmark {
            vars.push(("TOLLGATE_REDIS_BENCHMARK", display(benchmark)));
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

    /// `TOLLGATE_REDIS_URL` for tests and benches.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![("TOLLGATE_REDIS_URL", self.url())]
    }
}

/// A Redis Cluster of `masters` masters with `replicas_per_master` replicas
/// each, every node on free ports of 127.0.0.1, all 16384 slots assigned.
/// Every node is killed, and its directory removed, when dropped.
#[derive(Debug)]
pub(crate) struct Cluster {
    /// Every node, masters and replicas, in start order.
    nodes: Vec<Server>,
    /// The ports of the nodes that were masters once the Cluster formed.
    master_ports: Vec<u16>,
}

impl Cluster {
    /// Starts the nodes, joins them into a Cluster (with `redis-cli
    /// --cluster create` when available and `masters >= 3`, else by
    /// issuing `CLUSTER ADDSLOTS` / `MEET` / `REPLICATE` itself; set
    /// `XTASK_CLUSTER_CREATE=manual` to force the latter), and waits until
    /// every node reports `cluster_state:ok` with all slots assigned and
    /// every replica is in sync with its master.
    ///
    /// # Errors
    ///
    /// When `masters` is 0, or a node does not start, or the Cluster does
    /// not form within 30 seconds.
    pub(crate) fn start(tools: &Tools, masters: usize, replicas_per_master: usize) -> Result<Self> {
        if masters == 0 {
            return Err(Error::new("a Redis Cluster needs at least one master"));
        }
        let total = masters * (1 + replicas_per_master);
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            // Replicas sync at once instead of after the default 5 s.
            "--repl-diskless-sync-delay",
            "0",
        ];
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            nodes.push(Server::start(tools, &args)?);
        }
        let ports: Vec<u16> = nodes.iter().map(|node| node.port).collect();
        let manual = std::env::var("XTASK_CLUSTER_CREATE").is_ok_and(|v| v == "manual");
        match &tools.cli {
            Some(cli) if masters >= 3 && !manual => {
                create_with_redis_cli(cli, &ports, replicas_per_master)?;
            }
            _ => create_by_hand(&ports, masters)?,
        }
        let roles = wait_for_cluster(&nodes, masters)?;
        let master_ports = ports
            .iter()
            .zip(&roles)
            .filter(|(_, role)| *role == "master")
            .map(|(port, _)| *port)
            .collect();
        Ok(Self {
            nodes,
            master_ports,
        })
    }

    /// The URL of the first master.
    #[cfg(test)]
    pub(crate) fn url(&self) -> String {
        url(self.master_ports[0]) // start() refuses masters == 0
    }

    /// The URLs of the masters (what `TOLLGATE_REDIS_CLUSTER_URLS` lists).
    pub(crate) fn urls(&self) -> Vec<String> {
        self.master_ports.iter().copied().map(url).collect()
    }

    /// The URLs of every node, masters and replicas.
    pub(crate) fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|node| url(node.port)).collect()
    }

    /// `TOLLGATE_REDIS_CLUSTER_URLS` for tests and benches.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![("TOLLGATE_REDIS_CLUSTER_URLS", self.urls().join(","))]
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

/// Runs `redis-cli --cluster create` for the nodes on `ports`.
fn create_with_redis_cli(cli: &Path, ports: &[u16], replicas_per_master: usize) -> Result<()> {
    let mut command = Command::new(cli);
    command.arg("--cluster").arg("create");
    command.args(ports.iter().map(|port| format!("127.0.0.1:{port}")));
    command
        .arg("--cluster-replicas")
        .arg(replicas_per_master.to_string())
        .arg("--cluster-yes")
        .stdin(Stdio::null());
    let output = command
        .output()
        .map_err(|e| Error::new(format!("could not run {}: {e}", cli.display())))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::new(format!(
        "`redis-cli --cluster create` failed ({}); its output ends with:\n{}{}\n\
         (retry with XTASK_CLUSTER_CREATE=manual to build the Cluster without redis-cli)",
        output.status,
        tail(&String::from_utf8_lossy(&output.stdout), 20),
        tail(&String::from_utf8_lossy(&output.stderr), 20),
    )))
}

/// Builds the Cluster by hand: the first `masters` nodes get contiguous
/// slot ranges and distinct config epochs, every node meets the first one,
/// and the other nodes replicate the masters in turn.
fn create_by_hand(ports: &[u16], masters: usize) -> Result<()> {
    let command = |port: u16, args: &[String]| -> Result<()> {
        let mut conn = Connection::open(port, IO_TIMEOUT)
            .map_err(|e| Error::new(format!("could not connect to 127.0.0.1:{port}: {e}")))?;
        match conn.command(args) {
            Ok(Reply::Status(_)) => Ok(()),
            Ok(reply) => Err(Error::new(format!(
                "`{} {}` on 127.0.0.1:{port} replied {reply}",
                args[0], args[1]
            ))),
            Err(e) => Err(Error::new(format!(
                "`{} {}` on 127.0.0.1:{port} failed: {e}",
                args[0], args[1]
            ))),
        }
    };
    let strings = |args: &[&str]| -> Vec<String> { args.iter().map(|s| (*s).to_owned()).collect() };
    for (index, (first, last)) in slot_ranges(masters).into_iter().enumerate() {
        let port = ports[index];
        command(
            port,
            &strings(&["CLUSTER", "SET-CONFIG-EPOCH", &(index + 1).to_string()]),
        )?;
        let mut addslots = strings(&["CLUSTER", "ADDSLOTS"]);
        addslots.extend((first..=last).map(|slot| slot.to_string()));
        command(port, &addslots)?;
    }
    let first = ports[0].to_string();
    for &port in &ports[1..] {
        command(port, &strings(&["CLUSTER", "MEET", "127.0.0.1", &first]))?;
    }
    // REPLICATE needs the master's node ID to be known: wait for the gossip.
    let deadline = Instant::now() + CLUSTER_TIMEOUT;
    for &port in ports {
        loop {
            let info = cluster_info(port)?;
            if info_field(&info, "cluster_known_nodes") == Some(&ports.len().to_string()) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "127.0.0.1:{port} did not learn about all {} nodes within {} s; \
                     CLUSTER INFO says:\n{info}",
                    ports.len(),
                    CLUSTER_TIMEOUT.as_secs()
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
    for (index, &port) in ports.iter().enumerate().skip(masters) {
        let master = ports[index % masters];
        let id = Connection::open(master, IO_TIMEOUT)
            .and_then(|mut conn| conn.text(&["CLUSTER", "MYID"]))
            .map_err(|e| Error::new(format!("CLUSTER MYID on 127.0.0.1:{master} failed: {e}")))?;
        command(port, &strings(&["CLUSTER", "REPLICATE", &id]))?;
    }
    Ok(())
}

/// Waits until every node reports `cluster_state:ok`, all slots assigned
/// and every node known, and every replica's link to its master is up.
/// Returns each node's role (`master` or `slave`), in node order.
fn wait_for_cluster(nodes: &[Server], masters: usize) -> Result<Vec<String>> {
    let deadline = Instant::now() + CLUSTER_TIMEOUT;
    let total = nodes.len().to_string();
    let slots = CLUSTER_SLOTS.to_string();
    loop {
        let mut pending = None;
        let mut roles = Vec::with_capacity(nodes.len());
        for node in nodes {
            let info = cluster_info(node.port)?;
            let ok = info_field(&info, "cluster_state") == Some("ok")
                && info_field(&info, "cluster_slots_assigned") == Some(&slots)
                && info_field(&info, "cluster_known_nodes") == Some(&total);
            let replication = node
                .connect()?
                .text(&["INFO", "replication"])
                .map_err(|e| Error::new(format!("INFO on 127.0.0.1:{} failed: {e}", node.port)))?;
            let role = info_field(&replication, "role")
                .unwrap_or("unknown")
                .to_owned();
            let synced =
                role == "master" || info_field(&replication, "master_link_status") == Some("up");
            if (!ok || !synced) && pending.is_none() {
                pending = Some((node, info, replication));
            }
            roles.push(role);
        }
        let master_count = roles.iter().filter(|role| *role == "master").count();
        match pending {
            None if master_count == masters => return Ok(roles),
            _ if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
            Some((node, info, replication)) => {
                return Err(Error::new(format!(
                    "the Redis Cluster did not form within {} s: 127.0.0.1:{} reports\n{info}\n\
                     {replication}\nits log ends with:\n{}",
                    CLUSTER_TIMEOUT.as_secs(),
                    node.port,
                    node.log_tail()
                )))
            }
            None => {
                return Err(Error::new(format!(
                    "the Redis Cluster formed with {master_count} masters instead of {masters} \
                     (roles: {roles:?})"
                )))
            }
        }
    }
}

/// `CLUSTER INFO` of the node on `port`.
fn cluster_info(port: u16) -> Result<String> {
    Connection::open(port, IO_TIMEOUT)
        .and_then(|mut conn| conn.text(&["CLUSTER", "INFO"]))
        .map_err(|e| Error::new(format!("CLUSTER INFO on 127.0.0.1:{port} failed: {e}")))
}

/// The value of `field` in an `INFO` / `CLUSTER INFO` text
/// (`field:value` lines, CRLF separated).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == field).then(|| value.trim_end())
    })
}

/// The inclusive slot ranges of `masters` masters: contiguous, covering
/// every slot, sizes differing by at most one.
pub(crate) fn slot_ranges(masters: usize) -> Vec<(u32, u32)> {
    let n = u32::try_from(masters)
        .unwrap_or(u32::MAX)
        .clamp(1, CLUSTER_SLOTS);
    (0..n)
        .map(|i| (i * CLUSTER_SLOTS / n, (i + 1) * CLUSTER_SLOTS / n - 1))
        .collect()
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
    fn slot_ranges_cover_every_slot_once() {
        for masters in [1, 2, 3, 5, 7, 16] {
            let ranges = slot_ranges(masters);
            assert_eq!(ranges.len(), masters);
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges[masters - 1].1, CLUSTER_SLOTS - 1);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].1 + 1, pair[1].0, "{masters} masters: {ranges:?}");
            }
            let sizes: Vec<u32> = ranges.iter().map(|(a, b)| b - a + 1).collect();
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(max - min <= 1, "{masters} masters: sizes {sizes:?}");
        }
        assert_eq!(
            slot_ranges(3),
            vec![(0, 5460), (5461, 10921), (10922, 16383)]
        );
    }

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
    fn three_master_cluster_serves_every_slot() {
        let tools = Tools::discover().unwrap();
        let cluster = Cluster::start(&tools, 3, 0).unwrap();
        let ports = cluster.master_ports.clone();
        assert_eq!(ports.len(), 3);
        assert_eq!(cluster.urls().len(), 3);
        assert_eq!(cluster.url(), cluster.urls()[0]);
        for &port in &ports {
            let info = cluster_info(port).unwrap();
            assert_eq!(info_field(&info, "cluster_state"), Some("ok"));
            assert_eq!(info_field(&info, "cluster_slots_assigned"), Some("16384"));
        }
        // Exactly one master owns the key; the others redirect to it.
        let replies: Vec<Reply> = ports
            .iter()
            .map(|&port| connect(port).command(&["SET", "foo", "bar"]).unwrap())
            .collect();
        let owner: Vec<u16> = ports
            .iter()
            .zip(&replies)
            .filter(|(_, reply)| **reply == Reply::Status("OK".to_owned()))
            .map(|(port, _)| *port)
            .collect();
        assert_eq!(owner.len(), 1, "{replies:?}");
        let moved = format!("MOVED 12182 127.0.0.1:{}", owner[0]);
        let redirects = replies
            .iter()
            .filter(|r| **r == Reply::Error(moved.clone()));
        assert_eq!(redirects.count(), 2, "{replies:?}");
        drop(cluster);
        for port in ports {
            assert!(
                Connection::open(port, IO_TIMEOUT).is_err(),
                "{port} still up"
            );
        }
    }

    #[test]
    fn cluster_built_by_hand_has_synced_replicas() {
        // One master: redis-cli refuses fewer than three, so this is the
        // hand-built path (ADDSLOTS / MEET / REPLICATE).
        let tools = Tools::discover().unwrap();
        let cluster = Cluster::start(&tools, 1, 2).unwrap();
        assert_eq!(cluster.node_urls().len(), 3);
        assert_eq!(cluster.urls(), [cluster.url()]);
        let master = cluster.master_ports[0];
        assert_eq!(connect(master).text(&["SET", "foo", "bar"]).unwrap(), "OK");
        for node in cluster.nodes.iter().filter(|node| node.port != master) {
            let info = connect(node.port).text(&["INFO", "replication"]).unwrap();
            assert_eq!(info_field(&info, "role"), Some("slave"));
            assert_eq!(info_field(&info, "master_port"), Some(&*master.to_string()));
            assert_eq!(info_field(&info, "master_link_status"), Some("up"));
        }
    }

    #[test]
    fn find_on_path_finds_sh_but_not_nonsense() {
        let sh = find_on_path("sh").expect("sh is on PATH on every Unix");
        assert!(sh.is_absolute());
        assert!(find_on_path("no-such-binary-xtask-test").is_none());
    }
}
