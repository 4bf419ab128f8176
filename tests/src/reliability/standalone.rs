//! Faults of a standalone server: killed and restarted, slow, and a pool
//! that cannot get a connection.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis_core::{Algorithm, MemoryStore, Policy, Store, StoreError, Verdict};
use portcullis_redis::RedisStore;
use portcullis_tower::{FailurePolicy, RateLimitLayer};
use tokio::net::TcpListener;
use tower::Layer;

use super::counting::{CountingStore, FailureKind, Outcome};
use super::load::{
    judge_admission, percentile, probe_service, request_for, send, start_layer_load, subject_key,
    Load, Reply, ReplyCounts,
};
use super::report::{ms, Row};
use super::{admin, command, command_calls, info};
use crate::OwnedRedis;

/// The failure policy a scenario configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// `FailurePolicy::FailOpen`.
    Open,
    /// `FailurePolicy::FailClosed`.
    Closed,
    /// `FailurePolicy::Fallback` to a fresh `MemoryStore`.
    Fallback,
}

impl FailureMode {
    /// The name used in tables.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "fail-open",
            Self::Closed => "fail-closed",
            Self::Fallback => "fallback",
        }
    }

    fn policy(self) -> FailurePolicy {
        match self {
            Self::Open => FailurePolicy::FailOpen,
            Self::Closed => FailurePolicy::FailClosed,
            Self::Fallback => FailurePolicy::fallback(MemoryStore::new()),
        }
    }

    /// Whether `reply` is one this policy may give while the store is down.
    #[must_use]
    pub fn allows_during_outage(self, reply: Reply) -> bool {
        match (self, reply) {
            // The deny cache keeps denying subjects the store denied.
            (_, Reply::Limited) => true,
            (Self::Open, Reply::Passed) => true,
            (Self::Closed, Reply::Closed) => true,
            (Self::Fallback, Reply::Admitted) => true,
            _ => false,
        }
    }
}

/// The "Redis killed during load, then restarted" scenario.
#[derive(Debug, Clone)]
pub struct KillRestart {
    /// The layer's failure policy.
    pub mode: FailureMode,
    /// The load (through the layer).
    pub load: Load,
    /// Load before the kill.
    pub before: Duration,
    /// How long the server stays down.
    pub down: Duration,
    /// Load after the restart.
    pub after: Duration,
    /// Permits per subject (GCRA, per day: no refill within a run).
    pub limit: u64,
    /// The store's per-call timeout.
    pub store_timeout: Duration,
    /// The layer's check timeout (above the store's, so the store's typed
    /// errors are what the layer sees).
    pub layer_timeout: Duration,
    /// Circuit breaker: failures that open it, and its pause.
    pub breaker: (u32, Duration),
}

impl KillRestart {
    /// A short run for the test suite.
    #[must_use]
    pub fn quick(mode: FailureMode) -> Self {
        Self {
            mode,
            load: Load {
                tasks: 8,
                pace: Duration::from_millis(2),
                slot: Duration::from_millis(200),
                per_slot: 6,
                prefix: format!("kr-{}", mode.as_str()),
                hang: Duration::from_secs(5),
            },
            before: Duration::from_millis(600),
            down: Duration::from_millis(1_200),
            after: Duration::from_millis(1_500),
            limit: 5,
            // The defaults of the store and the layer: recovery figures are
            // what an application that configures nothing sees.
            store_timeout: portcullis_redis::defaults::DEFAULT_TIMEOUT,
            layer_timeout: portcullis_tower::rate_limit::DEFAULT_CHECK_TIMEOUT,
            breaker: (
                portcullis_tower::rate_limit::DEFAULT_BREAKER_THRESHOLD,
                portcullis_tower::rate_limit::DEFAULT_BREAKER_PAUSE,
            ),
        }
    }
}

/// What [`kill_restart`] saw.
#[derive(Debug, Clone)]
pub struct KillRestartReport {
    /// The table row.
    pub row: Row,
    /// Replies to requests sent while the server was down.
    pub outage: ReplyCounts,
    /// All replies.
    pub all: ReplyCounts,
    /// Store calls by outcome.
    pub store: BTreeMap<String, u64>,
    /// Replies during the outage the failure policy does not allow.
    pub policy_violations: u64,
    /// Over- or under-admission by the store or the fallback.
    pub admission_errors: u64,
    /// Restart to the first decision the store made again.
    pub recovered: Option<Duration>,
    /// From the restart to the first admitted answer over HTTP (`None`
    /// with a fallback, whose admissions look the same).
    pub recovered_http: Option<Duration>,
    /// `FUNCTION LOAD`s and `SCRIPT LOAD`s the restarted server received
    /// (the store reloading its library or scripts after "Function not
    /// found" or `NOSCRIPT`).
    pub script_loads: u64,
    /// Successful store decisions after the restart.
    pub decisions_after: u64,
    /// Slowest answer to a request sent during the outage.
    pub slowest_outage_reply: Duration,
}

/// Runs load through a `RateLimitLayer` over `RedisStore` on `server`,
/// SIGKILLs the server, keeps it down, restarts it, and checks every
/// answer.
///
/// # Panics
///
/// When the store or layer cannot be built, or the server cannot be
/// restarted.
pub async fn kill_restart(server: &mut OwnedRedis, config: &KillRestart) -> KillRestartReport {
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(config.store_timeout)
        .connect_timeout(config.store_timeout)
        .build()
        .await
        .expect("the store builds");
    warm_up(&store).await;
    let counting = CountingStore::new(store);
    let stats = counting.stats();
    let policy = Policy::per_day(config.limit)
        .name("kill-restart")
        .build()
        .expect("valid policy");
    let layer = RateLimitLayer::builder(counting)
        .policy(policy)
        .key(subject_key())
        .on_store_failure(config.mode.policy())
        .check_timeout(config.layer_timeout)
        .circuit_breaker(config.breaker.0, config.breaker.1)
        .build()
        .expect("valid layer");
    // Over real HTTP, as an application serves it.
    let addr = super::serve_http(layer.layer(probe_service())).await;
    let client = super::http_client(addr);

    let started = Instant::now();
    let running = start_layer_load(&client, &config.load);
    tokio::time::sleep(config.before).await;
    tokio::task::block_in_place(|| server.kill());
    // The outage: from the moment the process is gone to the moment a new
    // one is started (requests sent just before the kill may still be
    // answered by the dying server).
    let killed_at = Instant::now();
    tokio::time::sleep(config.down).await;
    let restarting_at = Instant::now();
    tokio::task::block_in_place(|| server.restart());
    let restarted_at = Instant::now();
    tokio::time::sleep(config.after).await;
    let replies = running.stop().await;
    let elapsed = started.elapsed();
    let log = stats.log();

    let outage_replies: Vec<_> = replies
        .iter()
        .filter(|r| r.sent >= killed_at && r.sent < restarting_at)
        .collect();
    let outage = ReplyCounts::of(outage_replies.iter().map(|r| r.reply));
    let all = ReplyCounts::of(replies.iter().map(|r| r.reply));
    let policy_violations = outage_replies
        .iter()
        .filter(|r| !config.mode.allows_during_outage(r.reply))
        .count() as u64;
    let mut slowest: Vec<Duration> = outage_replies.iter().map(|r| r.done - r.sent).collect();
    let slowest_outage_reply = percentile(&mut slowest, 100);

    // The store: per subject and server life, admitted ≤ limit.
    let allowance = super::gcra_allowance(config.limit, Duration::from_secs(86_400), elapsed);
    let store_admission = judge_admission(&log, config.limit, allowance, &[restarting_at]);
    // What the store did not admit but the layer did came from the
    // fallback, which must respect the limit on its own too; under
    // fail-open and fail-closed there must be none.
    let mut store_allowed: HashMap<&str, u64> = HashMap::new();
    for record in log.iter().filter(|r| r.outcome == Outcome::Allowed) {
        *store_allowed.entry(record.subject.as_str()).or_default() += 1;
    }
    let mut replied_admitted: HashMap<&str, u64> = HashMap::new();
    for record in replies.iter().filter(|r| r.reply == Reply::Admitted) {
        *replied_admitted.entry(record.subject.as_str()).or_default() += 1;
    }
    let fallback_cap = if config.mode == FailureMode::Fallback {
        allowance
    } else {
        0
    };
    let fallback_overshoot: u64 = replied_admitted
        .iter()
        .map(|(subject, admitted)| {
            let local = admitted.saturating_sub(store_allowed.get(subject).copied().unwrap_or(0));
            local.saturating_sub(fallback_cap)
        })
        .sum();
    let admission_errors = store_admission.wrong() + fallback_overshoot;

    let mut store = BTreeMap::new();
    for record in &log {
        *store.entry(record.outcome.as_str().to_owned()).or_default() += 1;
    }
    let after: Vec<_> = log
        .iter()
        .filter(|r| {
            r.sent >= restarting_at && matches!(r.outcome, Outcome::Allowed | Outcome::Denied)
        })
        .collect();
    // From the moment the new server accepts connections.
    let recovered = after
        .iter()
        .map(|r| r.done.saturating_duration_since(restarted_at))
        .min();
    // The library (FUNCTION LOAD) or scripts (SCRIPT LOAD, the EVALSHA path).
    let commandstats = info(&server.url(), "commandstats").await;
    // Redis 6.2 counts subcommands under their command (`cmdstat_script`).
    let script_loads = if crate::server_version().0 >= 7 {
        command_calls(&commandstats, "script|load") + command_calls(&commandstats, "function|load")
    } else {
        command_calls(&commandstats, "script")
    };
    // Over HTTP: the first answer admitted by the store after the restart
    // (without a fallback, an admitted answer is the store's decision).
    let recovered_http = (config.mode != FailureMode::Fallback)
        .then(|| {
            replies
                .iter()
                .filter(|r| r.sent >= restarting_at && r.reply == Reply::Admitted)
                .map(|r| r.done.saturating_duration_since(restarted_at))
                .min()
        })
        .flatten();

    let wrong = all.hung + all.other + policy_violations + admission_errors;
    let mut row = Row::new(
        format!("redis killed ({})", config.mode.as_str()),
        format!(
            "SIGKILL under load ({} tasks), down {}, restart",
            config.load.tasks,
            ms(config.down)
        ),
    );
    row.tried = all.total();
    for (kind, n) in &store {
        if !matches!(kind.as_str(), "allowed" | "denied") {
            row.fail(&format!("store {kind}"), *n);
        }
    }
    row.fail(
        "answered locally (breaker or deny cache)",
        all.total().saturating_sub(stats.calls()),
    );
    row.fail("passed undecided (fail-open)", all.passed);
    row.fail("503 (fail-closed)", all.closed);
    row.fail("hung", all.hung);
    row.wrong = wrong;
    row.recover = recovered_http.or(recovered);
    row.note(format!(
        "with the defaults: store timeout {}, layer timeout {}, breaker {} failures / {} pause; \
         first admitted HTTP answer {} after the restart",
        ms(config.store_timeout),
        ms(config.layer_timeout),
        config.breaker.0,
        ms(config.breaker.1),
        recovered_http.map_or_else(|| "n/a (fallback)".to_owned(), ms)
    ));
    row.note(format!(
        "outage: {} requests → admitted {}, passed {}, limited {}, 503 {}; slowest answer {}",
        outage.total(),
        outage.admitted,
        outage.passed,
        outage.limited,
        outage.closed,
        ms(slowest_outage_reply)
    ));
    row.note(format!(
        "store recovered {} after restart ({} decisions after it); SCRIPT LOAD on the new server: {}",
        recovered.map_or_else(|| "never".to_owned(), ms),
        after.len(),
        script_loads
    ));
    KillRestartReport {
        row,
        outage,
        all,
        store,
        policy_violations,
        admission_errors,
        recovered,
        recovered_http,
        script_loads,
        decisions_after: after.len() as u64,
        slowest_outage_reply,
    }
}

/// Waits until `store` answers (connections open in the background).
async fn warm_up<St: Store>(store: &St) {
    let policy = [Policy::per_second(1)
        .name("warm-up")
        .build()
        .expect("valid policy")];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if store.peek("warm-up", &policy).await.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the store did not answer within 10 s of start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How the server is made slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slowdown {
    /// `CLIENT PAUSE <ms> ALL`: commands queue, then run.
    ClientPause,
    /// `DEBUG SLEEP <s>`: the server blocks (needs
    /// `--enable-debug-command yes`).
    DebugSleep,
}

/// The "Redis slow" scenario.
#[derive(Debug, Clone)]
pub struct SlowRedis {
    /// How.
    pub how: Slowdown,
    /// For how long.
    pub stall: Duration,
    /// Requests sent one after another through the layer during the stall.
    pub requests: usize,
    /// The store's per-call timeout.
    pub store_timeout: Duration,
    /// The layer's check timeout.
    pub layer_timeout: Duration,
    /// Circuit breaker: failures that open it, and its pause.
    pub breaker: (u32, Duration),
}

impl SlowRedis {
    /// A short run for the test suite: the breaker's pause outlasts the
    /// stall, so exactly `breaker.0` requests reach the store during it.
    #[must_use]
    pub fn quick(how: Slowdown) -> Self {
        Self {
            how,
            stall: Duration::from_millis(1_500),
            requests: 300,
            store_timeout: Duration::from_millis(100),
            layer_timeout: Duration::from_millis(300),
            breaker: (3, Duration::from_secs(60)),
        }
    }
}

/// What [`slow_redis`] saw.
#[derive(Debug, Clone)]
pub struct SlowReport {
    /// The table row.
    pub row: Row,
    /// The error of a direct store call during the stall.
    pub direct_error: Option<String>,
    /// Whether that error was `StoreError::Timeout` with the configured bound.
    pub direct_timeout_at_bound: bool,
    /// How long that call took (reported, never asserted).
    pub direct_elapsed: Duration,
    /// Layer requests during the stall.
    pub stalled_requests: u64,
    /// Of those, how many reached the store.
    pub reached_store: u64,
    /// Replies to them.
    pub replies: ReplyCounts,
    /// Permits Redis charged, from a peek after the stall.
    pub charged: u64,
    /// Store calls that admitted.
    pub admitted: u64,
    /// Store calls that timed out or broke (may have run).
    pub maybe_ran: u64,
    /// Stall end to the first admitted request (when the breaker pause is
    /// short enough to see it).
    pub recovered: Option<Duration>,
}

/// Makes `server` slow while requests go through a fail-open layer with a
/// circuit breaker, then checks that calls timed out at the bound, the
/// breaker kept requests from waiting, and nothing was charged twice.
///
/// # Panics
///
/// When the store or layer cannot be built.
pub async fn slow_redis(server: &OwnedRedis, config: &SlowRedis) -> SlowReport {
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(config.store_timeout)
        .build()
        .await
        .expect("the store builds");
    warm_up(&store).await;
    let counting = CountingStore::new(store);
    let stats = counting.stats();
    // A counter that cannot run out or reset during the run: every charge
    // shows in `remaining`.
    let policy = Policy::per_day(50_000)
        .algorithm(Algorithm::FixedWindow)
        .name("slow")
        .build()
        .expect("valid policy");
    let policies = [policy.clone()];
    let subject = format!("slow-{:?}", config.how).to_lowercase();
    let layer = RateLimitLayer::builder(counting.clone())
        .policy(policy)
        .key(subject_key())
        .on_store_failure(FailurePolicy::FailOpen)
        .check_timeout(config.layer_timeout)
        .circuit_breaker(config.breaker.0, config.breaker.1)
        .build()
        .expect("valid layer");
    // Over real HTTP, as an application serves it.
    let service = super::http_client(super::serve_http(layer.layer(probe_service())).await);
    let hang = config.stall + Duration::from_secs(5);

    for _ in 0..10 {
        assert_eq!(
            send(&service, request_for(&subject), hang).await,
            Reply::Admitted,
            "warm-up request"
        );
    }
    let before = counting
        .inner()
        .peek(&subject, &policies)
        .await
        .expect("peek before the stall");
    // Store calls from here on are the ones the stall may affect.
    let warmed_up = Instant::now();

    let url = server.url();
    let stall_ms = config.stall.as_millis().to_string();
    let stall_secs = format!("{:.3}", config.stall.as_secs_f64());
    let mut control = admin(&url).await;
    let stalling = match config.how {
        Slowdown::ClientPause => {
            let _: () = command(&mut control, &["CLIENT", "PAUSE", &stall_ms, "ALL"])
                .await
                .expect("CLIENT PAUSE");
            None
        }
        Slowdown::DebugSleep => Some(tokio::spawn(async move {
            let _: redis::RedisResult<()> =
                command(&mut control, &["DEBUG", "SLEEP", &stall_secs]).await;
        })),
    };
    let stall_started = Instant::now();
    // Give DEBUG SLEEP a moment to reach the server.
    tokio::time::sleep(Duration::from_millis(20)).await;

    // A direct call: a typed Timeout at the configured bound.
    let direct_started = Instant::now();
    let direct = counting.check(&subject, &policies, 1).await;
    let direct_elapsed = direct_started.elapsed();
    let direct_timeout_at_bound =
        matches!(&direct, Err(StoreError::Timeout { after }) if *after == config.store_timeout);
    let direct_error = direct.err().map(|e| e.to_string());

    // Requests through the layer: the breaker opens after `breaker.0`
    // failures; the rest are answered without waiting.
    let calls_before = stats.calls();
    let mut replies = Vec::with_capacity(config.requests);
    let mut latencies = Vec::with_capacity(config.requests);
    for _ in 0..config.requests {
        if stall_started.elapsed() + config.layer_timeout >= config.stall {
            break;
        }
        let sent = Instant::now();
        let reply = send(&service, request_for(&subject), hang).await;
        latencies.push(sent.elapsed());
        replies.push(reply);
    }
    let stalled_requests = replies.len() as u64;
    let reached_store = stats.calls() - calls_before;

    // After the stall: wait for it to end, then for the first admission.
    if let Some(task) = stalling {
        let _ = task.await;
    }
    let remaining_stall = config.stall.saturating_sub(stall_started.elapsed());
    tokio::time::sleep(remaining_stall + Duration::from_millis(50)).await;
    let stall_ended = stall_started + config.stall;
    let mut recovered = None;
    let probe_until =
        Instant::now() + config.breaker.1.min(Duration::from_secs(5)) + Duration::from_millis(500);
    while Instant::now() < probe_until {
        if send(&service, request_for(&subject), hang).await == Reply::Admitted {
            recovered = Some(stall_ended.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every call that was sent has run by now (a paused client's commands
    // run when the pause ends).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = counting
        .inner()
        .peek(&subject, &policies)
        .await
        .expect("peek after the stall");
    let charged = before.decisions()[0].remaining() - after.decisions()[0].remaining();
    let log = stats.log();
    let admitted_after_warmup = log
        .iter()
        .filter(|r| r.sent >= warmed_up && r.outcome == Outcome::Allowed)
        .count() as u64;
    let maybe_ran = log
        .iter()
        .filter(|r| {
            matches!(r.outcome, Outcome::Failed(k) if k.may_have_run())
                || r.outcome == Outcome::Cancelled
        })
        .count() as u64;
    let replies_counts = ReplyCounts::of(replies.iter().copied());
    let mut local: Vec<Duration> = latencies
        .iter()
        .skip(config.breaker.0 as usize)
        .copied()
        .collect();
    let p50_local = percentile(&mut local, 50);
    let p99_local = percentile(&mut local, 99);

    // Charged exactly once per call that ran: never more (no replay), never
    // less than what was admitted.
    let double_charged = charged.saturating_sub(admitted_after_warmup + maybe_ran);
    let lost = admitted_after_warmup.saturating_sub(charged);
    let wrong =
        double_charged + lost + replies_counts.hung + replies_counts.other + replies_counts.closed;

    let name = match config.how {
        Slowdown::ClientPause => "redis slow (CLIENT PAUSE)",
        Slowdown::DebugSleep => "redis slow (DEBUG SLEEP)",
    };
    let mut row = Row::new(
        name,
        format!(
            "stall {} with timeout {}, breaker {} failures / {} pause",
            ms(config.stall),
            ms(config.store_timeout),
            config.breaker.0,
            ms(config.breaker.1)
        ),
    );
    row.tried = stalled_requests + 1;
    let mut by_kind: BTreeMap<FailureKind, u64> = BTreeMap::new();
    for record in log.iter().filter(|r| r.sent >= warmed_up) {
        if let Outcome::Failed(kind) = record.outcome {
            *by_kind.entry(kind).or_default() += 1;
        }
    }
    for (kind, n) in by_kind {
        row.fail(&format!("store {}", kind.as_str()), n);
    }
    row.fail(
        "skipped by the breaker",
        stalled_requests.saturating_sub(reached_store),
    );
    row.fail("passed undecided (fail-open)", replies_counts.passed);
    row.wrong = wrong;
    row.recover = recovered;
    row.note(format!(
        "direct call during the stall: {} after {} (bound {})",
        direct_error.as_deref().unwrap_or("no error"),
        ms(direct_elapsed),
        ms(config.store_timeout)
    ));
    row.note(format!(
        "{stalled_requests} layer requests during the stall, {reached_store} reached Redis; the others were answered in p50 {} / p99 {}",
        ms(p50_local),
        ms(p99_local)
    ));
    row.note(format!(
        "charged by Redis {charged} = admitted {admitted_after_warmup} + timed out and run later {maybe_ran} → double charges {double_charged}"
    ));
    SlowReport {
        row,
        direct_error,
        direct_timeout_at_bound,
        direct_elapsed,
        stalled_requests,
        reached_store,
        replies: replies_counts,
        charged,
        admitted: admitted_after_warmup,
        maybe_ran,
        recovered,
    }
}

/// What [`pool_exhaustion`] saw.
#[derive(Debug, Clone)]
pub struct PoolReport {
    /// The table row.
    pub row: Row,
    /// Calls to a server that accepts connections and never answers.
    pub black_hole: BTreeMap<String, u64>,
    /// Calls to a server that refuses more clients (`maxclients`).
    pub full_server: BTreeMap<String, u64>,
    /// Concurrent calls over a one-connection pool to a healthy server.
    pub one_connection: BTreeMap<String, u64>,
    /// Calls that hung (no answer within the hang bound).
    pub hung: u64,
    /// Slowest answer in the black-hole case (reported, never asserted).
    pub slowest_black_hole: Duration,
}

fn outcome_name(result: Option<&Result<Verdict, StoreError>>) -> &'static str {
    result.map_or("hung", |result| Outcome::of(result).as_str())
}

async fn burst<St: Store>(
    store: Arc<St>,
    calls: usize,
    hang: Duration,
) -> (BTreeMap<String, u64>, Duration) {
    let policy: Arc<[Policy]> = Arc::new([Policy::per_second(1_000)
        .name("pool")
        .build()
        .expect("valid policy")]);
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let store = Arc::clone(&store);
            let policy = Arc::clone(&policy);
            tokio::spawn(async move {
                let started = Instant::now();
                let result = tokio::time::timeout(
                    hang,
                    store.check(&format!("pool-{}", i % 50), &policy, 1),
                )
                .await
                .ok();
                (outcome_name(result.as_ref()).to_owned(), started.elapsed())
            })
        })
        .collect();
    let mut counts = BTreeMap::new();
    let mut slowest = Duration::ZERO;
    for task in tasks {
        let (name, elapsed) = task.await.expect("a pool task panicked");
        *counts.entry(name).or_default() += 1;
        slowest = slowest.max(elapsed);
    }
    (counts, slowest)
}

/// Calls a store whose pool cannot get a connection (a server that accepts
/// TCP and never answers; a server at `maxclients`) and a one-connection
/// pool under many concurrent calls: every call ends with a decision or a
/// typed error, none hangs.
///
/// # Panics
///
/// When a store cannot be built or a server cannot be started.
pub async fn pool_exhaustion(calls: usize) -> PoolReport {
    let timeout = Duration::from_millis(150);
    let hang = Duration::from_secs(5);

    // 1. A black hole: accepts connections, never says a word.
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a black hole");
    let address = listener.local_addr().expect("local address");
    let hole = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let store = RedisStore::builder()
        .url(format!("redis://{address}"))
        .pool_size(2)
        .timeout(timeout)
        .connect_timeout(Duration::from_millis(400))
        .lazy_connect(true) // build() would refuse the black hole
        .build()
        .await
        .expect("the store builds");
    let (black_hole, slowest_black_hole) = burst(Arc::new(store), calls, hang).await;
    hole.abort();

    // 2. A server that refuses clients beyond the admin connection.
    let full = tokio::task::block_in_place(|| OwnedRedis::start(&["--maxclients", "1"]));
    // The one client slot goes to this connection (retrying while the
    // start-up probe's connection is still being closed).
    let mut holder = None;
    for _ in 0..100 {
        if let Ok(client) = redis::Client::open(full.url())
            && let Ok(mut connection) = client.get_multiplexed_async_connection().await
            && command::<String>(&mut connection, &["PING"]).await.is_ok()
        {
            holder = Some(connection);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _holder = holder.expect("a connection to the maxclients-1 server");
    let store = RedisStore::builder()
        .url(full.url())
        .pool_size(2)
        .timeout(timeout)
        .lazy_connect(true) // build() would refuse the full server
        .build()
        .await
        .expect("the store builds");
    let (full_server, _) = burst(Arc::new(store), calls, hang).await;
    drop(full);

    // 3. One connection, many concurrent calls.
    let healthy = tokio::task::block_in_place(|| OwnedRedis::start(&[]));
    let store = RedisStore::builder()
        .url(healthy.url())
        .pool_size(1)
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("the store builds");
    warm_up(&store).await;
    let (one_connection, _) = burst(Arc::new(store), calls * 10, hang).await;

    let hung = [&black_hole, &full_server, &one_connection]
        .iter()
        .map(|m| m.get("hung").copied().unwrap_or(0))
        .sum();
    let untyped_or_wrong = [&black_hole, &full_server]
        .iter()
        .flat_map(|m| m.iter())
        .filter(|(k, _)| k.as_str() != "unavailable" && k.as_str() != "timeout")
        .map(|(_, n)| *n)
        .sum::<u64>();
    let one_failed: u64 = one_connection
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "allowed" | "denied"))
        .map(|(_, n)| *n)
        .sum();
    let mut row = Row::new(
        "pool exhausted",
        "no connection obtainable (black hole, maxclients 1); 1-connection pool under load",
    );
    row.tried = (calls * 12) as u64;
    for (case, counts) in [("black hole", &black_hole), ("maxclients", &full_server)] {
        for (kind, n) in counts {
            row.fail(&format!("{case}: {kind}"), *n);
        }
    }
    row.fail("1-connection pool: failed", one_failed);
    row.wrong = hung + untyped_or_wrong + one_failed;
    row.note(format!(
        "black hole: {black_hole:?}, slowest answer {} (timeout {}); maxclients: {full_server:?}; 1-connection pool, {} concurrent: {one_connection:?}",
        ms(slowest_black_hole),
        ms(timeout),
        calls * 10
    ));
    PoolReport {
        row,
        black_hole,
        full_server,
        one_connection,
        hung,
        slowest_black_hole,
    }
}
