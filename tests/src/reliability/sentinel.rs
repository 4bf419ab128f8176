//! Sentinel failover: a store built with `.sentinel(..)` on a private
//! [`OwnedSentinelSet`] keeps deciding while the primary is failed over
//! (`SENTINEL FAILOVER`) or killed, and the time to the first correct
//! decision on the new primary is measured.
//!
//! Ground truth: one subject, a GCRA policy of `LIMIT` per hour on a
//! frozen client clock, so every admitted check lowers `remaining` by
//! exactly one. After `admitted` admissions and `unknown` calls that may
//! have run (timeouts, broken connections), a correct answer has
//! `LIMIT - admitted - unknown - 1 <= remaining <= LIMIT - admitted - 1`;
//! a higher `remaining` is a lost write (more permits than the policy
//! allows), a lower one a charge nobody made. Redis replicates
//! asynchronously, so writes acknowledged by a primary just before it dies
//! can be lost by any Redis failover; the scenario quiesces at the fault
//! (waits for the replica to hold every write; pauses writes before a
//! planned failover, as an operator does) so what it measures is the
//! store's own following, which must lose nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis_core::{Clock as _, ManualClock, Policy, Store, StoreError, SystemClock};
use portcullis_redis::{ClockMode, RedisStore};

use super::report::Row;
use crate::{unique_prefix, OwnedSentinelSet};

/// The policy's limit (never reached: the scenario tests counting).
const LIMIT: u64 = 1_000_000;
/// The most the store may take to follow the failover.
const RECOVERY_BOUND: Duration = Duration::from_secs(60);

/// How the primary goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentinelFault {
    /// `CLIENT PAUSE WRITE` on the primary, then `SENTINEL FAILOVER`.
    PlannedFailover,
    /// SIGKILL of the primary; the Sentinels promote the replica.
    KillPrimary,
}

/// What [`sentinel_failover`] saw.
#[derive(Debug)]
pub struct SentinelReport {
    /// The table row (wrong decisions must be 0).
    pub row: Row,
    /// Time from the fault to the first correct decision on the new
    /// primary, if the store recovered within a minute.
    pub recovered: Option<Duration>,
    /// Checks after the recovery that failed (must be 0).
    pub failed_after: u64,
    /// Whether the subject's key was found on the new primary afterwards.
    pub key_on_new_primary: bool,
}

/// Counts, for the ground truth.
#[derive(Debug, Default)]
struct Truth {
    admitted: u64,
    unknown: u64,
    wrong: u64,
}

impl Truth {
    fn judge(&mut self, remaining: u64) {
        let most = LIMIT - self.admitted - 1;
        let least = most.saturating_sub(self.unknown);
        if remaining > most || remaining < least {
            self.wrong += 1;
        }
        // The answer says how many were charged: from here on it is known.
        self.admitted = LIMIT - remaining;
        self.unknown = 0;
    }
}

/// Runs the scenario: `before` checks, the fault, checks until one
/// succeeds (the recovery), then `after` checks.
///
/// # Panics
///
/// When the Sentinel set cannot be started or the store cannot be built.
pub async fn sentinel_failover(fault: SentinelFault, before: u64, after: u64) -> SentinelReport {
    let mut set = tokio::task::block_in_place(OwnedSentinelSet::start);
    let clock = Arc::new(ManualClock::new(SystemClock.now_micros() + 86_400_000_000));
    let prefix = unique_prefix("sentinel");
    let store = RedisStore::builder()
        .sentinel(set.master_name(), set.sentinel_urls())
        .prefix(&prefix)
        .timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .clock(ClockMode::Client(clock))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .unwrap_or_else(|e| panic!("the Sentinel store should build: {e}"));
    let policy = [Policy::per(LIMIT, Duration::from_secs(3600))
        .name("sentinel")
        .build()
        .expect("a valid policy")];
    let action = match fault {
        SentinelFault::PlannedFailover => "SENTINEL FAILOVER (writes paused)",
        SentinelFault::KillPrimary => "kill -9 the primary",
    };
    let mut row = Row::new(
        match fault {
            SentinelFault::PlannedFailover => "sentinel failover",
            SentinelFault::KillPrimary => "sentinel kill",
        },
        action,
    );
    let mut truth = Truth::default();
    let mut check = |result: Result<portcullis_core::Verdict, StoreError>, row: &mut Row| {
        row.tried += 1;
        match result {
            Ok(verdict) => {
                match verdict.decisions().first() {
                    Some(decision) if decision.is_allowed() => truth.judge(decision.remaining()),
                    _ => truth.wrong += 1, // never denied below the limit
                }
                true
            }
            Err(error) => {
                let kind = match &error {
                    StoreError::Timeout { .. } => "timeout",
                    StoreError::OutcomeUnknown { .. } => "outcome unknown",
                    StoreError::Unavailable { .. } => "unavailable",
                    _ => "other",
                };
                if matches!(kind, "timeout" | "outcome unknown") {
                    truth.unknown += 1;
                }
                if kind == "other" {
                    truth.wrong += 1;
                }
                row.fail(kind, 1);
                false
            }
        }
    };
    for _ in 0..before {
        let result = store.check("subject", &policy, 1).await;
        check(result, &mut row);
    }
    tokio::task::block_in_place(|| set.wait_replica_synced());
    let old = match fault {
        SentinelFault::PlannedFailover => tokio::task::block_in_place(|| {
            set.pause_primary_writes(Duration::from_secs(10));
            set.wait_replica_synced();
            set.sentinel_failover()
        }),
        SentinelFault::KillPrimary => tokio::task::block_in_place(|| set.kill_primary()),
    };
    let faulted = Instant::now();
    let mut recovered = None;
    while faulted.elapsed() < RECOVERY_BOUND {
        let result = store.check("subject", &policy, 1).await;
        if check(result, &mut row) {
            recovered = Some(faulted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut failed_after = 0;
    for _ in 0..after {
        let result = store.check("subject", &policy, 1).await;
        if !check(result, &mut row) {
            failed_after += 1;
        }
    }
    let new_primary = tokio::task::block_in_place(|| set.wait_new_primary(old));
    let key = store.key_for("subject", "sentinel");
    let key_on_new_primary = redis::Client::open(format!("redis://127.0.0.1:{new_primary}"))
        .and_then(|client| client.get_connection())
        .and_then(|mut conn| redis::cmd("EXISTS").arg(&key).query::<bool>(&mut conn))
        .unwrap_or(false);
    row.wrong = truth.wrong + failed_after;
    row.recover = recovered;
    row.note(format!(
        "{}: primary {old} -> {new_primary}; first correct decision {} after the fault",
        row.scenario,
        recovered.map_or_else(|| "never".to_owned(), |d| format!("{} ms", d.as_millis()))
    ));
    SentinelReport {
        row,
        recovered,
        failed_after,
        key_on_new_primary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truth_flags_lost_writes_and_phantom_charges() {
        let mut truth = Truth::default();
        truth.judge(LIMIT - 1);
        truth.judge(LIMIT - 2);
        assert_eq!(truth.wrong, 0);
        // A lost write: remaining goes back up.
        truth.judge(LIMIT - 2);
        assert_eq!(truth.wrong, 1);
        // One call of unknown outcome: either answer is right.
        truth.unknown = 1;
        truth.judge(LIMIT - 4);
        assert_eq!(truth.wrong, 1);
        // A charge nobody made.
        truth.judge(LIMIT - 8);
        assert_eq!(truth.wrong, 2);
    }
}
