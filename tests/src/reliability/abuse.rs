//! Abuse: a hot subject hammering the limiter (deny cache), spoofed
//! forwarding headers, addresses rotating inside one IPv6 prefix, a flood
//! of distinct keys into a full store.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Request;
use portcullis_core::{Policy, Store};
use portcullis_redis::RedisStore;
use portcullis_tower::{
    ClientIp, FailurePolicy, KeyExtractor, PeerIp, ProxyHeader, RateLimitLayer,
};
use tower::Layer;

use super::counting::{CountingStore, Outcome};
use super::load::{percentile, probe_service, request_for, send, subject_key, Reply};
use super::report::{ms, Row};
use super::{admin, command, command_calls, info, Rng};

/// The hot-subject scenario.
#[derive(Debug, Clone)]
pub struct HotSubject {
    /// Requests of the hot subject per phase.
    pub hot_requests: usize,
    /// Concurrent senders of the hot subject.
    pub concurrency: usize,
    /// The hot subject's total request rate per second: the same offered
    /// load with and without the cache, so the other subjects' latencies
    /// compare (0: as fast as possible).
    pub hot_rate: u32,
    /// Other subjects, each sending `other_requests` one after another.
    pub others: usize,
    /// Requests per other subject (at most `limit`, so all are admitted).
    pub other_requests: usize,
    /// Pause between two requests of an other subject.
    pub other_pace: Duration,
    /// Permits per minute per subject.
    pub limit: u64,
}

impl HotSubject {
    /// A short run for the test suite.
    #[must_use]
    pub fn quick() -> Self {
        Self {
            hot_requests: 3_000,
            concurrency: 16,
            hot_rate: 3_000,
            others: 20,
            other_requests: 20,
            other_pace: Duration::from_millis(50),
            limit: 30,
        }
    }
}

/// One phase of [`hot_subject`].
#[derive(Debug, Clone, Default)]
pub struct HotPhase {
    /// Whether the deny cache was on.
    pub cache: bool,
    /// Requests of the hot subject.
    pub hot_requests: u64,
    /// Of those, denied.
    pub hot_denied: u64,
    /// Store calls for the hot subject.
    pub hot_store_calls: u64,
    /// Store calls for the hot subject that did not admit (denials the
    /// store had to make).
    pub hot_store_denials: u64,
    /// Checks Redis executed in the phase (all subjects): `FCALL`,
    /// `FCALL_RO` and `EVALSHA` calls.
    pub evalsha_calls: u64,
    /// Other subjects' requests admitted.
    pub others_admitted: u64,
    /// Other subjects' requests not admitted (wrong: they stay within
    /// their limit).
    pub others_not_admitted: u64,
    /// Other subjects' latency, median.
    pub others_p50: Duration,
    /// Other subjects' latency, 99th percentile.
    pub others_p99: Duration,
    /// From the first hot request to the last answer.
    pub hot_elapsed: Duration,
}

impl HotPhase {
    /// Hot requests admitted.
    #[must_use]
    pub fn hot_admitted(&self) -> u64 {
        self.hot_requests - self.hot_denied
    }

    /// Whether the hot subject got what its policy (`limit` per minute,
    /// GCRA) allows: at least the burst, at most the burst plus the refill
    /// over the phase.
    #[must_use]
    pub fn hot_admitted_is_exact(&self, limit: u64) -> bool {
        let allowance = super::gcra_allowance(limit, Duration::from_secs(60), self.hot_elapsed);
        (limit..=allowance).contains(&self.hot_admitted())
    }
}

impl HotPhase {
    /// Store round trips per denied hot request.
    #[must_use]
    pub fn calls_per_denied(&self) -> f64 {
        if self.hot_denied == 0 {
            return 0.0;
        }
        self.hot_store_denials as f64 / self.hot_denied as f64
    }
}

/// What [`hot_subject`] saw.
#[derive(Debug, Clone)]
pub struct HotReport {
    /// The table row.
    pub row: Row,
    /// Other subjects only (no hot subject), deny cache on.
    pub baseline: HotPhase,
    /// Hot subject, deny cache on.
    pub with_cache: HotPhase,
    /// Hot subject, deny cache off.
    pub without_cache: HotPhase,
}

impl HotReport {
    /// How many times fewer store calls per denied request the cache
    /// needs.
    #[must_use]
    pub fn reduction(&self) -> f64 {
        let with = self.with_cache.calls_per_denied();
        if with == 0.0 {
            f64::INFINITY
        } else {
            self.without_cache.calls_per_denied() / with
        }
    }
}

async fn hot_phase(
    server_url: &str,
    config: &HotSubject,
    cache: bool,
    hot: bool,
    tag: &str,
) -> HotPhase {
    // Coalescing off: this scenario measures what the deny cache alone
    // saves (coalesced denials of the hot subject would share calls in
    // both phases; `redis_coalesce` measures that).
    let store = RedisStore::builder()
        .url(server_url)
        .prefix(format!("hot-{tag}-{}", std::process::id()))
        .timeout(Duration::from_secs(1))
        .coalesce(false)
        .build()
        .await
        .expect("the store builds");
    store.ping().await.expect("the server answers");
    let counting = CountingStore::new(store);
    let stats = counting.stats();
    let layer = RateLimitLayer::builder(counting)
        .policy(
            Policy::per_minute(config.limit)
                .name("hot")
                .build()
                .expect("valid policy"),
        )
        .key(subject_key())
        .on_store_failure(FailurePolicy::FailOpen)
        .check_timeout(Duration::from_secs(2))
        .deny_cache(if cache {
            portcullis_tower::rate_limit::DEFAULT_DENY_CACHE_CAPACITY
        } else {
            0
        })
        .build()
        .expect("valid layer");
    let service = layer.layer(probe_service());
    let mut connection = admin(server_url).await;
    let _: () = command(&mut connection, &["CONFIG", "RESETSTAT"])
        .await
        .expect("CONFIG RESETSTAT");
    let hang = Duration::from_secs(5);

    let others: Vec<_> = (0..config.others)
        .map(|k| {
            let service = service.clone();
            let config = config.clone();
            tokio::spawn(async move {
                let subject = format!("other-{k}");
                let mut latencies = Vec::new();
                let mut admitted = 0;
                for _ in 0..config.other_requests {
                    let sent = Instant::now();
                    let reply = send(&service, request_for(&subject), hang).await;
                    latencies.push(sent.elapsed());
                    admitted += u64::from(reply == Reply::Admitted);
                    tokio::time::sleep(config.other_pace).await;
                }
                (latencies, admitted)
            })
        })
        .collect();
    let per_task = if hot {
        config.hot_requests / config.concurrency.max(1)
    } else {
        0
    };
    let pace = if config.hot_rate == 0 {
        None
    } else {
        Some(Duration::from_secs(config.concurrency as u64) / config.hot_rate)
    };
    let hot_started = Instant::now();
    let hot_tasks: Vec<_> = (0..config.concurrency)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let mut denied = 0;
                let mut ticks = pace.map(tokio::time::interval);
                for _ in 0..per_task {
                    if let Some(ticks) = &mut ticks {
                        ticks.tick().await;
                    }
                    denied += u64::from(
                        send(&service, request_for("hot-abuser"), hang).await == Reply::Limited,
                    );
                    // Real requests arrive through I/O; a loop of answers
                    // that are ready at once would otherwise hog its worker
                    // thread and starve the other subjects' tasks.
                    tokio::task::yield_now().await;
                }
                denied
            })
        })
        .collect();
    let mut phase = HotPhase {
        cache,
        hot_requests: (per_task * config.concurrency) as u64,
        ..HotPhase::default()
    };
    for task in hot_tasks {
        phase.hot_denied += task.await.expect("a hot task panicked");
    }
    phase.hot_elapsed = hot_started.elapsed();
    let mut latencies = Vec::new();
    for task in others {
        let (mut l, admitted) = task.await.expect("an other task panicked");
        latencies.append(&mut l);
        phase.others_admitted += admitted;
    }
    phase.others_not_admitted =
        (config.others * config.other_requests) as u64 - phase.others_admitted;
    phase.others_p50 = percentile(&mut latencies, 50);
    phase.others_p99 = percentile(&mut latencies, 99);
    let log = stats.log();
    phase.hot_store_calls = log.iter().filter(|r| r.subject == "hot-abuser").count() as u64;
    phase.hot_store_denials = log
        .iter()
        .filter(|r| r.subject == "hot-abuser" && r.outcome != Outcome::Allowed)
        .count() as u64;
    let commandstats = info(server_url, "commandstats").await;
    phase.evalsha_calls = ["evalsha", "fcall", "fcall_ro"]
        .iter()
        .map(|command| command_calls(&commandstats, command))
        .sum();
    phase
}

/// One hot subject at full load next to well-behaved subjects, with and
/// without the deny cache: store calls per denied request (counted by a
/// store wrapper and by Redis' `INFO commandstats`), and the others'
/// latency. Use a server of its own: the stats are reset.
///
/// # Panics
///
/// When the store cannot be built or the server does not answer.
pub async fn hot_subject(server_url: &str, config: &HotSubject) -> HotReport {
    let baseline = hot_phase(server_url, config, true, false, "base").await;
    let with_cache = hot_phase(server_url, config, true, true, "cache").await;
    let without_cache = hot_phase(server_url, config, false, true, "nocache").await;
    let mut report = HotReport {
        row: Row::new("hot abusive subject", ""),
        baseline,
        with_cache,
        without_cache,
    };
    let reduction = report.reduction();
    let mut row = Row::new(
        "hot abusive subject",
        format!(
            "{} requests from one subject ({}/s, {} senders) beside {} normal subjects, deny cache on vs off",
            config.hot_requests, config.hot_rate, config.concurrency, config.others
        ),
    );
    let phases = [&report.baseline, &report.with_cache, &report.without_cache];
    row.tried = phases
        .iter()
        .map(|p| p.hot_requests + p.others_admitted + p.others_not_admitted)
        .sum();
    row.fail(
        "429 to the hot subject",
        report.with_cache.hot_denied + report.without_cache.hot_denied,
    );
    let others_wrong: u64 = phases.iter().map(|p| p.others_not_admitted).sum();
    let hot_wrong = phases
        .iter()
        .skip(1)
        .filter(|p| !p.hot_admitted_is_exact(config.limit))
        .count() as u64;
    row.wrong = others_wrong + hot_wrong;
    for phase in phases.iter().skip(1) {
        row.note(format!(
            "deny cache {}: {} hot requests, {} denied, {} reached Redis ({} of them denials) → {:.4} store calls per denied request; checks executed by Redis (FCALL, FCALL_RO, EVALSHA): {}",
            if phase.cache { "on " } else { "off" },
            phase.hot_requests,
            phase.hot_denied,
            phase.hot_store_calls,
            phase.hot_store_denials,
            phase.calls_per_denied(),
            phase.evalsha_calls
        ));
    }
    row.note(format!(
        "store calls per denied request fall {reduction:.0}× with the cache (goal ≥ 10×); hot requests admitted {} with and {} without the cache (limit {} per minute, over {} and {})",
        report.with_cache.hot_admitted(),
        report.without_cache.hot_admitted(),
        config.limit,
        ms(report.with_cache.hot_elapsed),
        ms(report.without_cache.hot_elapsed)
    ));
    row.note(format!(
        "other subjects' latency p50 / p99: alone {} / {}, beside the hot subject with cache {} / {}, without cache {} / {}",
        ms(report.baseline.others_p50),
        ms(report.baseline.others_p99),
        ms(report.with_cache.others_p50),
        ms(report.with_cache.others_p99),
        ms(report.without_cache.others_p50),
        ms(report.without_cache.others_p99)
    ));
    report.row = row;
    report
}

fn random_junk(rng: &mut Rng) -> String {
    let len = rng.below(24) as usize;
    (0..len)
        .map(|_| {
            let pool = b"0123456789abcdef.:,;=[]\"% _-forFOR";
            char::from(pool[rng.below(pool.len() as u64) as usize])
        })
        .collect()
}

fn random_ip(rng: &mut Rng) -> String {
    if rng.below(2) == 0 {
        format!(
            "{}.{}.{}.{}",
            rng.below(256),
            rng.below(256),
            rng.below(256),
            rng.below(256)
        )
    } else {
        Ipv6Addr::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())).to_string()
    }
}

/// A forged forwarding header value: addresses, ports, brackets, `for=`,
/// `unknown`, mapped and zoned forms, and junk.
fn forged_value(rng: &mut Rng) -> String {
    let hops = 1 + rng.below(4);
    (0..hops)
        .map(|_| match rng.below(7) {
            0 => random_ip(rng),
            1 => format!("for={}", random_ip(rng)),
            2 => format!(
                "for=\"[{}]:{}\"",
                Ipv6Addr::from(u128::from(rng.next_u64())),
                rng.below(65_536)
            ),
            3 => format!(
                "::ffff:{}.{}.{}.{}",
                rng.below(256),
                rng.below(256),
                rng.below(256),
                rng.below(256)
            ),
            4 => format!("fe80::{:x}%eth{}", rng.below(65_536), rng.below(4)),
            5 => "unknown".to_owned(),
            _ => random_junk(rng),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// An untrusted peer sends `requests` requests, each with a different
/// forged `X-Forwarded-For` and `Forwarded`, through a layer keyed by
/// `ClientIp` (trusting only `10.0.0.0/8`) over `store`. The key must stay
/// the peer's address and exactly `limit` requests may pass.
///
/// # Panics
///
/// When the layer cannot be built.
pub async fn spoofed_forwarded_for<St: Store>(store: St, requests: usize, limit: u64) -> Row {
    let peer: SocketAddr = "203.0.113.9:40000".parse().expect("valid address");
    let mut wrong = 0;
    let mut admitted = 0;
    let mut keys = HashSet::new();
    let store = Arc::new(store);
    for header in [ProxyHeader::XForwardedFor, ProxyHeader::Forwarded] {
        let extractor =
            ClientIp::trusting(["10.0.0.0/8".parse().expect("valid network")]).header(header);
        let layer = RateLimitLayer::builder_shared(Arc::clone(&store))
            .policy(
                Policy::per_minute(limit)
                    .name(format!("spoof-{header:?}").to_lowercase())
                    .build()
                    .expect("valid policy"),
            )
            .key(extractor.clone())
            .build()
            .expect("valid layer");
        let service = layer.layer(probe_service());
        let mut rng = Rng::new(0x5eed + requests as u64);
        let mut phase_admitted = 0;
        for _ in 0..requests {
            let forged_xff = forged_value(&mut rng);
            let forged_forwarded = forged_value(&mut rng);
            let request = || {
                let mut builder = Request::get("/").extension(peer);
                if let Ok(value) = http::HeaderValue::from_str(&forged_xff) {
                    builder = builder.header("x-forwarded-for", value);
                }
                if let Ok(value) = http::HeaderValue::from_str(&forged_forwarded) {
                    builder = builder.header("forwarded", value);
                }
                builder.body(()).expect("a valid request")
            };
            let (parts, ()) = request().into_parts();
            let key = extractor.extract(&parts);
            if key.as_deref() != Some("203.0.113.9") {
                wrong += 1;
            }
            keys.extend(key);
            phase_admitted += u64::from(
                send(&service, request(), Duration::from_secs(5)).await == Reply::Admitted,
            );
        }
        wrong += phase_admitted.abs_diff(limit.min(requests as u64));
        admitted += phase_admitted;
    }
    let mut row = Row::new(
        "spoofed client IP",
        format!("untrusted peer, {requests} forged X-Forwarded-For and {requests} forged Forwarded values"),
    );
    row.tried = 2 * requests as u64;
    row.fail("429", row.tried - admitted);
    row.wrong = wrong;
    row.note(format!(
        "keys seen: {keys:?}; admitted {admitted} (limit {limit} per header kind)"
    ));
    row
}

/// `requests` requests from addresses rotating inside one IPv6 /56, as the
/// peer (keyed by `PeerIp`) and behind a trusted proxy (keyed by
/// `ClientIp`): one key, one limit.
///
/// # Panics
///
/// When the layer cannot be built.
pub async fn ipv6_rotation<St: Store>(store: St, requests: usize, limit: u64) -> Row {
    let prefix: u128 = u128::from(Ipv6Addr::new(0x2001, 0x0db8, 0x00aa, 0xbb00, 0, 0, 0, 0));
    let mut rng = Rng::new(0x1f6);
    let mut address = move || {
        let host =
            (u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())) & ((1u128 << 72) - 1);
        Ipv6Addr::from(prefix | host)
    };
    let store = Arc::new(store);
    let mut wrong = 0;
    let mut admitted_total = 0;
    let mut keys = HashSet::new();

    let layer = RateLimitLayer::builder_shared(Arc::clone(&store))
        .policy(
            Policy::per_minute(limit)
                .name("v6-peer")
                .build()
                .expect("valid policy"),
        )
        .key(PeerIp::new())
        .build()
        .expect("valid layer");
    let service = layer.layer(probe_service());
    let mut admitted = 0;
    for _ in 0..requests {
        let peer = SocketAddr::new(IpAddr::V6(address()), 443);
        let request = || {
            Request::get("/")
                .extension(peer)
                .body(())
                .expect("a valid request")
        };
        keys.extend(PeerIp::new().extract(&request().into_parts().0));
        admitted +=
            u64::from(send(&service, request(), Duration::from_secs(5)).await == Reply::Admitted);
    }
    wrong += admitted.abs_diff(limit.min(requests as u64));
    admitted_total += admitted;

    let extractor = ClientIp::trusting(["10.0.0.0/8".parse().expect("valid network")]);
    let layer = RateLimitLayer::builder_shared(Arc::clone(&store))
        .policy(
            Policy::per_minute(limit)
                .name("v6-proxied")
                .build()
                .expect("valid policy"),
        )
        .key(extractor.clone())
        .build()
        .expect("valid layer");
    let service = layer.layer(probe_service());
    let proxy: SocketAddr = "10.1.2.3:5000".parse().expect("valid address");
    let mut admitted = 0;
    for _ in 0..requests {
        let client = address();
        let mut request = || {
            Request::get("/")
                .extension(proxy)
                .header("x-forwarded-for", format!("{}, [{client}]:1234", address()))
                .body(())
                .expect("a valid request")
        };
        keys.extend(extractor.extract(&request().into_parts().0));
        admitted +=
            u64::from(send(&service, request(), Duration::from_secs(5)).await == Reply::Admitted);
    }
    wrong += admitted.abs_diff(limit.min(requests as u64));
    admitted_total += admitted;
    if keys.len() != 1 {
        wrong += keys.len() as u64;
    }
    let mut row = Row::new(
        "rotating IPv6 in one /56",
        format!("{requests} peers and {requests} proxied clients, each a new address in 2001:db8:aa:bb00::/56"),
    );
    row.tried = 2 * requests as u64;
    row.fail("429", row.tried - admitted_total);
    row.wrong = wrong;
    row.note(format!(
        "keys seen: {keys:?}; admitted {admitted_total} (limit {limit} per layer)"
    ));
    row
}

/// A flood of distinct keys over HTTP, against a layer with every default
/// (fail-open, default timeouts and breaker) limiting each key to 5 per
/// hour: a held subject spends 4, `prepare` runs (say, filling Redis past
/// `maxmemory`), `flood` new keys send one request each (50 at a time),
/// then the held subject must have exactly 1 permit left and a fresh one
/// at most its 5. Wrong: any flood request let through undecided, the held
/// subject's permits lifted or lost, a fresh subject over its limit.
pub async fn key_flood<St: Store>(
    store: St,
    what: &str,
    flood: usize,
    prepare: impl std::future::Future<Output = ()>,
) -> Row {
    let layer = RateLimitLayer::builder(store)
        .policy(
            Policy::per_hour(5)
                .name("api")
                .build()
                .expect("valid policy"),
        )
        .key(subject_key())
        .build()
        .expect("valid layer");
    let addr = super::serve_http(layer.layer(probe_service())).await;
    let client = super::http_client(addr);
    let hang = Duration::from_secs(10);
    let mut wrong = 0;
    for _ in 0..4 {
        wrong += u64::from(send(&client, request_for("held"), hang).await != Reply::Admitted);
    }
    prepare.await;
    let mut answers = Vec::with_capacity(flood);
    for chunk in (0..flood).collect::<Vec<_>>().chunks(50) {
        let batch = chunk.iter().map(|i| {
            let client = client.clone();
            async move { send(&client, request_for(&format!("flood-{i}")), hang).await }
        });
        answers.extend(futures::future::join_all(batch).await);
    }
    let counts = super::ReplyCounts::of(answers.iter().copied());
    // Until denied: what the held and a fresh subject still get.
    let remaining = |subject: &'static str| {
        let client = client.clone();
        async move {
            let (mut admitted, mut undecided) = (0u64, 0u64);
            for _ in 0..8 {
                match send(&client, request_for(subject), hang).await {
                    Reply::Admitted => admitted += 1,
                    Reply::Passed => undecided += 1,
                    _ => break,
                }
            }
            (admitted, undecided)
        }
    };
    let (held, held_undecided) = remaining("held").await;
    let (fresh, fresh_undecided) = remaining("fresh").await;
    wrong += counts.passed + counts.other + counts.hung + held_undecided + fresh_undecided;
    wrong += held.abs_diff(1) + fresh.saturating_sub(5);
    let mut row = Row::new(
        format!("key flood ({what})"),
        format!(
            "{flood} new keys over HTTP, layer defaults, 5/hour per key; one key held at 4 of 5"
        ),
    );
    row.tried = counts.total() + 8;
    row.fail("429 to a new key", counts.limited);
    row.fail("503 to a new key", counts.closed);
    row.fail("passed undecided", counts.passed);
    row.wrong = wrong;
    row.note(format!(
        "flood: {} admitted, {} denied, {} undecided; held key then got {held} (exactly 1 expected), \
         a fresh key {fresh} (at most 5)",
        counts.admitted,
        counts.limited + counts.closed,
        counts.passed
    ));
    row
}

/// Fills the Redis at `url` (started with `--maxmemory-policy noeviction`)
/// with 4 MiB, then caps it at 3 MB: firmly past `maxmemory`. For a private
/// server only (`CONFIG SET`).
///
/// # Panics
///
/// When a command fails.
pub async fn fill_past_maxmemory(url: &str) {
    let mut connection = admin(url).await;
    let filler = "x".repeat(64 << 10);
    for i in 0..64 {
        let _: () = command(&mut connection, &["SET", &format!("filler:{i}"), &filler])
            .await
            .expect("SET filler");
    }
    let _: () = command(&mut connection, &["CONFIG", "SET", "maxmemory", "3mb"])
        .await
        .expect("CONFIG SET maxmemory");
}

/// Makes room on the server at `url` that [`fill_past_maxmemory`] (or a
/// test's own fillers, `keys`) filled: deletes `keys` and lifts
/// `maxmemory`, as an operator would. Deleting alone is not enough on
/// every server: Valkey 8 keeps the fillers' writes in its replication
/// backlog (10 MB by default), which counts toward `maxmemory`.
///
/// # Panics
///
/// When a command fails.
pub async fn make_room(url: &str, keys: &[String]) {
    let mut connection = admin(url).await;
    for key in keys {
        let _: i64 = command(&mut connection, &["DEL", key]).await.expect("DEL");
    }
    let () = command(&mut connection, &["CONFIG", "SET", "maxmemory", "0"])
        .await
        .expect("CONFIG SET maxmemory 0");
}
