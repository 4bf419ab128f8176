//! [`RlsService`]: Envoy's RLS v3 `ShouldRateLimit` on a
//! [`DescriptorStore`]: a request's descriptors validated and bounded,
//! matched to the configuration's rules, decided in one atomic step (all
//! or nothing), and answered with one status per descriptor.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use portcullis_core::{Decision, ErrorScope, Policy, StoreError};
use tonic::{Request, Response, Status};

use crate::log::LogGate;
use crate::subject::descriptor_subject;
use crate::{Config, DescriptorStore, LiveConfig};

/// Most descriptors one request may carry (Envoy sends one per matching
/// `rate_limits` action: a handful).
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 16;
/// Longest descriptor key or value, and longest domain, in bytes.
pub const MAX_ENTRY_LEN: usize = 1024;

/// Envoy's RLS v3 rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`)
/// on a [`DescriptorStore`], to mount on any tonic server with
/// [`RlsService::into_server`].
///
/// For each request: the domain must be configured and the descriptors
/// well-formed (else `INVALID_ARGUMENT`, nothing charged); each descriptor
/// finds its rule ([`Config::rule_for`]); the enforced rules are decided
/// in **one atomic step**, all or nothing, with the request's cost
/// (`hits_addend`, 1 when unset; a descriptor's own `hits_addend` when all
/// limited descriptors agree on it; 0 peeks); rules in shadow mode are
/// decided in a second step of their own, answered `OK` and logged when
/// they would deny. Each descriptor's status carries `current_limit`,
/// `limit_remaining` and `duration_until_reset` when a rule limits it. A
/// descriptor's own `limit` (an override from Envoy's route) is ignored:
/// the limits are the configuration's.
///
/// **When the store fails.** A store that is down or slow
/// ([`ErrorScope::Store`]) is answered `UNAVAILABLE`: Envoy then lets the
/// request through, or denies it with `failure_mode_deny: true` in its
/// `ratelimit` filter — Envoy's setting decides. A store at its bound
/// ([`ErrorScope::NoRoom`]) is answered `OVER_LIMIT` (denied, never let
/// through), as is a cost above a rule's capacity (it can never pass).
///
/// ```
/// use portcullis::MemoryStore;
/// use portcullis_envoy::{Config, LiveConfig, RlsService};
///
/// let config = Config::parse("envoy.toml", "[[domains]]\nname = \"edge\"\n[[domains.descriptors]]\nkey = \"remote_address\"\nlimit = 10\nperiod = \"1s\"\n")?;
/// let service = RlsService::builder(LiveConfig::new(config), MemoryStore::new()).build();
/// // Mount it: tonic::transport::Server::builder().add_service(service.into_server())
/// let _server = service.into_server();
/// # Ok::<(), portcullis_envoy::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RlsService {
    live: LiveConfig,
    store: Arc<dyn DescriptorStore>,
    /// Store failures and refusals.
    log: Arc<LogGate>,
    /// Shadow-mode denials: requests cause them, so they get a gate of
    /// their own and cannot crowd out the store's failures.
    shadow_log: Arc<LogGate>,
    headers: bool,
}

impl std::fmt::Debug for RlsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsService")
            .field("domains", &self.live.load().domains())
            .finish_non_exhaustive()
    }
}

/// Builds an [`RlsService`].
#[derive(Debug)]
#[must_use]
pub struct RlsServiceBuilder {
    service: RlsService,
}

impl RlsServiceBuilder {
    /// Asks Envoy to add the IETF `RateLimit-Policy` and `RateLimit`
    /// fields to its responses (`response_headers_to_add`), for the limits
    /// a request was checked against: `"name";q=<limit>;w=<seconds>` and
    /// `"name";r=<remaining>;t=<seconds to full>`. Off by default.
    ///
    /// ```
    /// use portcullis::MemoryStore;
    /// use portcullis_envoy::{Config, LiveConfig, RlsService};
    ///
    /// let live = LiveConfig::new(Config::default());
    /// let service = RlsService::builder(live, MemoryStore::new()).rate_limit_headers(true).build();
    /// # let _ = service;
    /// ```
    pub fn rate_limit_headers(mut self, enabled: bool) -> Self {
        self.service.headers = enabled;
        self
    }

    /// The service.
    #[must_use]
    pub fn build(self) -> RlsService {
        self.service
    }
}

impl RlsService {
    /// A builder of the service reading `live` and deciding on `store`.
    pub fn builder(live: LiveConfig, store: impl DescriptorStore) -> RlsServiceBuilder {
        RlsServiceBuilder {
            service: Self {
                live,
                store: Arc::new(store),
                log: Arc::new(LogGate::new()),
                shadow_log: Arc::new(LogGate::new()),
                headers: false,
            },
        }
    }

    /// The tonic service to add to a server.
    #[must_use]
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }

    /// Decides one request (what `ShouldRateLimit` answers).
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a bad request, `UNAVAILABLE` when the store
    /// is down, `FAILED_PRECONDITION` when the store cannot decide the
    /// request atomically (Redis Cluster with several subjects).
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let config = self.live.load();
        let matched = Matched::new(&config, request)?;
        let mut statuses: Vec<DescriptorStatus> = (0..request.descriptors.len())
            .map(|_| ok_status())
            .collect();
        let mut over = false;
        let mut headers = Headers::default();
        // A cost no amount of waiting admits: denied, nothing charged.
        let too_costly: Vec<usize> = matched
            .enforced
            .iter()
            .filter(|check| matched.cost > check.policy.capacity())
            .map(|check| check.index)
            .collect();
        if !too_costly.is_empty() {
            for check in &matched.enforced {
                let status = &mut statuses[check.index];
                status.current_limit = Some(current_limit(&check.policy));
                if too_costly.contains(&check.index) {
                    status.code = Code::OverLimit as i32;
                }
            }
            matched.copy_duplicates(&mut statuses);
            return Ok(response(true, statuses));
        }
        if !matched.enforced.is_empty() {
            let pairs = matched.pairs(&matched.enforced);
            match self.store.check_all(&pairs, matched.cost).await {
                Ok(verdict) => {
                    over = !verdict.is_allowed();
                    for (check, decision) in matched.enforced.iter().zip(verdict.decisions()) {
                        statuses[check.index] = status_of(&check.policy, decision, false);
                        if self.headers {
                            headers.add(&check.policy, decision);
                        }
                    }
                }
                Err(error) => {
                    return match error.scope() {
                        ErrorScope::NoRoom => {
                            for check in &matched.enforced {
                                let status = &mut statuses[check.index];
                                status.code = Code::OverLimit as i32;
                                status.current_limit = Some(current_limit(&check.policy));
                            }
                            matched.copy_duplicates(&mut statuses);
                            Ok(response(true, statuses))
                        }
                        _ => Err(self.store_failure(&error)),
                    };
                }
            }
        }
        if !matched.shadow.is_empty() {
            let pairs = matched.pairs(&matched.shadow);
            // Shadow rules never decide: a failure is only logged.
            match self.store.check_all(&pairs, matched.cost).await {
                Ok(verdict) => {
                    for (check, decision) in matched.shadow.iter().zip(verdict.decisions()) {
                        statuses[check.index] = status_of(&check.policy, decision, true);
                        if !decision.is_allowed() {
                            self.shadow_log.info(format_args!(
                                "shadow-mode limit {} of domain {:?} would have denied a request",
                                check.policy.name(),
                                clip(&request.domain)
                            ));
                        }
                    }
                }
                Err(error) => self.log.warn(format_args!(
                    "shadow-mode check failed (answered OK): {}",
                    chain(&error)
                )),
            }
        }
        matched.copy_duplicates(&mut statuses);
        let mut answer = response(over, statuses);
        answer.response_headers_to_add = headers.into_fields();
        Ok(answer)
    }

    /// The status a store failure is answered with (logged, rate-limited).
    fn store_failure(&self, error: &StoreError) -> Status {
        match error.scope() {
            ErrorScope::Store => {
                self.log.warn(format_args!(
                    "rate-limit store failed, answered UNAVAILABLE (Envoy's failure_mode_deny decides): {}",
                    chain(error)
                ));
                Status::unavailable(
                    "the rate-limit store is unavailable: Envoy's failure_mode_deny decides",
                )
            }
            // The status goes to Envoy (the operator's proxy), which logs
            // it; the operator's own log says it too.
            ErrorScope::Request => {
                self.log.warn(format_args!(
                    "rate-limit store cannot decide these descriptors, answered FAILED_PRECONDITION: {}",
                    chain(error)
                ));
                Status::failed_precondition(error.to_string())
            }
            _ => {
                self.log.warn(format_args!(
                    "rate-limit store refused a check: {}",
                    chain(error)
                ));
                Status::unavailable("the rate-limit store could not decide this request")
            }
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// One descriptor a rule limits.
struct Check {
    /// The descriptor's place in the request.
    index: usize,
    subject: String,
    policy: Policy,
}

/// A request validated and matched to rules.
struct Matched {
    cost: u64,
    enforced: Vec<Check>,
    shadow: Vec<Check>,
    /// Descriptors that repeat an earlier one (same subject and rule):
    /// checked once, answered alike: (repeat, first).
    duplicates: Vec<(usize, usize)>,
}

impl Matched {
    fn new(config: &Config, request: &RateLimitRequest) -> Result<Self, Status> {
        let domain = &request.domain;
        if domain.is_empty() {
            return Err(Status::invalid_argument(
                "the domain is empty: set `domain` in Envoy's ratelimit filter",
            ));
        }
        if domain.len() > MAX_ENTRY_LEN || !config.has_domain(domain) {
            return Err(Status::invalid_argument(format!(
                "unknown domain {:?}: add it to the rate-limit configuration or fix Envoy's ratelimit filter",
                clip(domain)
            )));
        }
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument(
                "the request has no descriptors: Envoy sends one per matching rate_limits action",
            ));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(Status::invalid_argument(format!(
                "{} descriptors in one request, more than {MAX_DESCRIPTORS}: send fewer rate_limits actions per route",
                request.descriptors.len()
            )));
        }
        let base_cost = match request.hits_addend {
            0 => 1,
            n => u64::from(n),
        };
        let mut matched = Self {
            cost: base_cost,
            enforced: Vec::new(),
            shadow: Vec::new(),
            duplicates: Vec::new(),
        };
        let mut cost: Option<u64> = None;
        let mut entries: Vec<(&str, &str)> = Vec::with_capacity(MAX_ENTRIES);
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            validate(index, descriptor)?;
            entries.clear();
            entries.extend(
                descriptor
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str())),
            );
            let Some(rule) = config.rule_for(domain, &entries) else {
                continue;
            };
            let own = descriptor.hits_addend.map_or(base_cost, |v| v.value);
            if cost.is_some_and(|c| c != own) {
                return Err(Status::invalid_argument(
                    "the limited descriptors of one request carry different hits_addend values: \
                     one request is charged one cost; give them the same hits_addend",
                ));
            }
            cost = Some(own);
            let subject = descriptor_subject(domain, &entries);
            let list = if rule.is_shadow() {
                &mut matched.shadow
            } else {
                &mut matched.enforced
            };
            let policy = rule.policy();
            if let Some(first) = list
                .iter()
                .find(|c| c.subject == subject && c.policy.name() == policy.name())
            {
                matched.duplicates.push((index, first.index));
                continue;
            }
            list.push(Check {
                index,
                subject,
                policy: policy.clone(),
            });
        }
        matched.cost = cost.unwrap_or(base_cost);
        Ok(matched)
    }

    fn pairs<'a>(&self, checks: &'a [Check]) -> Vec<(&'a str, &'a Policy)> {
        checks
            .iter()
            .map(|c| (c.subject.as_str(), &c.policy))
            .collect()
    }

    fn copy_duplicates(&self, statuses: &mut [DescriptorStatus]) {
        for &(repeat, first) in &self.duplicates {
            statuses[repeat] = statuses[first].clone();
        }
    }
}

/// Refuses a malformed descriptor.
fn validate(index: usize, descriptor: &RateLimitDescriptor) -> Result<(), Status> {
    if descriptor.entries.is_empty() {
        return Err(Status::invalid_argument(format!(
            "descriptor {index} has no entries"
        )));
    }
    if descriptor.entries.len() > MAX_ENTRIES {
        return Err(Status::invalid_argument(format!(
            "descriptor {index} has {} entries, more than {MAX_ENTRIES}",
            descriptor.entries.len()
        )));
    }
    if descriptor.is_negative_hits {
        return Err(Status::invalid_argument(format!(
            "descriptor {index} asks for negative hits, which this service does not take"
        )));
    }
    for entry in &descriptor.entries {
        if entry.key.is_empty()
            || entry.key.len() > MAX_ENTRY_LEN
            || entry.value.len() > MAX_ENTRY_LEN
        {
            return Err(Status::invalid_argument(format!(
                "descriptor {index} has an empty key, or a key or value longer than {MAX_ENTRY_LEN} bytes"
            )));
        }
    }
    Ok(())
}

/// At most 64 characters of a client's string, for a message.
fn clip(text: &str) -> String {
    text.chars().take(64).collect()
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

fn response(over: bool, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        ..RateLimitResponse::default()
    }
}

fn status_of(policy: &Policy, decision: &Decision, shadow: bool) -> DescriptorStatus {
    let reset = decision.reset_after();
    DescriptorStatus {
        code: if decision.is_allowed() || shadow {
            Code::Ok
        } else {
            Code::OverLimit
        } as i32,
        current_limit: Some(current_limit(policy)),
        limit_remaining: u32::try_from(decision.remaining()).unwrap_or(u32::MAX),
        duration_until_reset: Some(PbDuration {
            seconds: i64::try_from(reset.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(reset.subsec_nanos()).unwrap_or(0),
        }),
        quota: None,
    }
}

/// The policy as Envoy's `RateLimit`: the limit per the smallest unit the
/// period divides (10 per 10 s is 60 per minute); `UNKNOWN` with the
/// limit when no unit is a multiple of the period (90 s, say).
pub(crate) fn current_limit(policy: &Policy) -> RateLimit {
    const UNITS: [(u64, Unit); 4] = [
        (1_000_000, Unit::Second),
        (60_000_000, Unit::Minute),
        (3_600_000_000, Unit::Hour),
        (86_400_000_000, Unit::Day),
    ];
    let period = policy.period_micros().max(1);
    let (requests, unit) = UNITS
        .iter()
        .find(|(unit_us, _)| unit_us % period == 0)
        .map_or((policy.limit(), Unit::Unknown), |(unit_us, unit)| {
            (policy.limit().saturating_mul(unit_us / period), *unit)
        });
    RateLimit {
        name: policy.name().to_owned(),
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

/// The IETF `RateLimit-Policy` and `RateLimit` fields of a response.
#[derive(Default)]
struct Headers {
    policy: String,
    state: String,
}

impl Headers {
    fn add(&mut self, policy: &Policy, decision: &Decision) {
        let sep = |s: &mut String| {
            if !s.is_empty() {
                s.push_str(", ");
            }
        };
        sep(&mut self.policy);
        sep(&mut self.state);
        let reset = decision.reset_after();
        let reset_secs = reset.as_secs() + u64::from(reset.subsec_nanos() > 0);
        let window = policy.period().as_secs().max(1);
        // Policy names are ASCII letters, digits, `_`, `-`, `.`: nothing
        // to escape in a quoted string.
        self.policy.push_str(&format!(
            "\"{}\";q={};w={window}",
            policy.name(),
            decision.limit()
        ));
        self.state.push_str(&format!(
            "\"{}\";r={};t={reset_secs}",
            policy.name(),
            decision.remaining()
        ));
    }

    fn into_fields(self) -> Vec<HeaderValue> {
        if self.policy.is_empty() {
            return Vec::new();
        }
        vec![
            HeaderValue {
                key: "ratelimit-policy".to_owned(),
                value: self.policy,
                raw_value: Vec::new(),
            },
            HeaderValue {
                key: "ratelimit".to_owned(),
                value: self.state,
                raw_value: Vec::new(),
            },
        ]
    }
}

/// An error and its sources, for a log line.
pub(crate) fn chain(error: &StoreError) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        text.push_str(": ");
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}
