//! Redis Cluster faults: a master failing over to its replica, and a slot
//! migrating (MOVED / ASK) under load. Also a private Cluster a test may
//! break ([`OwnedCluster`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis_core::Policy;
use portcullis_redis::RedisStore;

use super::counting::{CountingStore, FailureKind, Outcome};
use super::load::{judge_calls, start_store_load, Load, StoreCall};
use super::report::{ms, Row};
use super::{admin, command};
use crate::{free_port, OwnedRedis};

/// The hash slot of `key` (CRC16/XMODEM of its hash tag, or of the whole
/// key, modulo 16384), as Redis Cluster computes it. Written here because
/// the redis crate computes slots only internally (`Route::slot` is not
/// public); the tests below hold it to Redis's documented values.
#[must_use]
pub fn crc16_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for byte in tagged {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// `n` plain subjects named `<prefix>-<k>` whose keys all hash to `slot`.
#[must_use]
pub fn subjects_in_slot(slot: u16, n: usize, prefix: &str) -> Vec<String> {
    (0u64..)
        .map(|k| format!("{prefix}-{k}"))
        .filter(|s| crc16_slot(s.as_bytes()) == slot)
        .take(n)
        .collect()
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Node id.
    pub id: String,
    /// `redis://127.0.0.1:<port>`.
    pub url: String,
    /// Client port.
    pub port: u16,
    /// Whether it is a master.
    pub master: bool,
    /// Whether it is flagged failed (`fail`).
    pub failed: bool,
    /// For a replica, its master's id.
    pub master_id: Option<String>,
    /// Slot ranges it serves (inclusive).
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    /// Whether the node serves `slot`.
    #[must_use]
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

fn parse_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let address = fields[1].split('@').next()?;
            let port: u16 = address.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => {
                        let slot = s.parse().ok()?;
                        Some((slot, slot))
                    }
                })
                .collect();
            Some(ClusterNode {
                id: fields[0].to_owned(),
                url: format!("redis://127.0.0.1:{port}"),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail"),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// Administration of a Cluster known by some node URLs.
#[derive(Debug, Clone)]
pub struct ClusterAdmin {
    urls: Vec<String>,
}

impl ClusterAdmin {
    /// Administers the Cluster that `urls` (some or all nodes) belong to.
    #[must_use]
    pub fn new(urls: Vec<String>) -> Self {
        Self { urls }
    }

    /// `CLUSTER NODES` as seen by the first node that answers, skipping
    /// `except`.
    ///
    /// # Panics
    ///
    /// When no node answers.
    pub async fn nodes_except(&self, except: Option<u16>) -> Vec<ClusterNode> {
        for url in &self.urls {
            if except.is_some_and(|port| url.ends_with(&format!(":{port}"))) {
                continue;
            }
            let Ok(client) = redis::Client::open(url.as_str()) else {
                continue;
            };
            let connect = tokio::time::timeout(
                Duration::from_secs(1),
                client.get_multiplexed_async_connection(),
            );
            let Ok(Ok(mut connection)) = connect.await else {
                continue;
            };
            if let Ok(text) = command::<String>(&mut connection, &["CLUSTER", "NODES"]).await {
                return parse_nodes(&text);
            }
        }
        panic!("no Cluster node answered CLUSTER NODES ({:?})", self.urls)
    }

    /// `CLUSTER NODES` as seen by the first node that answers.
    pub async fn nodes(&self) -> Vec<ClusterNode> {
        self.nodes_except(None).await
    }

    /// Whether every reachable node says `cluster_state:ok`.
    pub async fn state_ok(&self, except: Option<u16>) -> bool {
        for url in &self.urls {
            if except.is_some_and(|port| url.ends_with(&format!(":{port}"))) {
                continue;
            }
            let Ok(client) = redis::Client::open(url.as_str()) else {
                return false;
            };
            let connect = tokio::time::timeout(
                Duration::from_secs(1),
                client.get_multiplexed_async_connection(),
            );
            let Ok(Ok(mut connection)) = connect.await else {
                continue;
            };
            match command::<String>(&mut connection, &["CLUSTER", "INFO"]).await {
                Ok(info) if info.contains("cluster_state:ok") => {}
                _ => return false,
            }
        }
        true
    }

    /// Moves `slot` from master `from` to master `to` the way
    /// `redis-cli --cluster reshard` does (`SETSLOT IMPORTING/MIGRATING`,
    /// `MIGRATE` key by key with `pause` between keys, `SETSLOT NODE`), so
    /// clients see `ASK` and then `MOVED`. Returns the keys moved.
    ///
    /// # Panics
    ///
    /// When a step is refused.
    pub async fn migrate_slot(
        &self,
        slot: u16,
        from: &ClusterNode,
        to: &ClusterNode,
        pause: Duration,
    ) -> usize {
        let slot_text = slot.to_string();
        let mut source = admin(&from.url).await;
        let mut target = admin(&to.url).await;
        let _: () = command(
            &mut target,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from.id],
        )
        .await
        .expect("SETSLOT IMPORTING");
        let _: () = command(
            &mut source,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to.id],
        )
        .await
        .expect("SETSLOT MIGRATING");
        let port = to.port.to_string();
        let mut moved = 0;
        loop {
            let keys: Vec<String> =
                command(&mut source, &["CLUSTER", "GETKEYSINSLOT", &slot_text, "1"])
                    .await
                    .expect("GETKEYSINSLOT");
            let Some(key) = keys.first() else { break };
            let _: redis::Value = command(
                &mut source,
                &["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", key],
            )
            .await
            .expect("MIGRATE");
            moved += 1;
            tokio::time::sleep(pause).await;
        }
        for node in self.nodes().await.iter().filter(|n| n.master) {
            let mut connection = admin(&node.url).await;
            let _: () = command(
                &mut connection,
                &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to.id],
            )
            .await
            .expect("SETSLOT NODE");
        }
        moved
    }
}

/// A private Redis Cluster a test may break: `masters` masters and
/// `replicas` replicas (given to the masters in turn: the first master gets
/// the first replica), on free ports of 127.0.0.1, node timeout 1 s. Every
/// node is killed (and its directory removed) when dropped.
#[derive(Debug)]
pub struct OwnedCluster {
    nodes: Vec<OwnedRedis>,
    buses: Vec<u16>,
    dirs: Vec<PathBuf>,
}

impl OwnedCluster {
    /// Starts the nodes and joins them into a Cluster with all slots
    /// assigned and every replica in sync.
    ///
    /// # Panics
    ///
    /// When a node does not start or the Cluster does not form within
    /// 30 seconds.
    pub async fn start(masters: usize, replicas: usize) -> Self {
        let total = masters + replicas;
        let mut nodes = Vec::with_capacity(total);
        let mut dirs = Vec::with_capacity(total);
        let mut buses = Vec::with_capacity(total);
        for i in 0..total {
            let dir = std::env::temp_dir().join(format!(
                "portcullis-cluster-{}-{}-{i}",
                std::process::id(),
                free_port()
            ));
            std::fs::create_dir_all(&dir).expect("create a node directory");
            // Redis 7 takes the bus port as a setting; before it, the bus
            // port is always the client port + 10000. A node that exits at
            // start (a port taken since it was picked) is started again on
            // others.
            let with_cluster_port = crate::server_version().0 >= 7;
            let dir_text = dir.display().to_string();
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--dir",
                &dir_text,
                "--repl-diskless-sync-delay",
                "0",
            ];
            let mut bus_port = 0;
            let pick = || {
                if with_cluster_port {
                    let port = free_port();
                    let mut bus = free_port();
                    while bus == port {
                        bus = free_port();
                    }
                    bus_port = bus;
                    (port, vec!["--cluster-port".to_owned(), bus.to_string()])
                } else {
                    let port = crate::free_port_with_bus();
                    bus_port = port + 10_000;
                    (port, Vec::new())
                }
            };
            nodes.push(tokio::task::block_in_place(|| {
                OwnedRedis::start_anywhere(pick, &args)
            }));
            dirs.push(dir);
            buses.push(bus_port);
        }
        let cluster = Self { nodes, buses, dirs };
        cluster.form(masters).await;
        cluster
    }

    async fn form(&self, masters: usize) {
        let mut connections = Vec::new();
        let mut ids = Vec::new();
        for node in &self.nodes {
            let mut connection = admin(&node.url()).await;
            let id: String = command(&mut connection, &["CLUSTER", "MYID"])
                .await
                .expect("CLUSTER MYID");
            ids.push(id);
            connections.push(connection);
        }
        let per = 16_384 / masters;
        for (m, connection) in connections.iter_mut().enumerate().take(masters) {
            let start = m * per;
            let end = if m + 1 == masters {
                16_383
            } else {
                start + per - 1
            };
            let epoch = (m + 1).to_string();
            let _: () = command(connection, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch])
                .await
                .expect("SET-CONFIG-EPOCH");
            // ADDSLOTS with every slot, not ADDSLOTSRANGE: Redis 6.2 has
            // only the former.
            let slots: Vec<String> = (start..=end).map(|slot| slot.to_string()).collect();
            let mut addslots = vec!["CLUSTER", "ADDSLOTS"];
            addslots.extend(slots.iter().map(String::as_str));
            let _: () = command(connection, &addslots).await.expect("ADDSLOTS");
        }
        let first_bus = self.buses[0].to_string();
        let first_port = self.nodes[0].port().to_string();
        for connection in connections.iter_mut().skip(1) {
            let _: () = command(
                connection,
                &["CLUSTER", "MEET", "127.0.0.1", &first_port, &first_bus],
            )
            .await
            .expect("CLUSTER MEET");
        }
        let admin_urls: Vec<String> = self.nodes.iter().map(OwnedRedis::url).collect();
        let cluster = ClusterAdmin::new(admin_urls);
        let deadline = Instant::now() + Duration::from_secs(30);
        // Every node knows every other before replicas attach.
        loop {
            let mut known = true;
            for connection in &mut connections {
                let info: String = command(connection, &["CLUSTER", "INFO"])
                    .await
                    .expect("CLUSTER INFO");
                known &= info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()));
            }
            if known {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the Cluster nodes did not meet within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for (i, connection) in connections.iter_mut().enumerate().skip(masters) {
            let master = &ids[(i - masters) % masters];
            let _: () = command(connection, &["CLUSTER", "REPLICATE", master])
                .await
                .expect("CLUSTER REPLICATE");
        }
        loop {
            let mut ready = cluster.state_ok(None).await;
            for connection in connections.iter_mut().skip(masters) {
                let info: String = command(connection, &["INFO", "replication"])
                    .await
                    .expect("INFO replication");
                ready &= info.contains("master_link_status:up");
            }
            if ready {
                let nodes = cluster.nodes().await;
                let replicas = nodes.iter().filter(|n| !n.master).count();
                if replicas == self.nodes.len() - masters {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the Cluster did not form within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// URLs of every node.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(OwnedRedis::url).collect()
    }

    /// An admin for this Cluster.
    #[must_use]
    pub fn admin(&self) -> ClusterAdmin {
        ClusterAdmin::new(self.urls())
    }

    /// SIGKILLs the node on `port`.
    pub fn kill_port(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port() == port) {
            tokio::task::block_in_place(|| node.kill());
        }
    }
}

impl Drop for OwnedCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// How the master goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverHow {
    /// `CLUSTER FAILOVER` on its replica (graceful hand-over).
    Manual,
    /// The master is killed; its replica is promoted once the others mark
    /// it failed.
    Kill,
}

/// The failover scenario.
#[derive(Debug, Clone)]
pub struct Failover {
    /// Manual or by killing.
    pub how: FailoverHow,
    /// Store-level load.
    pub load: Load,
    /// Load before the failover.
    pub before: Duration,
    /// Load after the store recovered.
    pub after: Duration,
    /// Permits per subject (GCRA per day) in the checks of admission.
    pub limit: u64,
    /// The store's per-call timeout.
    pub store_timeout: Duration,
    /// Subjects kept for the whole scenario (half on the failed master),
    /// so that a permit charged on the failed master and lost with it is
    /// seen: [`ClusterReport::lost_permits`].
    pub fixed_subjects: usize,
}

/// Permits of the fixed subjects' policy: not exhausted in a run (each
/// subject is asked about 25 times a second per 8 senders), with one permit
/// refilled per 60 s, so that over a run shorter than that
/// `capacity - remaining` is exactly the permits charged.
const FIXED_LIMIT: u64 = 4_000;
const FIXED_PERIOD: Duration = Duration::from_secs(4_000 * 60);
/// Pause of each sender of the fixed subjects between two requests.
const FIXED_PACE: Duration = Duration::from_millis(5);

impl Failover {
    /// A short run for the test suite.
    #[must_use]
    pub fn quick(how: FailoverHow) -> Self {
        Self {
            how,
            load: Load {
                tasks: 8,
                pace: Duration::from_millis(2),
                slot: Duration::from_millis(250),
                per_slot: 24,
                prefix: format!("fo-{how:?}").to_lowercase(),
                hang: Duration::from_secs(5),
            },
            before: Duration::from_millis(500),
            after: Duration::from_millis(500),
            limit: 5,
            // The store's default: the recovery figure is what an
            // application that configures nothing sees.
            store_timeout: portcullis_redis::defaults::DEFAULT_TIMEOUT,
            fixed_subjects: 16,
        }
    }
}

/// What a Cluster scenario saw.
#[derive(Debug, Clone)]
pub struct ClusterReport {
    /// The table row.
    pub row: Row,
    /// Failed calls by kind.
    pub failures: BTreeMap<FailureKind, u64>,
    /// Failed calls for subjects on other masters (should be none).
    pub failures_elsewhere: u64,
    /// Calls that hung.
    pub hung: u64,
    /// Over- or under-admission.
    pub wrong_admission: u64,
    /// From the fault to the first decision for an affected subject.
    pub recovered: Option<Duration>,
    /// Successful decisions for affected subjects after the fault.
    pub affected_decisions_after: u64,
    /// Permits admitted to the fixed subjects but no longer charged in the
    /// store at the end (lost with a failed master: Redis replicates
    /// asynchronously, so a killed master may take acknowledged writes with
    /// it). Zero for scenarios without fixed subjects.
    pub lost_permits: u64,
    /// Permits charged to the fixed subjects beyond those admitted and
    /// those whose calls may have run (never expected: a double charge).
    pub overcharged: u64,
}

/// Admitted versus charged, per fixed subject: `(lost, overcharged, note)`.
async fn compare_fixed(
    store: &RedisStore,
    policy: &[Policy],
    subjects: &[String],
    calls: &[StoreCall],
    affected: impl Fn(&str) -> bool,
) -> (u64, u64, String) {
    use portcullis_core::Store as _;
    let (mut lost, mut over, mut admitted_total, mut charged_total) = (0, 0, 0, 0);
    let mut lost_subjects = 0;
    for subject in subjects {
        let mine = calls.iter().filter(|c| c.subject == *subject);
        let admitted = mine
            .clone()
            .filter(|c| c.outcome == Some(Outcome::Allowed))
            .count() as u64;
        let maybe = mine
            .filter(|c| match c.outcome {
                None | Some(Outcome::Cancelled) => true,
                Some(Outcome::Failed(kind)) => kind.may_have_run(),
                _ => false,
            })
            .count() as u64;
        let Ok(verdict) = store.peek(subject, policy).await else {
            continue;
        };
        let charged = FIXED_LIMIT - verdict.decisions()[0].remaining();
        admitted_total += admitted;
        charged_total += charged;
        if charged < admitted {
            lost += admitted - charged;
            lost_subjects += 1;
        }
        over += charged.saturating_sub(admitted + maybe);
    }
    let on_victim = subjects.iter().filter(|s| affected(s)).count();
    let note = format!(
        "{} fixed subjects for the whole run ({on_victim} on the failed master): {admitted_total} permits admitted, {charged_total} charged at the end; {lost} admitted permits lost (of {lost_subjects} subjects), {over} charged beyond admitted + maybe-run",
        subjects.len()
    );
    (lost, over, note)
}

fn tally(
    calls: &[StoreCall],
    from: Instant,
    affected: impl Fn(&str) -> bool,
    row: &mut Row,
) -> (BTreeMap<FailureKind, u64>, u64, u64) {
    let mut failures = BTreeMap::new();
    let mut elsewhere = 0;
    let mut hung = 0;
    type Sample = (u64, Option<String>, Duration, Duration);
    let mut samples: BTreeMap<(&str, FailureKind), Sample> = BTreeMap::new();
    for call in calls.iter().filter(|c| c.sent >= from) {
        match call.outcome {
            Some(Outcome::Failed(kind)) => {
                *failures.entry(kind).or_default() += 1;
                let place = if affected(&call.subject) {
                    "affected subject"
                } else {
                    elsewhere += 1;
                    "subject elsewhere"
                };
                let at = call.sent - from;
                let sample = samples.entry((place, kind)).or_insert((0, None, at, at));
                sample.0 += 1;
                if sample.1.is_none() {
                    sample.1.clone_from(&call.error);
                }
                sample.2 = sample.2.min(at);
                sample.3 = sample.3.max(at);
            }
            None => hung += 1,
            _ => {}
        }
    }
    for ((place, kind), (n, message, first, last)) in samples {
        row.note(format!(
            "{n} × {} for a {place}, sent from +{} to +{} after the fault started; first: {}",
            kind.as_str(),
            ms(first),
            ms(last),
            message.unwrap_or_default()
        ));
    }
    (failures, elsewhere, hung)
}

/// When an affected subject was first decided again after the outage: the
/// first decision among calls sent after the first failed one (or after
/// `fault_at` when none failed).
fn first_decision_after_outage(
    log: &[super::CallRecord],
    fault_at: Instant,
    affected: impl Fn(&str) -> bool,
) -> Option<Instant> {
    let relevant = |r: &&super::CallRecord| r.sent >= fault_at && affected(&r.subject);
    let first_failure = log
        .iter()
        .filter(relevant)
        .filter(|r| matches!(r.outcome, Outcome::Failed(_) | Outcome::Cancelled))
        .map(|r| r.sent)
        .min()
        .unwrap_or(fault_at);
    log.iter()
        .filter(relevant)
        .filter(|r| {
            r.sent >= first_failure && matches!(r.outcome, Outcome::Allowed | Outcome::Denied)
        })
        .map(|r| r.done)
        .min()
}

/// The first live master serving slots that has a live replica, with that
/// replica: the node [`cluster_failover`] fails over.
#[must_use]
pub fn master_with_replica(nodes: &[ClusterNode]) -> Option<(ClusterNode, ClusterNode)> {
    nodes
        .iter()
        .filter(|n| n.master && !n.failed && !n.slots.is_empty())
        .find_map(|m| {
            let replica = nodes
                .iter()
                .find(|r| r.master_id.as_deref() == Some(&m.id) && !r.failed)?;
            Some((m.clone(), replica.clone()))
        })
}

/// Fails over the master of a Cluster that has a replica while load runs
/// straight at a `RedisStore`, and checks every decision. `kill` stops a
/// node (used with [`FailoverHow::Kill`]).
///
/// # Panics
///
/// When no master has a replica, the store cannot be built, or the
/// replica is not promoted within 30 s.
pub async fn cluster_failover(
    cluster: &ClusterAdmin,
    config: &Failover,
    kill: impl FnOnce(&ClusterNode),
) -> ClusterReport {
    let nodes = cluster.nodes().await;
    let (victim, replica) = master_with_replica(&nodes).expect("a master with a replica");
    let masters: Vec<String> = nodes
        .iter()
        .filter(|n| n.master && !n.failed)
        .map(|n| n.url.clone())
        .collect();
    let store = RedisStore::builder()
        .cluster(masters)
        .timeout(config.store_timeout)
        .build()
        .await
        .expect("the store builds");
    let plain = store.clone();
    let counting = CountingStore::new(store);
    let stats = counting.stats();
    let policies: Arc<[Policy]> = Arc::new([Policy::per_day(config.limit)
        .name("failover")
        .build()
        .expect("valid policy")]);
    // The fixed subjects, half on the master that fails, and their policy;
    // the load alternates between them and the rotating subjects.
    let tag = crate::unique_prefix(&config.load.prefix);
    let on_victim = |s: &String| victim.serves(crc16_slot(s.as_bytes()));
    let half = config.fixed_subjects / 2;
    let candidates = (0u64..).map(|k| format!("{tag}-fixed-{k}"));
    let mut fixed: Vec<String> = candidates.clone().filter(on_victim).take(half).collect();
    fixed.extend(
        candidates
            .filter(|s| !on_victim(s))
            .take(config.fixed_subjects - half),
    );
    let fixed = Arc::new(fixed);
    let fixed_policy: Arc<[Policy]> = Arc::new([Policy::per(FIXED_LIMIT, FIXED_PERIOD)
        .name("failover-fixed")
        .build()
        .expect("valid policy")]);
    let counting = Arc::new(counting);
    let started = Instant::now();
    let running = start_store_load(
        &counting,
        &policies,
        &config.load,
        None::<&fn(usize, usize) -> String>,
    );
    let tasks = config.load.tasks;
    let fixed_subject = {
        let fixed = Arc::clone(&fixed);
        move |task: usize, n: usize| fixed[(task + n * tasks) % fixed.len().max(1)].clone()
    };
    let fixed_running = (!fixed.is_empty()).then(|| {
        let load = Load {
            pace: FIXED_PACE,
            ..config.load.clone()
        };
        start_store_load(
            &Arc::new(plain.clone()),
            &fixed_policy,
            &load,
            Some(&fixed_subject),
        )
    });
    tokio::time::sleep(config.before).await;

    let fault_at = Instant::now();
    match config.how {
        FailoverHow::Manual => {
            let mut connection = admin(&replica.url).await;
            let _: () = command(&mut connection, &["CLUSTER", "FAILOVER"])
                .await
                .expect("CLUSTER FAILOVER");
        }
        FailoverHow::Kill => kill(&victim),
    }
    let affected = |subject: &str| victim.serves(crc16_slot(subject.as_bytes()));
    let deadline = fault_at + Duration::from_secs(30);
    let promoted_at = loop {
        let now_nodes = cluster.nodes_except(Some(victim.port)).await;
        let promoted = now_nodes
            .iter()
            .any(|n| n.id == replica.id && n.master && !n.slots.is_empty());
        if promoted && cluster.state_ok(Some(victim.port)).await {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the replica was not promoted within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Keep the load on until an affected subject is decided again after the
    // outage: the first decision sent after the first failure (calls sent
    // just before the node died may still have been answered by it).
    let recovery_deadline = Instant::now() + Duration::from_secs(15);
    let recovered_at = loop {
        let recovered = first_decision_after_outage(&stats.log(), fault_at, affected);
        if recovered.is_some() || Instant::now() > recovery_deadline {
            break recovered;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(config.after).await;
    let calls = running.stop().await;
    let fixed_calls = match fixed_running {
        Some(running) => running.stop().await,
        None => Vec::new(),
    };
    let elapsed = started.elapsed();
    let (lost, overcharged, fixed_note) =
        compare_fixed(&plain, &fixed_policy, &fixed, &fixed_calls, |s| {
            victim.serves(crc16_slot(s.as_bytes()))
        })
        .await;

    let (name, action) = match config.how {
        FailoverHow::Manual => (
            "cluster manual failover",
            "CLUSTER FAILOVER on a replica under load",
        ),
        FailoverHow::Kill => (
            "cluster master killed",
            "master killed under load, replica promoted",
        ),
    };
    let after_fault = calls.iter().filter(|c| c.sent >= fault_at).count();
    let scenario = Scenario {
        calls: &calls,
        fault_at,
        elapsed,
        limit: config.limit,
        recovered: recovered_at.map(|t| t - fault_at),
    };
    let mut report = scenario.report(Row::new(name, action), affected, |failed, elsewhere, decisions| {
        format!(
            "replica promoted after {}; affected decisions (failed calls): {failed} of {after_fault} \
             ({elsewhere} on other masters); {decisions} decisions for the failed master's slots \
             after the fault",
            ms(promoted_at - fault_at),
        )
    });
    report.row.note(fixed_note);
    report.row.wrong += lost + overcharged;
    report.lost_permits = lost;
    report.overcharged = overcharged;
    report
}

/// The slot-migration scenario.
#[derive(Debug, Clone)]
pub struct SlotMigration {
    /// Store-level load (its `tasks`, `pace` and `hang` are used).
    pub load: Load,
    /// Subjects in the migrating slot.
    pub subjects: usize,
    /// Pause between two keys moved (how long clients see `ASK`).
    pub key_pause: Duration,
    /// Load before and after the migration.
    pub around: Duration,
    /// Permits per subject (GCRA per day).
    pub limit: u64,
    /// The store's per-call timeout.
    pub store_timeout: Duration,
}

impl SlotMigration {
    /// A short run for the test suite.
    #[must_use]
    pub fn quick() -> Self {
        Self {
            load: Load {
                tasks: 8,
                pace: Duration::from_millis(2),
                slot: Duration::from_millis(250),
                per_slot: 1,
                prefix: "mig".to_owned(),
                hang: Duration::from_secs(5),
            },
            subjects: 12,
            key_pause: Duration::from_millis(40),
            around: Duration::from_millis(400),
            limit: 50,
            store_timeout: Duration::from_millis(200),
        }
    }
}

/// Moves one slot between masters while load runs on subjects inside it
/// and elsewhere, and checks every decision.
///
/// # Panics
///
/// When the Cluster has fewer than two masters or a step fails.
pub async fn slot_migration(cluster: &ClusterAdmin, config: &SlotMigration) -> ClusterReport {
    let nodes = cluster.nodes().await;
    let masters: Vec<&ClusterNode> = nodes
        .iter()
        .filter(|n| n.master && !n.failed && !n.slots.is_empty())
        .collect();
    assert!(masters.len() >= 2, "slot migration needs two masters");
    let (from, to) = (masters[0].clone(), masters[1].clone());
    let slot = from.slots[0].0 + 7;
    let tag = format!("{}-{}", config.load.prefix, crate::unique_prefix("cluster"));
    let in_slot = Arc::new(subjects_in_slot(slot, config.subjects, &tag));
    let store = RedisStore::builder()
        .cluster(masters.iter().map(|n| n.url.clone()).collect::<Vec<_>>())
        .timeout(config.store_timeout)
        .build()
        .await
        .expect("the store builds");
    let counting = CountingStore::new(store);
    let stats = counting.stats();
    let policies: Arc<[Policy]> = Arc::new([Policy::per_day(config.limit)
        .name("migration")
        .build()
        .expect("valid policy")]);
    let subjects = Arc::clone(&in_slot);
    let tasks = config.load.tasks;
    let other_tag = tag.clone();
    let pick = move |task: usize, n: usize| {
        if n.is_multiple_of(2) {
            subjects[(task + n / 2 * tasks) % subjects.len()].clone()
        } else {
            format!("{other_tag}-other-{}", (task * 7 + n) % 64)
        }
    };
    let started = Instant::now();
    let running = start_store_load(&Arc::new(counting), &policies, &config.load, Some(&pick));
    tokio::time::sleep(config.around).await;
    let migration_started = Instant::now();
    let moved = cluster
        .migrate_slot(slot, &from, &to, config.key_pause)
        .await;
    let migration_ended = Instant::now();
    let in_slot_set: std::collections::HashSet<String> = in_slot.iter().cloned().collect();
    let affected = |subject: &str| in_slot_set.contains(subject);
    let recovery_deadline = Instant::now() + Duration::from_secs(10);
    let recovered_at = loop {
        let log = stats.log();
        let first = log
            .iter()
            .filter(|r| {
                r.sent >= migration_ended
                    && affected(&r.subject)
                    && matches!(r.outcome, Outcome::Allowed | Outcome::Denied)
            })
            .map(|r| r.done)
            .min();
        if first.is_some() || Instant::now() > recovery_deadline {
            break first;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(config.around).await;
    let calls = running.stop().await;
    let elapsed = started.elapsed();

    let during = calls
        .iter()
        .filter(|c| c.sent >= migration_started && c.sent < migration_ended)
        .count();
    let row = Row::new(
        "cluster slot migration",
        format!("slot {slot} ({moved} keys) moved key by key under load (ASK, then MOVED)"),
    );
    let scenario = Scenario {
        calls: &calls,
        fault_at: migration_started,
        elapsed,
        limit: config.limit,
        recovered: recovered_at.map(|t| t.saturating_duration_since(migration_ended)),
    };
    scenario.report(row, affected, |failed, elsewhere, decisions| {
        format!(
            "migration took {}; {during} calls during it; affected decisions (failed calls): \
             {failed} ({elsewhere} outside the slot); {decisions} decisions in the slot after it \
             started",
            ms(migration_ended - migration_started),
        )
    })
}

/// How a Cluster scenario's load went, to be judged into its report.
struct Scenario<'a> {
    /// Every call of the load.
    calls: &'a [StoreCall],
    /// When the fault (failover, migration) started.
    fault_at: Instant,
    /// How long the load ran.
    elapsed: Duration,
    /// Permits per subject (GCRA per day).
    limit: u64,
    /// From the fault to the first decision for an affected subject.
    recovered: Option<Duration>,
}

impl Scenario<'_> {
    /// Judges the calls into `row` and the report. `note` is given the
    /// failed calls, those failed for subjects elsewhere, and the decisions
    /// for affected subjects after the fault.
    fn report(
        &self,
        mut row: Row,
        affected: impl Fn(&str) -> bool + Copy,
        note: impl FnOnce(u64, u64, u64) -> String,
    ) -> ClusterReport {
        let calls = self.calls;
        let mut details = Row::default();
        let (failures, failures_elsewhere, hung) =
            tally(calls, self.fault_at, affected, &mut details);
        let allowance =
            super::gcra_allowance(self.limit, Duration::from_secs(86_400), self.elapsed);
        let admission = judge_calls(calls, self.limit, allowance);
        let affected_decisions_after = calls
            .iter()
            .filter(|c| {
                c.sent >= self.fault_at
                    && affected(&c.subject)
                    && matches!(c.outcome, Some(Outcome::Allowed | Outcome::Denied))
            })
            .count() as u64;
        row.tried = calls.len() as u64;
        for (kind, n) in &failures {
            row.fail(kind.as_str(), *n);
        }
        row.fail("hung", hung);
        row.wrong = admission.wrong() + hung;
        row.recover = self.recovered;
        row.note(note(
            failures.values().sum::<u64>(),
            failures_elsewhere,
            affected_decisions_after,
        ));
        row.notes.append(&mut details.notes);
        ClusterReport {
            row,
            failures,
            failures_elsewhere,
            hung,
            wrong_admission: admission.wrong(),
            recovered: self.recovered,
            affected_decisions_after,
            lost_permits: 0,
            overcharged: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_redis_reference() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16_slot(b"123456789"), 0x31c3); // below 16384: no reduction
        assert_eq!(crc16_slot(b"foo"), 12_182);
        assert_eq!(crc16_slot(b"{user1000}.following"), crc16_slot(b"user1000"));
        assert_eq!(crc16_slot(b"foo{{bar}}zap"), crc16_slot(b"{bar"));
    }

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected\n\
                    e7d1 127.0.0.1:30001@31001,host myself,master - 0 0 1 connected 0-5460 6000 [5461->-abc]\n\
                    ffff 127.0.0.1:30002@31002 master,fail - 0 0 2 disconnected\n";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert!(!nodes[0].master && nodes[0].master_id.as_deref() == Some("e7d1"));
        assert_eq!(nodes[1].slots, vec![(0, 5460), (6000, 6000)]);
        assert!(nodes[1].serves(6000) && !nodes[1].serves(5461));
        assert!(nodes[2].failed && nodes[2].port == 30002);
    }
}
