//! A private Sentinel-managed primary for tests that fail it over or kill
//! it: [`OwnedSentinelSet`] (a primary, one replica, three Sentinels, all
//! on free ports, all killed when dropped).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, redis_server_bin, OwnedRedis};

/// The master name an [`OwnedSentinelSet`]'s Sentinels monitor.
pub const OWNED_SENTINEL_MASTER: &str = "portcullis-owned";

/// A primary, its replica and three Sentinels (quorum 2, primary down after
/// 1 s), owned by one test. Killed, and their files removed, on drop.
#[derive(Debug)]
pub struct OwnedSentinelSet {
    /// The data nodes; which one is primary changes with failovers.
    nodes: Vec<OwnedRedis>,
    sentinels: Vec<OwnedSentinel>,
}

#[derive(Debug)]
struct OwnedSentinel {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl Drop for OwnedSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl OwnedSentinelSet {
    /// Starts the set and waits until every Sentinel sees the primary, the
    /// replica and the other two Sentinels.
    ///
    /// # Panics
    ///
    /// When a process cannot be started or the set does not form in 30 s.
    #[must_use]
    pub fn start() -> Self {
        // Diskless both ways: a full sync (also of the old primary after a
        // failover) writes no RDB file into the test's directory.
        let primary = OwnedRedis::start(&[
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-load",
            "swapdb",
        ]);
        let primary_port = primary.port().to_string();
        let replica = OwnedRedis::start(&[
            "--replicaof",
            "127.0.0.1",
            &primary_port,
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-load",
            "swapdb",
        ]);
        let sentinels = (0..3)
            .map(|_| OwnedSentinel::start(primary.port()))
            .collect();
        let set = Self {
            nodes: vec![primary, replica],
            sentinels,
        };
        set.wait_until(Duration::from_secs(30), "form", |info| {
            info.contains("status=ok") && info.contains("slaves=1") && info.contains("sentinels=3")
        });
        set
    }

    /// The Sentinels' URLs.
    #[must_use]
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The master name ([`OWNED_SENTINEL_MASTER`]).
    #[must_use]
    pub fn master_name(&self) -> &'static str {
        OWNED_SENTINEL_MASTER
    }

    /// The port of the primary the first answering Sentinel names.
    ///
    /// # Panics
    ///
    /// When no Sentinel answers.
    #[must_use]
    pub fn primary_port(&self) -> u16 {
        for sentinel in &self.sentinels {
            let Ok(mut conn) = connect(sentinel.port) else {
                continue;
            };
            let reply: redis::RedisResult<Vec<String>> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(OWNED_SENTINEL_MASTER)
                .query(&mut conn);
            if let Ok(addr) = reply
                && let Some(port) = addr.get(1).and_then(|p| p.parse().ok())
            {
                return port;
            }
        }
        panic!("no Sentinel named the primary")
    }

    /// The URL of the current primary (for raw inspection).
    #[must_use]
    pub fn primary_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.primary_port())
    }

    /// Waits until the replica has every write the primary has (equal
    /// replication offsets), so nothing acknowledged can be lost by a
    /// failover.
    ///
    /// # Panics
    ///
    /// When the replica does not catch up within 10 s.
    pub fn wait_replica_synced(&self) {
        let primary = self.primary_port();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let primary_offset = offset(primary, "master_repl_offset");
            let synced = self
                .nodes
                .iter()
                .filter(|node| node.port() != primary)
                .all(|node| offset(node.port(), "slave_repl_offset") == primary_offset);
            if synced && primary_offset.is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not catch up in 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Pauses writes on the primary for `pause` (`CLIENT PAUSE … WRITE`):
    /// how an operator quiesces a planned failover.
    ///
    /// # Panics
    ///
    /// When the primary refuses.
    pub fn pause_primary_writes(&self, pause: Duration) {
        let mut conn = connect(self.primary_port()).expect("the primary answers");
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(pause.as_millis().to_string())
            .arg("WRITE")
            .query(&mut conn)
            .expect("CLIENT PAUSE WRITE");
    }

    /// Asks a Sentinel for a failover (`SENTINEL FAILOVER`), returning the
    /// port of the primary before it.
    ///
    /// # Panics
    ///
    /// When no Sentinel accepts.
    pub fn sentinel_failover(&self) -> u16 {
        let old = self.primary_port();
        for sentinel in &self.sentinels {
            let Ok(mut conn) = connect(sentinel.port) else {
                continue;
            };
            let reply: redis::RedisResult<()> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(OWNED_SENTINEL_MASTER)
                .query(&mut conn);
            if reply.is_ok() {
                return old;
            }
        }
        panic!("no Sentinel accepted SENTINEL FAILOVER")
    }

    /// Kills the current primary (SIGKILL), returning its port.
    pub fn kill_primary(&mut self) -> u16 {
        let old = self.primary_port();
        for node in &mut self.nodes {
            if node.port() == old {
                node.kill();
            }
        }
        old
    }

    /// Waits until the Sentinels name a primary other than `old`, and it
    /// says it is a master.
    ///
    /// # Panics
    ///
    /// After 30 s.
    pub fn wait_new_primary(&self, old: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let port = self.primary_port();
            if port != old && role(port).as_deref() == Some("master") {
                return port;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinels did not promote a new primary in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_until(&self, timeout: Duration, what: &str, ok: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let infos: Vec<String> = self
                .sentinels
                .iter()
                .map(|s| {
                    connect(s.port)
                        .and_then(|mut conn| redis::cmd("INFO").arg("sentinel").query(&mut conn))
                        .unwrap_or_default()
                })
                .collect();
            if infos.iter().all(|info| ok(info)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinel set did not {what} within {timeout:?}: {infos:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl OwnedSentinel {
    fn start(primary_port: u16) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("portcullis-sentinel-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                 sentinel monitor {OWNED_SENTINEL_MASTER} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {OWNED_SENTINEL_MASTER} 1000\n\
                 sentinel failover-timeout {OWNED_SENTINEL_MASTER} 5000\n\
                 sentinel parallel-syncs {OWNED_SENTINEL_MASTER} 1\n",
                dir = dir.display()
            ),
        )
        .expect("write sentinel.conf");
        let bin = redis_server_bin();
        let child = Command::new(&bin)
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "could not start {} --sentinel: {e}; install redis-server",
                    bin.display()
                )
            });
        let sentinel = Self { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while connect(port).is_err() {
            assert!(
                Instant::now() < deadline,
                "the Sentinel on port {port} did not start within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }
}

fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    client.get_connection_with_timeout(Duration::from_millis(500))
}

fn info(port: u16, section: &str) -> Option<String> {
    let mut conn = connect(port).ok()?;
    redis::cmd("INFO").arg(section).query(&mut conn).ok()
}

fn field(info: &str, name: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim().to_owned())
    })
}

fn offset(port: u16, name: &str) -> Option<u64> {
    field(&info(port, "replication")?, name)?.parse().ok()
}

fn role(port: u16) -> Option<String> {
    field(&info(port, "replication")?, "role")
}
