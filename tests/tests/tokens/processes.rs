//! Reservations across OS processes on one Redis (`reservation_worker`):
//! three processes reserving and settling at once never charge past the
//! budget and the documented overage bound; a process killed while it
//! holds reservations gives its places back after their TTL.

use std::process::{Command, Stdio};
use std::time::Duration;

use portcullis_core::{
    Clock, Policy, Refusal, ReservationId, ReservationStore, Store, TokenBudget,
};
use portcullis_tests::unique_prefix;

use crate::redis_common::{self, client, manual_clock};

const TOKENS: u64 = 1_000;
const MAX_IN_FLIGHT: u64 = 6;
const MAX_OVERAGE: u64 = 40;

fn worker(mode: &str, prefix: &str, now_us: u64, seed: u64) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_reservation_worker"));
    command
        .arg(mode)
        .args(["--url", &portcullis_tests::redis_url()])
        .args(["--prefix", prefix, "--now-us", &now_us.to_string()])
        .args(["--tokens", &TOKENS.to_string()])
        .args(["--max-in-flight", &MAX_IN_FLIGHT.to_string()])
        .args(["--max-overage", &MAX_OVERAGE.to_string()])
        .args(["--seed", &seed.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn budget() -> TokenBudget {
    TokenBudget::tokens(Policy::per_hour(TOKENS).name("tokens").build().unwrap())
        .max_in_flight(MAX_IN_FLIGHT)
        .max_overage(MAX_OVERAGE)
        .reservation_ttl(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test]
async fn three_processes_never_charge_past_the_budget_and_the_overage_bound() {
    let clock = manual_clock();
    let prefix = unique_prefix("rsv-procs");
    let children: Vec<_> = (0..3)
        .map(|seed| {
            worker("load", &prefix, clock.now_micros(), seed)
                .spawn()
                .expect("the reservation_worker binary should start")
        })
        .collect();
    let (mut charged, mut overage, mut admitted) = (0, 0, 0);
    for child in children {
        let output = child.wait_with_output().expect("the worker should finish");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "reservation_worker failed: {stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let field = |name: &str| -> u64 {
            stdout
                .split_whitespace()
                .find_map(|part| part.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {stdout:?}"))
        };
        charged += field("charged");
        overage += field("overage");
        admitted += field("admitted");
    }
    assert!(
        overage > 0 && admitted > 3,
        "overage {overage}, admitted {admitted}"
    );
    assert!(
        charged <= TOKENS + MAX_IN_FLIGHT * MAX_OVERAGE,
        "{charged} charged against {TOKENS} and a bound of {} more",
        MAX_IN_FLIGHT * MAX_OVERAGE
    );
    let store = redis_common::standalone(&prefix, client(&clock)).await;
    let left = store
        .peek("key-1", budget().token_policies())
        .await
        .unwrap()
        .decisions()[0]
        .remaining();
    assert_eq!(left, TOKENS.saturating_sub(charged), "{charged} charged");
}

#[tokio::test]
async fn a_killed_process_gives_its_places_back_after_the_ttl() {
    let clock = manual_clock();
    let prefix = unique_prefix("rsv-killed");
    let mut child = worker("hold", &prefix, clock.now_micros(), 0)
        .spawn()
        .expect("the reservation_worker binary should start");
    let mut stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(&mut stdout, 5), &mut line)
        .expect("the worker's output");
    assert_eq!(line, "held\n", "the worker holds its reservations");
    child.kill().expect("the worker is killed");
    let _ = child.wait();
    let store = redis_common::standalone(&prefix, client(&clock)).await;
    let budget = budget();
    let refused = store
        .reserve("key-1", &budget, 10, ReservationId::generate())
        .await
        .unwrap();
    assert_eq!(
        refused.refusal(),
        Some(Refusal::InFlight { max: MAX_IN_FLIGHT })
    );
    clock.advance(Duration::from_secs(30));
    let after = store
        .reserve("key-1", &budget, 10, ReservationId::generate())
        .await
        .unwrap();
    assert!(after.is_admitted(), "{after:?}");
    assert_eq!(after.in_flight(), 1);
    // Its estimates stay charged: 6 × 100, and 10 now.
    assert_eq!(
        after.verdict().decisions()[0].remaining(),
        TOKENS - 600 - 10 + 8
    );
}
