//! [`DescriptorStore`]: the stores the services decide on, which check
//! several subjects (one per descriptor of a request) in one atomic step,
//! all or nothing: [`MemoryStore`] and, with feature `redis`,
//! `RedisStore`.

use portcullis_core::{BoxCheckFuture, MemoryStore, Policy, Store};

/// A store that checks several subjects, each with its policy, in one
/// atomic step: all admit and are charged, or none is
/// ([`MemoryStore::check_subjects`]; `RedisStore::check_subjects` with
/// feature `redis`, whose Cluster mode takes one subject per check).
///
/// ```
/// use portcullis::{MemoryStore, Policy};
/// use portcullis_envoy::DescriptorStore;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let policy = Policy::per_minute(1).name("per-ip").build()?;
/// let pairs = [("203.0.113.7", &policy)];
/// assert!(DescriptorStore::check_all(&store, &pairs, 1).await?.is_allowed());
/// assert!(!DescriptorStore::check_all(&store, &pairs, 1).await?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub trait DescriptorStore: Send + Sync + 'static {
    /// Checks every `(subject, policy)` pair with `cost`, all or nothing;
    /// the verdict holds one decision per pair, in order.
    fn check_all(&self, checks: &[(&str, &Policy)], cost: u64) -> BoxCheckFuture;

    /// Charges `cost` permits to `subject` under `policy` after the fact
    /// (never denied; [`Store::charge`]):
    /// how RLQS usage reports are counted. GCRA and token-bucket policies
    /// only.
    fn charge(&self, subject: &str, policy: &Policy, cost: u64) -> BoxCheckFuture;
}

impl DescriptorStore for MemoryStore {
    fn check_all(&self, checks: &[(&str, &Policy)], cost: u64) -> BoxCheckFuture {
        Box::pin(std::future::ready(self.check_subjects(checks, cost)))
    }

    fn charge(&self, subject: &str, policy: &Policy, cost: u64) -> BoxCheckFuture {
        Box::pin(Store::charge(
            self,
            subject,
            std::slice::from_ref(policy),
            cost,
        ))
    }
}

#[cfg(feature = "redis")]
impl DescriptorStore for portcullis_redis::RedisStore {
    fn check_all(&self, checks: &[(&str, &Policy)], cost: u64) -> BoxCheckFuture {
        // One pair (the common request): the store's own check, which
        // takes the algorithm's fast function; several: one call of the
        // general check over every subject's keys.
        if let [(subject, policy)] = checks {
            return Box::pin(Store::check(
                self,
                subject,
                std::slice::from_ref(*policy),
                cost,
            ));
        }
        Box::pin(self.check_subjects(checks, cost))
    }

    fn charge(&self, subject: &str, policy: &Policy, cost: u64) -> BoxCheckFuture {
        Box::pin(Store::charge(
            self,
            subject,
            std::slice::from_ref(policy),
            cost,
        ))
    }
}
