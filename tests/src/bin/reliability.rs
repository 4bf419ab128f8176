//! `cargo xtask reliability`: runs every reliability and abuse scenario at
//! a larger scale than the test suite and prints one table: scenario, what
//! was done, requests tried, failures by kind, wrong decisions (must be 0),
//! time to recover. Exits 1 when any decision was wrong.
//!
//! Needs (as `cargo xtask reliability` sets them): `PORTCULLIS_REDIS_URL`
//! (a standalone server), `PORTCULLIS_REDIS_CLUSTER_NODE_URLS` (every node of
//! a Cluster whose masters have replicas; it kills masters) and
//! `redis-server` (`PORTCULLIS_REDIS_SERVER` or PATH) for servers of its own
//! (the `sentinel` scenario starts a primary, a replica and three
//! Sentinels). Run with `cargo xtask reliability`; `RELIABILITY_ONLY=a,b`
//! picks scenarios (`killed`, `slow`, `pool`, `cluster`, `abuse`,
//! `sentinel`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use portcullis_core::{MemoryStore, WhenFull};
use portcullis_redis::RedisStore;
use portcullis_tests::reliability::{
    admin, cluster_failover, command, fill_past_maxmemory, hot_subject, info_field, ipv6_rotation,
    key_flood, kill_restart, master_with_replica, pool_exhaustion, sentinel_failover,
    slot_migration, slow_redis, spoofed_forwarded_for, table, ClusterAdmin, ClusterNode, Failover,
    FailoverHow, FailureMode, HotSubject, KillRestart, Load, Row, SentinelFault, SlotMigration,
    SlowRedis, Slowdown,
};
use portcullis_tests::{redis_url, OwnedRedis};

fn node_urls() -> Vec<String> {
    std::env::var("PORTCULLIS_REDIS_CLUSTER_NODE_URLS")
        .or_else(|_| std::env::var("PORTCULLIS_REDIS_CLUSTER_URLS"))
        .unwrap_or_else(|_| {
            panic!("PORTCULLIS_REDIS_CLUSTER_NODE_URLS is not set: run `cargo xtask reliability`, which starts a Cluster with replicas")
        })
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// Whether the scenario group `name` runs: all by default, or those named
/// in `RELIABILITY_ONLY` (comma-separated: `killed`, `slow`, `pool`,
/// `cluster`, `abuse`).
fn wanted(name: &str) -> bool {
    std::env::var("RELIABILITY_ONLY").map_or(true, |only| only.split(',').any(|o| o.trim() == name))
}

fn step(name: &str) {
    eprintln!("reliability: {name} ...");
}

/// SIGKILLs the process of a Cluster node (a process `cargo xtask
/// reliability` started), found by the `process_id` it reports.
async fn kill_node(node: &ClusterNode) {
    let mut connection = admin(&node.url).await;
    let server: String = command(&mut connection, &["INFO", "server"])
        .await
        .expect("INFO server");
    let pid = info_field(&server, "process_id")
        .expect("process_id in INFO")
        .to_owned();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -9 {pid} failed");
}

async fn cluster_kill(cluster: &ClusterAdmin, config: &Failover) -> Row {
    // Find the victim first (the scenario picks the same one: the first
    // master with a live replica) so its process can be killed by pid.
    let (victim, _) = master_with_replica(&cluster.nodes().await).expect("a master with a replica");
    let handle = tokio::runtime::Handle::current();
    let report = cluster_failover(cluster, config, |node| {
        assert_eq!(node.id, victim.id);
        tokio::task::block_in_place(|| handle.block_on(kill_node(node)));
    })
    .await;
    report.row
}

async fn killed(rows: &mut Vec<Row>) {
    for mode in [
        FailureMode::Open,
        FailureMode::Closed,
        FailureMode::Fallback,
    ] {
        step(&format!("Redis killed under load ({})", mode.as_str()));
        let mut server = tokio::task::block_in_place(|| OwnedRedis::start(&[]));
        let quick = KillRestart::quick(mode);
        let config = KillRestart {
            load: Load {
                tasks: 32,
                per_slot: 16,
                ..quick.load.clone()
            },
            before: Duration::from_secs(2),
            down: Duration::from_secs(3),
            after: Duration::from_secs(3),
            ..quick
        };
        rows.push(kill_restart(&mut server, &config).await.row);
    }
}

async fn slow(rows: &mut Vec<Row>) {
    let cases: [(Slowdown, &[&str]); 2] = [
        (Slowdown::ClientPause, &[]),
        (Slowdown::DebugSleep, portcullis_tests::debug_command_args()),
    ];
    for (how, args) in cases {
        step(&format!("slow Redis ({how:?})"));
        let server = tokio::task::block_in_place(|| OwnedRedis::start(args));
        // The store's and the layer's defaults: the recovery figure is what
        // an application that configures nothing sees.
        // A stall long enough for the breaker to open (5 timeouts of 250 ms)
        // and answer locally, and to probe again after its 1 s pause.
        let config = SlowRedis {
            stall: Duration::from_secs(4),
            requests: 5_000,
            store_timeout: portcullis_redis::defaults::DEFAULT_TIMEOUT,
            layer_timeout: portcullis_tower::rate_limit::DEFAULT_CHECK_TIMEOUT,
            breaker: (
                portcullis_tower::rate_limit::DEFAULT_BREAKER_THRESHOLD,
                portcullis_tower::rate_limit::DEFAULT_BREAKER_PAUSE,
            ),
            ..SlowRedis::quick(how)
        };
        rows.push(slow_redis(&server, &config).await.row);
    }
}

async fn cluster(rows: &mut Vec<Row>) {
    let cluster = ClusterAdmin::new(node_urls());
    step("Cluster slot migration");
    let migration = SlotMigration {
        load: Load {
            tasks: 16,
            ..SlotMigration::quick().load
        },
        subjects: 40,
        around: Duration::from_secs(1),
        ..SlotMigration::quick()
    };
    rows.push(slot_migration(&cluster, &migration).await.row);

    let failover = |how| {
        let quick = Failover::quick(how);
        Failover {
            load: Load {
                tasks: 16,
                per_slot: 64,
                ..quick.load.clone()
            },
            before: Duration::from_secs(2),
            after: Duration::from_secs(2),
            ..quick
        }
    };
    step("Cluster manual failover");
    rows.push(
        cluster_failover(&cluster, &failover(FailoverHow::Manual), |_| {})
            .await
            .row,
    );
    step("Cluster master killed (cluster-require-full-coverage yes, the default)");
    let mut row = cluster_kill(&cluster, &failover(FailoverHow::Kill)).await;
    row.scenario.push_str(" (full coverage)");
    rows.push(row);
    step("Cluster master killed (cluster-require-full-coverage no)");
    for node in cluster.nodes().await.iter().filter(|n| !n.failed) {
        if let Ok(client) = redis::Client::open(node.url.as_str())
            && let Ok(mut connection) = client.get_multiplexed_async_connection().await
        {
            let _: redis::RedisResult<()> = command(
                &mut connection,
                &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
            )
            .await;
        }
    }
    let mut row = cluster_kill(&cluster, &failover(FailoverHow::Kill)).await;
    row.scenario.push_str(" (partial coverage)");
    rows.push(row);
}

async fn abuse(rows: &mut Vec<Row>) {
    step("hot abusive subject");
    let server = tokio::task::block_in_place(|| OwnedRedis::start(&[]));
    let hot = HotSubject {
        hot_requests: 20_000,
        concurrency: 32,
        hot_rate: 4_000,
        others: 100,
        other_requests: 20,
        other_pace: Duration::from_millis(250),
        ..HotSubject::quick()
    };
    rows.push(hot_subject(&server.url(), &hot).await.row);

    step("spoofed client IP and rotating IPv6");
    let store = |what: &'static str| async move {
        RedisStore::builder()
            .url(redis_url())
            .prefix(portcullis_tests::unique_prefix(&format!("rel-{what}")))
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("the store builds")
    };
    rows.push(spoofed_forwarded_for(store("spoof").await, 2_000, 10).await);
    rows.push(ipv6_rotation(store("v6").await, 2_000, 10).await);

    step("key flood into full stores");
    let memory = MemoryStore::builder().max_keys(1_000).build();
    rows.push(key_flood(memory, "memory, max_keys 1000, evicting", 2_000, async {}).await);
    let memory = MemoryStore::builder()
        .max_keys(1_000)
        .when_full(WhenFull::Deny)
        .build();
    rows.push(key_flood(memory, "memory, max_keys 1000, denying", 2_000, async {}).await);
    let full =
        tokio::task::block_in_place(|| OwnedRedis::start(&["--maxmemory-policy", "noeviction"]));
    let redis = RedisStore::builder()
        .url(full.url())
        .build()
        .await
        .expect("the store builds");
    let url = full.url();
    rows.push(
        key_flood(redis, "Redis at maxmemory, noeviction", 2_000, async move {
            fill_past_maxmemory(&url).await;
        })
        .await,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    let started = Instant::now();
    let mut rows = Vec::new();
    if wanted("killed") {
        killed(&mut rows).await;
    }
    if wanted("slow") {
        slow(&mut rows).await;
    }
    if wanted("pool") {
        step("pool exhausted");
        rows.push(pool_exhaustion(500).await.row);
    }
    if wanted("cluster") {
        cluster(&mut rows).await;
    }
    if wanted("abuse") {
        abuse(&mut rows).await;
    }
    if wanted("sentinel") {
        for fault in [SentinelFault::PlannedFailover, SentinelFault::KillPrimary] {
            step(&format!("Sentinel: {fault:?}"));
            rows.push(sentinel_failover(fault, 200, 200).await.row);
        }
    }

    println!("\n{}", table(&rows));
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    println!(
        "{} scenarios in {:.0} s; wrong decisions: {wrong}",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
