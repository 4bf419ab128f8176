//! A local Redis Cluster for tests and benches ([`Cluster`]): its nodes
//! started as supervised [`Server`]s, joined by `redis-cli --cluster create`
//! or by hand (`CLUSTER ADDSLOTS` / `MEET` / `REPLICATE`), and waited for
//! until every slot is served.

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{tail, url, Server, Tools, CLUSTER_SLOTS, CLUSTER_TIMEOUT, IO_TIMEOUT};
use crate::resp::{Connection, Reply};
use crate::{Error, Result};

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

    /// The URLs of the masters (what `PORTCULLIS_REDIS_CLUSTER_URLS` lists).
    pub(crate) fn urls(&self) -> Vec<String> {
        self.master_ports.iter().copied().map(url).collect()
    }

    /// The URLs of every node, masters and replicas.
    pub(crate) fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|node| url(node.port)).collect()
    }

    /// `PORTCULLIS_REDIS_CLUSTER_URLS` for tests and benches.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![("PORTCULLIS_REDIS_CLUSTER_URLS", self.urls().join(","))]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Connects to `port` on 127.0.0.1.
    fn connect(port: u16) -> Connection {
        Connection::open(port, IO_TIMEOUT).unwrap()
    }

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
}
