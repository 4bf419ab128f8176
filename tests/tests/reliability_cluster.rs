//! Redis Cluster faults under load, on a private Cluster this test starts
//! (three masters and one replica) because it breaks it: a slot migrated
//! key by key (clients see ASK, then MOVED), a manual failover, and a
//! master killed so that its replica is promoted. Decisions continue; the
//! affected ones are counted and printed; none is wrong. `cargo xtask
//! reliability` runs the same scenarios on a 3+3 Cluster and prints the
//! table.

use std::time::Duration;

use tollgate_tests::reliability::{
    cluster_failover, no_hang, slot_migration, table, ClusterReport, Failover, FailoverHow,
    OwnedCluster, SlotMigration,
};

fn check(report: &ClusterReport, what: &str) {
    println!("{}", table(std::slice::from_ref(&report.row)));
    assert_eq!(report.hung, 0, "{what}: no call hangs");
    assert_eq!(
        report.wrong_admission, 0,
        "{what}: no subject over- or under-admitted"
    );
    assert!(
        report
            .failures
            .keys()
            .all(|k| !matches!(k.as_str(), "protocol" | "other")),
        "{what}: every failure is a typed backend error: {:?}",
        report.failures
    );
    assert!(
        report.recovered.is_some(),
        "{what}: the affected subjects are decided again"
    );
    assert!(
        report.affected_decisions_after > 0,
        "{what}: decisions continue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_slot_migration_and_failovers_under_load() {
    let mut cluster = OwnedCluster::start(3, 1).await;
    let admin = cluster.admin();

    let migration = no_hang(
        Duration::from_secs(60),
        "the slot migration",
        slot_migration(&admin, &SlotMigration::quick()),
    )
    .await;
    check(&migration, "slot migration");
    assert_eq!(
        migration.failures_elsewhere, 0,
        "subjects outside the migrating slot are not affected"
    );

    let manual = no_hang(
        Duration::from_secs(60),
        "the manual failover",
        cluster_failover(&admin, &Failover::quick(FailoverHow::Manual), |_| {}),
    )
    .await;
    check(&manual, "manual failover");

    // The former replica is now the master with a replica: kill it.
    let killed = no_hang(
        Duration::from_secs(90),
        "the failover after a kill",
        cluster_failover(&admin, &Failover::quick(FailoverHow::Kill), |node| {
            cluster.kill_port(node.port)
        }),
    )
    .await;
    check(&killed, "master killed");
}

/// Known limitation of tollgate-redis, kept as a failing test for whoever
/// fixes it (run with `--ignored`): during a slot migration, a check whose
/// keys have already moved gets `-ASK <slot> <node>`, which proves the
/// script did not run, yet the store reports `StoreError::Unavailable`
/// instead of following it (`ASKING` + `EVALSHA` on the target node); the
/// Cluster client is built with `retries(0)`, so the redis crate does not
/// follow it either. Every such decision falls to the failure policy until
/// the migration ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "tollgate-redis does not follow ASK redirects yet (see the doc comment)"]
async fn slot_migration_costs_no_decision() {
    let cluster = OwnedCluster::start(3, 0).await;
    let report = no_hang(
        Duration::from_secs(60),
        "the slot migration",
        slot_migration(&cluster.admin(), &SlotMigration::quick()),
    )
    .await;
    println!("{}", table(std::slice::from_ref(&report.row)));
    assert!(
        report.failures.is_empty(),
        "a slot migration should cost no decision: {:?}",
        report.failures
    );
}
