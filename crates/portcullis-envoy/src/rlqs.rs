//! [`RlqsService`]: Envoy's RLQS (`StreamRateLimitQuotas`). Each usage
//! report is charged to the bucket's subject exactly (a post-charge), and
//! answered per bucket: a token bucket holding the instance's share of the
//! policy's rate (the policy's permits per report interval divided among
//! the Envoy instances reporting the bucket), `DENY_ALL` while the subject
//! is exhausted, `ALLOW_ALL` for a bucket no rule limits, abandon for a
//! malformed bucket id. The bound is in ALGORITHMS.md, "RLQS quotas".

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use futures_util::Stream;
use portcullis_core::Policy;
use sha2::{Digest, Sha256};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status, Streaming};

use crate::log::LogGate;
use crate::rls::{MAX_ENTRIES, MAX_ENTRY_LEN};
use crate::subject::descriptor_subject;
use crate::{DescriptorStore, LiveConfig};

/// Most buckets one usage report may carry.
pub const MAX_BUCKETS_PER_REPORT: usize = 1024;
/// Most (domain, bucket) pairs whose reporting instances are counted;
/// beyond, a bucket is counted as reported by one instance.
const MAX_TRACKED_BUCKETS: usize = 100_000;

/// Envoy's RLQS rate-limit quota service
/// (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`) on a
/// [`DescriptorStore`], to mount with [`RlqsService::into_server`].
///
/// A bucket id's entries, sorted by key, are looked up in the
/// configuration as a descriptor of the report's domain
/// ([`Config::rule_for`](crate::Config::rule_for)), so a bucket and an RLS
/// descriptor with the same entries share one subject and one state. For
/// each bucket of a report:
///
/// - the requests the instance reports allowed are charged to the subject
///   exactly: GCRA and token-bucket rules with
///   [`DescriptorStore::charge`] (usage past the limit is a debt, up to one
///   capacity); the windows, the log and the leaky bucket with a check of
///   that cost, saturating at the limit when it does not fit (they hold
///   no debt);
/// - while the subject has room: a token bucket of `q` tokens refilled by
///   `q` every report interval, `q` the policy's permits per interval
///   divided by the instances reporting the bucket (at least 1);
/// - once it has none: `DENY_ALL`, until a report finds room again;
/// - a bucket no rule limits (or a shadow-mode rule): `ALLOW_ALL`;
/// - a malformed bucket id (empty, more than 16 entries, a key or value
///   over 1024 bytes): abandoned;
/// - when the store fails: no action for the bucket (Envoy keeps its
///   assignment until the assignment's time to live ends).
///
/// Assignments live for two report intervals and are renewed by every
/// report. An unknown domain ends the stream with `INVALID_ARGUMENT`.
///
/// ```
/// use portcullis::MemoryStore;
/// use portcullis_envoy::{Config, LiveConfig, RlqsService};
///
/// let config = Config::parse("envoy.toml", "[[domains]]\nname = \"edge\"\n[[domains.descriptors]]\nkey = \"tenant\"\nlimit = 600\nperiod = \"1m\"\n")?;
/// let rlqs = RlqsService::builder(LiveConfig::new(config), MemoryStore::new()).build();
/// let _server = rlqs.into_server();
/// # Ok::<(), portcullis_envoy::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RlqsService {
    live: LiveConfig,
    store: Arc<dyn DescriptorStore>,
    interval: Duration,
    instances: Arc<Instances>,
    next_stream: Arc<AtomicU64>,
    log: Arc<LogGate>,
}

impl std::fmt::Debug for RlqsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlqsService")
            .field("report_interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// Builds an [`RlqsService`].
#[derive(Debug)]
#[must_use]
pub struct RlqsServiceBuilder {
    service: RlqsService,
}

impl RlqsServiceBuilder {
    /// How often Envoy reports (Envoy 1.40 reports every 5 s, whatever its
    /// `reporting_interval` says; the default). Rounded to whole seconds,
    /// at least one: Envoy reads a token bucket's fill interval in whole
    /// seconds.
    pub fn report_interval(mut self, interval: Duration) -> Self {
        self.service.interval = Duration::from_secs(interval.as_secs().max(1));
        self
    }

    /// The service.
    #[must_use]
    pub fn build(self) -> RlqsService {
        self.service
    }
}

impl RlqsService {
    /// A builder of the service reading `live` and deciding on `store`.
    pub fn builder(live: LiveConfig, store: impl DescriptorStore) -> RlqsServiceBuilder {
        RlqsServiceBuilder {
            service: Self {
                live,
                store: Arc::new(store),
                interval: Duration::from_secs(5),
                instances: Arc::new(Instances::default()),
                next_stream: Arc::new(AtomicU64::new(0)),
                log: Arc::new(LogGate::new()),
            },
        }
    }

    /// The tonic service to add to a server.
    #[must_use]
    pub fn into_server(self) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self)
    }

    /// Opens the state of one stream (one Envoy instance); its reports go
    /// to [`RlqsStream::answer`]. What `StreamRateLimitQuotas` does for
    /// each message, callable without gRPC.
    #[must_use]
    pub fn open_stream(&self) -> RlqsStream {
        RlqsStream {
            service: self.clone(),
            id: self.next_stream.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// One Envoy instance's stream: its reports answered in order. Dropping
/// it stops counting the instance.
#[derive(Debug)]
pub struct RlqsStream {
    service: RlqsService,
    id: u64,
}

impl Drop for RlqsStream {
    fn drop(&mut self) {
        self.service.instances.forget(self.id);
    }
}

impl RlqsStream {
    /// Charges a report's usage and answers its buckets.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for an empty or unknown domain, or more than
    /// [`MAX_BUCKETS_PER_REPORT`] buckets.
    pub async fn answer(
        &self,
        reports: &RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
        let service = &self.service;
        let config = service.live.load();
        let domain = &reports.domain;
        if domain.is_empty() || domain.len() > MAX_ENTRY_LEN || !config.has_domain(domain) {
            return Err(Status::invalid_argument(format!(
                "unknown domain {:?}: set the rate_limit_quota filter's `domain` to one in the rate-limit configuration",
                domain.chars().take(64).collect::<String>()
            )));
        }
        if reports.bucket_quota_usages.len() > MAX_BUCKETS_PER_REPORT {
            return Err(Status::invalid_argument(format!(
                "{} buckets in one report, more than {MAX_BUCKETS_PER_REPORT}",
                reports.bucket_quota_usages.len()
            )));
        }
        let mut actions = Vec::with_capacity(reports.bucket_quota_usages.len());
        for usage in &reports.bucket_quota_usages {
            let Some(bucket_id) = usage.bucket_id.as_ref().filter(|b| !b.bucket.is_empty()) else {
                // Without an id there is nothing to answer to.
                continue;
            };
            let action = self.bucket_action(&config, domain, bucket_id, usage).await;
            if let Some(action) = action {
                actions.push(BucketAction {
                    bucket_id: Some(bucket_id.clone()),
                    bucket_action: Some(action),
                });
            }
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    async fn bucket_action(
        &self,
        config: &crate::Config,
        domain: &str,
        bucket_id: &BucketId,
        usage: &BucketQuotaUsage,
    ) -> Option<Action> {
        let service = &self.service;
        let valid = bucket_id.bucket.len() <= MAX_ENTRIES
            && bucket_id.bucket.iter().all(|(k, v)| {
                !k.is_empty() && k.len() <= MAX_ENTRY_LEN && v.len() <= MAX_ENTRY_LEN
            });
        if !valid {
            return Some(Action::AbandonAction(AbandonAction {}));
        }
        let mut entries: Vec<(&str, &str)> = bucket_id
            .bucket
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        entries.sort_unstable();
        let ttl = service.interval * 2;
        let Some(rule) = config.rule_for(domain, &entries) else {
            return Some(blanket(BlanketRule::AllowAll, ttl));
        };
        let policy = rule.policy();
        let subject = descriptor_subject(domain, &entries);
        let instances =
            service
                .instances
                .touch(&subject, self.id, service.interval, Instant::now());
        let room = match count_usage(&*service.store, &subject, policy, usage).await {
            Ok(room) => room,
            Err(error) => {
                service.log.warn(format_args!(
                    "RLQS: charging a usage report failed; the bucket keeps its assignment: {}",
                    crate::rls::chain(&error)
                ));
                return None;
            }
        };
        if rule.is_shadow() {
            return Some(blanket(BlanketRule::AllowAll, ttl));
        }
        if !room {
            return Some(blanket(BlanketRule::DenyAll, ttl));
        }
        let share = share(policy, service.interval, instances);
        Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(pb_duration(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(Strategy::TokenBucket(TokenBucket {
                    max_tokens: share,
                    tokens_per_fill: Some(UInt32Value { value: share }),
                    fill_interval: Some(pb_duration(service.interval)),
                })),
            }),
        }))
    }
}

/// Charges the requests a report says were allowed to `subject` and
/// tells whether the subject has room for one more.
///
/// GCRA and the token bucket are post-charged ([`DescriptorStore::charge`]):
/// usage past the limit is carried as a debt, up to one capacity. The
/// windows, the log and the leaky bucket cannot carry a debt
/// ([`supports_charge`](portcullis_core::algorithms::supports_charge)):
/// the usage is checked with its count as the cost, and when that does not
/// fit, the room left (the denial's `remaining`) is charged instead, so the
/// subject is full until its window or log frees permits; usage beyond the
/// limit is not carried. An admitted charge that leaves nothing counts as no
/// room, so the bucket is denied until a report finds some.
async fn count_usage(
    store: &dyn DescriptorStore,
    subject: &str,
    policy: &Policy,
    usage: &BucketQuotaUsage,
) -> Result<bool, portcullis_core::StoreError> {
    let used = usage.num_requests_allowed;
    let pair = [(subject, policy)];
    if used == 0 {
        return Ok(store.check_all(&pair, 0).await?.is_allowed());
    }
    if portcullis_core::algorithms::supports_charge(policy.algorithm()) {
        return Ok(store.charge(subject, policy, used).await?.is_allowed());
    }
    let verdict = store.check_all(&pair, used).await?;
    let remaining = verdict.decisions().first().map_or(0, |d| d.remaining());
    if verdict.is_allowed() || remaining == 0 {
        return Ok(verdict.is_allowed() && remaining > 0);
    }
    // Over the room left: the room is used up. (Another instance may have
    // taken part of it meanwhile; then this charge is refused and the
    // subject is full all the same.)
    store.check_all(&pair, remaining).await?;
    Ok(false)
}

/// One instance's share of `policy` per report interval: the permits the
/// policy admits in `interval`, divided by `instances`, rounded down, at
/// least 1, at most the policy's capacity.
pub(crate) fn share(policy: &Policy, interval: Duration, instances: usize) -> u32 {
    let per_interval = u128::from(policy.limit()) * interval.as_micros()
        / u128::from(policy.period_micros().max(1));
    let share = per_interval / (instances.max(1) as u128);
    let share = share.clamp(1, u128::from(policy.capacity().max(1)));
    u32::try_from(share).unwrap_or(u32::MAX)
}

fn blanket(rule: BlanketRule, ttl: Duration) -> Action {
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: Some(pb_duration(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(Strategy::BlanketRule(rule as i32)),
        }),
    })
}

fn pb_duration(duration: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ResponseStream;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let mut inbound = request.into_inner();
        let stream = self.open_stream();
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            // Reports are answered in order; the stream ends when Envoy
            // closes it, on a transport error, or after an error answer.
            while let Some(Ok(reports)) = inbound.next().await {
                let answer = stream.answer(&reports).await;
                let failed = answer.is_err();
                if sender.send(answer).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// The instances (streams) reporting each bucket: a stream counts for a
/// bucket until two report intervals pass without its report, or it ends.
/// Buckets are held by the SHA-256 of their subject, so a bucket id of
/// long values (a client's header) costs 32 bytes here, not its length.
///
/// Past [`MAX_TRACKED_BUCKETS`], a new bucket sweeps the table for stale
/// ones at most once per report interval (a flood of new bucket ids, from
/// a header the client sets, must not make every report walk the table);
/// until a sweep frees room, new buckets count one instance.
#[derive(Debug)]
struct Instances {
    table: Mutex<Table>,
    /// [`MAX_TRACKED_BUCKETS`] (smaller in tests).
    limit: usize,
}

impl Default for Instances {
    fn default() -> Self {
        Self {
            table: Mutex::default(),
            limit: MAX_TRACKED_BUCKETS,
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    buckets: HashMap<[u8; 32], HashMap<u64, Instant>>,
    /// When the full table was last swept.
    swept: Option<Instant>,
}

impl Instances {
    /// Records `stream`'s report of `subject`; returns how many streams
    /// report it now.
    fn touch(&self, subject: &str, stream: u64, interval: Duration, now: Instant) -> usize {
        let stale = interval * 2;
        let key: [u8; 32] = Sha256::digest(subject.as_bytes()).into();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let Table { buckets, swept } = &mut *table;
        if !buckets.contains_key(&key) && buckets.len() >= self.limit {
            if swept.is_none_or(|at| now.duration_since(at) >= interval) {
                *swept = Some(now);
                buckets.retain(|_, streams| {
                    streams.retain(|_, seen| now.duration_since(*seen) < stale);
                    !streams.is_empty()
                });
            }
            if buckets.len() >= self.limit {
                return 1;
            }
        }
        let streams = buckets.entry(key).or_default();
        streams.insert(stream, now);
        streams.retain(|_, seen| now.duration_since(*seen) < stale);
        streams.len()
    }

    /// Forgets a stream that ended.
    fn forget(&self, stream: u64) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.buckets.retain(|_, streams| {
            streams.remove(&stream);
            !streams.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_divide_one_intervals_permits_with_a_floor_of_one() {
        let policy = Policy::per_minute(600).build().unwrap();
        let five = Duration::from_secs(5);
        assert_eq!(share(&policy, five, 1), 50);
        assert_eq!(share(&policy, five, 3), 16);
        assert_eq!(share(&policy, five, 1000), 1);
        // Never above the capacity: a per-second policy under 5 s reports.
        let fast = Policy::per_second(10).build().unwrap();
        assert_eq!(share(&fast, five, 1), 10);
    }

    #[test]
    fn instances_count_streams_until_they_end() {
        let instances = Instances::default();
        let interval = Duration::from_secs(5);
        let long = "v".repeat(10_000);
        let now = Instant::now();
        assert_eq!(instances.touch(&long, 1, interval, now), 1);
        assert_eq!(instances.touch(&long, 2, interval, now), 2);
        assert_eq!(instances.touch(&long, 2, interval, now), 2);
        assert_eq!(instances.touch("other", 2, interval, now), 1);
        instances.forget(1);
        assert_eq!(instances.touch(&long, 2, interval, now), 1);
        instances.forget(2);
        assert!(instances.table.lock().unwrap().buckets.is_empty());
    }

    #[test]
    fn a_full_table_is_swept_at_most_once_per_interval() {
        let instances = Instances {
            table: Mutex::default(),
            limit: 2,
        };
        let interval = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let held = |name: &str| {
            let key: [u8; 32] = Sha256::digest(name.as_bytes()).into();
            instances.table.lock().unwrap().buckets.contains_key(&key)
        };
        instances.touch("a", 1, interval, at(0));
        instances.touch("b", 1, interval, at(0));
        // Full, nothing stale yet: swept, and the new bucket counts one.
        assert_eq!(instances.touch("c", 2, interval, at(9_900)), 1);
        assert!(!held("c"));
        // a and b are stale now, but the last sweep was 600 ms ago: no
        // walk of the table.
        assert_eq!(instances.touch("d", 2, interval, at(10_500)), 1);
        assert!(held("a") && held("b") && !held("d"));
        // An interval later the sweep runs and makes room.
        assert_eq!(instances.touch("e", 2, interval, at(14_900)), 1);
        assert!(!held("a") && !held("b") && held("e"));
    }
}
