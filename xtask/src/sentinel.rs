//! The Sentinel sets `cargo xtask test` starts: a primary with a replica
//! and three Sentinels ([`SentinelSet::start`]), and the same over TLS
//! ([`SentinelSet::start_tls`], with [`Secure`](crate::secure::Secure)'s
//! certificates), each node supervised and removed on drop.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::redis::{
    display, info_field, pick_port, tail, url, xtask_dir, Server, Tools, SUPERVISOR,
};
use crate::resp::{Connection, Reply};
use crate::secure::{start_tls_with, Certs, FORM_TIMEOUT, IO_TIMEOUT};
use crate::{Error, Result};

/// The master name the Sentinels monitor.
pub(crate) const SENTINEL_MASTER: &str = "portcullis-primary";

/// A primary, its replica and three Sentinels monitoring it as
/// [`SENTINEL_MASTER`] (quorum 2, down after 1 s); with TLS
/// ([`SentinelSet::start_tls`]) every node also listens on a TLS port,
/// replicates and is monitored over TLS, so the Sentinels hand clients the
/// primary's TLS address.
#[derive(Debug)]
pub(crate) struct SentinelSet {
    sentinels: Vec<SentinelNode>,
    replica: Server,
    primary: Server,
}

impl SentinelSet {
    /// Starts the nodes and waits until every Sentinel knows the replica
    /// and the two other Sentinels.
    ///
    /// # Errors
    ///
    /// When a node does not start or the set does not form in 30 s.
    pub(crate) fn start(tools: &Tools) -> Result<Self> {
        let primary = Server::start(tools, &["--repl-diskless-sync-delay", "0"])?;
        let primary_port = primary.port.to_string();
        let replica = Server::start(
            tools,
            &[
                "--replicaof",
                "127.0.0.1",
                &primary_port,
                "--repl-diskless-sync-delay",
                "0",
            ],
        )?;
        let mut sentinels = Vec::with_capacity(3);
        for _ in 0..3 {
            sentinels.push(SentinelNode::start(tools, primary.port, None)?);
        }
        Self::formed(sentinels, replica, primary)
    }

    /// [`SentinelSet::start`] over TLS with `certs` (client certificates
    /// optional). The plain ports stay open for xtask's control
    /// connections; clients use the TLS ports
    /// ([`SentinelSet::tls_env`]).
    ///
    /// # Errors
    ///
    /// When a node does not start or the set does not form in 30 s.
    pub(crate) fn start_tls(tools: &Tools, certs: &Certs) -> Result<Self> {
        // `tls-replication`: the replica replicates, and announces itself,
        // on TLS; the Sentinels monitor and talk to each other on TLS. As a
        // client a node presents the client certificate (the server one is
        // for server authentication only).
        let files = [
            display(&certs.path("client.pem")),
            display(&certs.path("client.key")),
        ];
        let tls = [
            "--tls-replication",
            "yes",
            "--tls-client-cert-file",
            &files[0],
            "--tls-client-key-file",
            &files[1],
            "--repl-diskless-sync-delay",
            "0",
        ];
        let primary = start_tls_with(tools, certs, "optional", &tls)?;
        let primary_tls_port = primary.tls_port.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &primary_tls_port];
        replica_args.extend(tls);
        let replica = start_tls_with(tools, certs, "optional", &replica_args)?;
        let mut sentinels = Vec::with_capacity(3);
        for _ in 0..3 {
            sentinels.push(SentinelNode::start(tools, primary.tls_port, Some(certs))?);
        }
        Self::formed(sentinels, replica.server, primary.server)
    }

    fn formed(sentinels: Vec<SentinelNode>, replica: Server, primary: Server) -> Result<Self> {
        let set = Self {
            sentinels,
            replica,
            primary,
        };
        set.wait_formed()?;
        Ok(set)
    }

    fn wait_formed(&self) -> Result<()> {
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let mut pending = None;
            for sentinel in &self.sentinels {
                let info = Connection::open(sentinel.port, IO_TIMEOUT)
                    .and_then(|mut conn| conn.text(&["INFO", "sentinel"]))
                    .unwrap_or_default();
                let line = info_field(&info, "master0").unwrap_or_default();
                if !(line.contains("status=ok")
                    && line.contains("slaves=1")
                    && line.contains("sentinels=3"))
                {
                    pending = Some((sentinel, info));
                    break;
                }
            }
            match pending {
                None => return Ok(()),
                Some(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
                Some((sentinel, info)) => {
                    return Err(Error::new(format!(
                        "the Sentinel set did not form within {} s: the Sentinel on port {} says\n\
                         {info}\nits log ends with:\n{}\n(replica on {}, primary on {})",
                        FORM_TIMEOUT.as_secs(),
                        sentinel.port,
                        sentinel.log_tail(),
                        self.replica.port,
                        self.primary.port,
                    )))
                }
            }
        }
    }

    /// `PORTCULLIS_REDIS_SENTINEL_URLS` and `PORTCULLIS_REDIS_SENTINEL_MASTER`.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let urls: Vec<String> = self.sentinels.iter().map(|s| url(s.port)).collect();
        vec![
            ("PORTCULLIS_REDIS_SENTINEL_URLS", urls.join(",")),
            (
                "PORTCULLIS_REDIS_SENTINEL_MASTER",
                SENTINEL_MASTER.to_owned(),
            ),
        ]
    }

    /// `PORTCULLIS_REDIS_TLS_SENTINEL_URLS`: the Sentinels' TLS ports as
    /// `rediss://` URLs (trust `PORTCULLIS_REDIS_TLS_CA`); the master name is
    /// the same [`SENTINEL_MASTER`].
    pub(crate) fn tls_env(&self) -> Vec<(&'static str, String)> {
        let urls: Vec<String> = self
            .sentinels
            .iter()
            .filter_map(|s| s.tls_port)
            .map(|port| format!("rediss://127.0.0.1:{port}"))
            .collect();
        vec![("PORTCULLIS_REDIS_TLS_SENTINEL_URLS", urls.join(","))]
    }
}

/// One supervised Sentinel (`redis-server <conf> --sentinel`); killed and
/// its directory removed on drop.
#[derive(Debug)]
struct SentinelNode {
    port: u16,
    /// The TLS port, for a Sentinel of [`SentinelSet::start_tls`].
    tls_port: Option<u16>,
    dir: PathBuf,
    supervisor: Child,
    lifeline: Option<ChildStdin>,
}

impl SentinelNode {
    fn start(tools: &Tools, primary_port: u16, tls: Option<&Certs>) -> Result<Self> {
        let port = pick_port()?;
        let tls_port = tls.map(|_| pick_port()).transpose()?;
        let dir = xtask_dir().join(format!("sentinel-{port}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)
            .map_err(|e| Error::new(format!("could not create {}: {e}", dir.display())))?;
        let conf = dir.join("sentinel.conf");
        let mut text = sentinel_conf(port, &dir, primary_port);
        if let (Some(certs), Some(tls_port)) = (tls, tls_port) {
            text.push_str(&format!(
                "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-client-cert-file {}\ntls-client-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients optional\ntls-replication yes\n",
                display(&certs.path("server.pem")),
                display(&certs.path("server.key")),
                display(&certs.path("client.pem")),
                display(&certs.path("client.key")),
                display(&certs.path("ca.pem")),
            ));
        }
        fs::write(&conf, text)
            .map_err(|e| Error::new(format!("could not write {}: {e}", conf.display())))?;
        let mut supervisor = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("sh")
            .arg(&dir)
            .arg(&tools.server)
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| Error::new(format!("could not spawn a Sentinel: {e}")))?;
        let lifeline = supervisor.stdin.take();
        let mut node = Self {
            port,
            tls_port,
            dir,
            supervisor,
            lifeline,
        };
        node.wait_ready()?;
        Ok(node)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = self.supervisor.try_wait() {
                return Err(Error::new(format!(
                    "the Sentinel on port {} exited during startup ({status}); its log ends with:\n{}",
                    self.port,
                    self.log_tail()
                )));
            }
            let pong = Connection::open(self.port, Duration::from_millis(500))
                .and_then(|mut conn| conn.command(&["PING"]));
            match pong {
                Ok(Reply::Status(pong)) if pong == "PONG" => return Ok(()),
                _ if Instant::now() < deadline => thread::sleep(Duration::from_millis(25)),
                other => {
                    return Err(Error::new(format!(
                        "the Sentinel on port {} did not answer PING ({other:?}); its log ends with:\n{}",
                        self.port,
                        self.log_tail()
                    )))
                }
            }
        }
    }

    fn log_tail(&self) -> String {
        let path = self.dir.join("sentinel.log");
        fs::read_to_string(&path).map_or_else(
            |e| format!("(could not read {}: {e})", path.display()),
            |text| tail(&text, 20),
        )
    }
}

/// The configuration file of a Sentinel on `port` monitoring the primary on
/// `primary_port` (Sentinels rewrite their file, so each has its own).
pub(crate) fn sentinel_conf(port: u16, dir: &Path, primary_port: u16) -> String {
    format!(
        "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
         sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary_port} 2\n\
         sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
         sentinel failover-timeout {SENTINEL_MASTER} 5000\n\
         sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
        dir = display(dir),
        log = display(&dir.join("sentinel.log")),
    )
}

impl Drop for SentinelNode {
    fn drop(&mut self) {
        drop(self.lifeline.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(None) = self.supervisor.try_wait() {
            if Instant::now() >= deadline {
                let _ = self.supervisor.kill();
                let _ = self.supervisor.wait();
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_conf_monitors_the_primary() {
        let conf = sentinel_conf(26379, Path::new("/tmp/s"), 6379);
        assert!(conf.starts_with("port 26379\n"), "{conf}");
        assert!(
            conf.contains(&format!(
                "sentinel monitor {SENTINEL_MASTER} 127.0.0.1 6379 2\n"
            )),
            "{conf}"
        );
        assert!(conf.contains("down-after-milliseconds"), "{conf}");
    }
}
