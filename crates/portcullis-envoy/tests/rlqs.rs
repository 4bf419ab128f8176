//! The RLQS service's answers, report by report, on the memory store and
//! a real Redis (`PORTCULLIS_REDIS_URL`, from `cargo xtask test`): shares
//! sized from the policy and the reporting instances, usage charged
//! exactly (an RLS descriptor with the same entries sees it), withdrawal
//! when the subject runs out, for every algorithm, and bucket ids that
//! cannot be used.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use portcullis_core::MemoryStore;
use portcullis_envoy::{Config, DescriptorStore, LiveConfig, RlqsService, RlsService};
use portcullis_redis::RedisStore;

const CONFIG: &str = r#"
[[domains]]
name = "edge"

[[domains.descriptors]]
key = "tenant"
limit = 600
period = "1m"

[[domains.descriptors]]
key = "quiet"
limit = 3
period = "1h"
algorithm = "token_bucket"

[[domains.descriptors]]
key = "fixed"
limit = 10
period = "1h"
algorithm = "fixed_window"

[[domains.descriptors]]
key = "sliding"
limit = 10
period = "1h"
algorithm = "sliding_window"

[[domains.descriptors]]
key = "log"
limit = 10
period = "1h"
algorithm = "sliding_log"

[[domains.descriptors]]
key = "meter"
limit = 10
period = "1h"
algorithm = "leaky_meter"

[[domains.descriptors]]
key = "queue"
limit = 10
period = "1h"
algorithm = "leaky_queue"
"#;

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    }
}

fn report(entries: &[(&str, &str)], allowed: u64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(bucket(entries)),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }],
    }
}

/// The one action of a one-bucket answer.
fn action(response: &RateLimitQuotaResponse) -> Action {
    assert_eq!(response.bucket_action.len(), 1, "{response:?}");
    response.bucket_action[0].bucket_action.unwrap()
}

/// The token bucket's (max_tokens, tokens_per_fill, fill seconds) and the
/// time to live, or the blanket rule.
fn assignment(action: Action) -> Result<((u32, u32, i64), i64), BlanketRule> {
    let Action::QuotaAssignmentAction(assignment) = action else {
        panic!("not an assignment: {action:?}");
    };
    let ttl = assignment.assignment_time_to_live.unwrap().seconds;
    match assignment.rate_limit_strategy.unwrap().strategy.unwrap() {
        Strategy::TokenBucket(tb) => Ok((
            (
                tb.max_tokens,
                tb.tokens_per_fill.unwrap().value,
                tb.fill_interval.unwrap().seconds,
            ),
            ttl,
        )),
        Strategy::BlanketRule(rule) => Err(BlanketRule::try_from(rule).unwrap()),
        other @ Strategy::RequestsPerTimeUnit(_) => panic!("{other:?}"),
    }
}

fn services(store: impl DescriptorStore + Clone) -> (RlqsService, RlsService) {
    let live = LiveConfig::new(Config::parse("rlqs-test.toml", CONFIG).unwrap());
    (
        RlqsService::builder(live.clone(), store.clone()).build(),
        RlsService::builder(live, store).build(),
    )
}

fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{label}-{}-{nanos}", std::process::id())
}

async fn shares_usage_and_withdrawal(store: impl DescriptorStore + Clone) {
    let (rlqs, rls) = services(store);
    let tenant = unique("t");
    let entries = [("tenant", tenant.as_str())];
    let one = rlqs.open_stream();
    // 600 per minute is 50 per 5 s report interval: one instance gets all.
    let first = one.answer(&report(&entries, 0)).await.unwrap();
    assert_eq!(assignment(action(&first)), Ok(((50, 50, 5), 10)));
    // A second instance reports the bucket: each gets half.
    let two = rlqs.open_stream();
    let second = two.answer(&report(&entries, 0)).await.unwrap();
    assert_eq!(assignment(action(&second)), Ok(((25, 25, 5), 10)));
    // Usage is charged exactly: an RLS descriptor with the same entries
    // shares the state.
    one.answer(&report(&entries, 240)).await.unwrap();
    two.answer(&report(&entries, 350)).await.unwrap();
    let rls_request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".to_owned(),
                value: tenant.clone(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let seen = rls.decide(&rls_request).await.unwrap();
    let remaining = seen.statuses[0].limit_remaining;
    // 600 - 590 - 1, give or take what refilled in the test's time.
    assert!((9..=12).contains(&remaining), "{remaining}");
    // The instances report more than is left: the subject runs out, and
    // both are withdrawn.
    let out = one.answer(&report(&entries, 40)).await.unwrap();
    assert_eq!(assignment(action(&out)), Err(BlanketRule::DenyAll));
    let still = two.answer(&report(&entries, 0)).await.unwrap();
    assert_eq!(assignment(action(&still)), Err(BlanketRule::DenyAll));
    // One instance leaves: the other gets the whole share again once the
    // subject has room (here: a fresh bucket).
    drop(two);
    let fresh = unique("t");
    let again = one
        .answer(&report(&[("tenant", fresh.as_str())], 0))
        .await
        .unwrap();
    assert_eq!(assignment(action(&again)), Ok(((50, 50, 5), 10)));
}

#[tokio::test]
async fn memory_shares_usage_and_withdrawal() {
    shares_usage_and_withdrawal(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_shares_usage_and_withdrawal() {
    let url = std::env::var("PORTCULLIS_REDIS_URL")
        .expect("PORTCULLIS_REDIS_URL is not set: run these tests with `cargo xtask test`");
    let store = RedisStore::builder()
        .url(url)
        .prefix(unique("rlqs"))
        .build()
        .await
        .expect("Redis at PORTCULLIS_REDIS_URL must answer");
    shares_usage_and_withdrawal(store).await;
}

#[tokio::test]
async fn a_slow_policy_still_gets_one_token_and_is_withdrawn_when_spent() {
    let (rlqs, _) = services(MemoryStore::new());
    let stream = rlqs.open_stream();
    let entries = [("quiet", "q")];
    // 3 per hour is far below one per interval: one token per interval,
    // and the reports withdraw it once three are spent.
    let first = stream.answer(&report(&entries, 0)).await.unwrap();
    assert_eq!(assignment(action(&first)), Ok(((1, 1, 5), 10)));
    let after = stream.answer(&report(&entries, 3)).await.unwrap();
    assert_eq!(assignment(action(&after)), Err(BlanketRule::DenyAll));
}

#[tokio::test]
async fn unlimited_malformed_and_unknown_buckets() {
    let (rlqs, _) = services(MemoryStore::builder().max_keys(16).build());
    let stream = rlqs.open_stream();
    // No rule: allowed.
    let free = stream.answer(&report(&[("other", "x")], 7)).await.unwrap();
    assert_eq!(assignment(action(&free)), Err(BlanketRule::AllowAll));
    // Too many entries, or a value too long: abandoned.
    let wide: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let abandoned = stream.answer(&report(&wide, 1)).await.unwrap();
    assert!(matches!(action(&abandoned), Action::AbandonAction(_)));
    let long = "v".repeat(portcullis_envoy::MAX_ENTRY_LEN + 1);
    let abandoned = stream
        .answer(&report(&[("tenant", &long)], 1))
        .await
        .unwrap();
    assert!(matches!(action(&abandoned), Action::AbandonAction(_)));
    // No bucket id: nothing to answer.
    let mut no_id = report(&[("tenant", "a")], 1);
    no_id.bucket_quota_usages[0].bucket_id = None;
    assert!(stream
        .answer(&no_id)
        .await
        .unwrap()
        .bucket_action
        .is_empty());
    // An unknown domain, or too many buckets: the stream's error.
    let mut unknown = report(&[("tenant", "a")], 1);
    unknown.domain = "nope".to_owned();
    let err = stream.answer(&unknown).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let mut flood = report(&[("tenant", "a")], 0);
    flood.bucket_quota_usages = (0..=portcullis_envoy::MAX_BUCKETS_PER_REPORT)
        .map(|i| report(&[("tenant", &format!("t{i}"))], 0).bucket_quota_usages[0].clone())
        .collect();
    let err = stream.answer(&flood).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn many_tenants_stay_within_the_stores_bound() {
    let store = MemoryStore::builder().max_keys(32).build();
    let (rlqs, _) = services(store.clone());
    let stream = rlqs.open_stream();
    for i in 0..500 {
        let tenant = format!("tenant-{i}");
        let answer = stream
            .answer(&report(&[("tenant", &tenant)], 1))
            .await
            .unwrap();
        assert!(assignment(action(&answer)).is_ok());
    }
    assert!(store.len() <= 32, "{}", store.len());
}

/// The algorithms without a debt (the windows, the log, the leaky bucket):
/// usage is counted with a check of its cost, saturating at the limit when
/// it does not fit, and the bucket is denied once nothing is left, exactly
/// as RLS then sees it.
async fn every_algorithm_is_enforced(store: impl DescriptorStore + Clone) {
    let (rlqs, rls) = services(store);
    let stream = rlqs.open_stream();
    for key in ["fixed", "sliding", "log", "meter", "queue"] {
        let value = unique(key);
        let entries = [(key, value.as_str())];
        let remaining = || async {
            let request = RateLimitRequest {
                domain: "edge".to_owned(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.to_owned(),
                        value: value.clone(),
                    }],
                    ..RateLimitDescriptor::default()
                }],
                hits_addend: 0,
            };
            // A cost-1 check: it takes one permit when one is left.
            rls.decide(&request).await.unwrap().statuses[0].limit_remaining
        };
        // 10 per hour: one token per 5 s interval.
        let first = stream.answer(&report(&entries, 0)).await.unwrap();
        assert_eq!(assignment(action(&first)), Ok(((1, 1, 5), 10)), "{key}");
        // 4 used: 6 left, still a share; RLS sees them (and takes one).
        let used = stream.answer(&report(&entries, 4)).await.unwrap();
        assert!(assignment(action(&used)).is_ok(), "{key}");
        assert_eq!(remaining().await, 5, "{key}");
        // 8 more reported than the 5 left: the subject is full, the bucket
        // denied, and RLS refuses too.
        let over = stream.answer(&report(&entries, 8)).await.unwrap();
        assert_eq!(
            assignment(action(&over)),
            Err(BlanketRule::DenyAll),
            "{key}"
        );
        assert_eq!(remaining().await, 0, "{key}");
        let still = stream.answer(&report(&entries, 0)).await.unwrap();
        assert_eq!(
            assignment(action(&still)),
            Err(BlanketRule::DenyAll),
            "{key}"
        );
    }
}

#[tokio::test]
async fn memory_enforces_every_algorithm() {
    every_algorithm_is_enforced(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_enforces_every_algorithm() {
    let url = std::env::var("PORTCULLIS_REDIS_URL")
        .expect("PORTCULLIS_REDIS_URL is not set: run these tests with `cargo xtask test`");
    let store = RedisStore::builder()
        .url(url)
        .prefix(unique("rlqs-all"))
        .build()
        .await
        .expect("Redis at PORTCULLIS_REDIS_URL must answer");
    every_algorithm_is_enforced(store).await;
}
