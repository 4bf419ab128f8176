//! What a check may carry besides its cost ([`CheckOptions`]: an
//! idempotency key and a priority class) and what such a check answers
//! ([`Checked`]): the request side of [`Store::check_with`](crate::Store::check_with).

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::subject::hash_subject;
use crate::{validate_check, Policy, StoreError, Verdict};

/// The longest idempotency window accepted: 30 days.
pub const MAX_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// Longest idempotency key accepted, in bytes (keys are hashed before they
/// are stored, so this bounds only the work of hashing them).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 1024;

/// Replays an idempotency record answers by default before a repeat is
/// charged again: two, the retries the common HTTP API client libraries
/// make by default ([`CheckOptions::free_replays`]).
pub const DEFAULT_FREE_REPLAYS: u32 = 2;

/// Longest request fingerprint accepted, in bytes
/// ([`CheckOptions::fingerprint`]; hashed like the key).
pub const MAX_FINGERPRINT_LEN: usize = 8192;

/// Options of one check ([`Store::check_with`](crate::Store::check_with)):
/// an **idempotency key** with its window, and a **priority class**.
///
/// - With an idempotency key, the first check of a key is decided and
///   charged as usual; when it is **admitted**, its decision is recorded
///   beside the subject's state for `window`, and a repeat of the *same
///   request* within the window answers that decision again
///   ([`Checked::is_replay`]) without charging, at most
///   [`free_replays`](Self::free_replays) times
///   (default 2); past that a repeat is charged as a new
///   request. The same request means the same subject, policy names, key,
///   cost and [`fingerprint`](Self::fingerprint) (the tower layer's is the
///   method and path): a different request under a used key is a new
///   request, charged. A denial records nothing, so a retry after its
///   `retry_after` is checked afresh. So one charge buys at most
///   `1 + free_replays` admitted answers: per window a subject's admitted
///   checks are at most `(1 + free_replays) × limit`. A check of cost 0
///   (a peek) records its answer too: the tower layer's
///   `charge_from_response` peeks this way, so a retry replays the peek and
///   is not charged again after its response.
/// - With a class, each policy that defines classes
///   ([`PolicyBuilder::class`](crate::PolicyBuilder::class)) admits the
///   request only while its class's reserve remains after the charge. A
///   check without a class, or with one a policy does not define, gets
///   that policy's default class (the most reserved, unless the policy
///   names another): a class is granted by the application, never claimed.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{CheckOptions, MemoryStore, Policy, Store};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let policies = [Policy::per_minute(3).name("payments").build()?];
/// let options = CheckOptions::new().idempotency_key("pay-7f3a", Duration::from_secs(600));
/// let first = store.check_with("acme", &policies, 1, &options).await?;
/// let retry = store.check_with("acme", &policies, 1, &options).await?;
/// assert!(retry.is_replay() && retry.verdict() == first.verdict());
/// // Charged once: two permits left.
/// assert_eq!(store.peek("acme", &policies).await?.decisions()[0].remaining(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    idempotency: Option<(String, Duration)>,
    fingerprint: Option<Vec<u8>>,
    free_replays: u32,
    class: Option<String>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            idempotency: None,
            fingerprint: None,
            free_replays: DEFAULT_FREE_REPLAYS,
            class: None,
        }
    }
}

impl CheckOptions {
    /// No idempotency key and no class: a plain check.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the decision under `key` for `window`, and answers a repeat
    /// of `key` within it with that decision, charging nothing. The key is
    /// hashed (SHA-256) before it is stored: any bytes are fine, and a
    /// secret never reaches the store. The window is at most
    /// [`MAX_IDEMPOTENCY_WINDOW`]; a window of zero or an empty key is
    /// refused by the check.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::CheckOptions;
    ///
    /// let options = CheckOptions::new().idempotency_key("req-1", Duration::from_secs(60));
    /// assert_eq!(options.idempotency(), Some(("req-1", Duration::from_secs(60))));
    /// ```
    #[must_use]
    pub fn idempotency_key(mut self, key: impl Into<String>, window: Duration) -> Self {
        self.idempotency = Some((key.into(), window));
        self
    }

    /// Binds the idempotency record to this request: a check with the same
    /// key but another fingerprint is a new request, charged. Give what
    /// makes two requests the same for your application (the tower layer
    /// gives the method, the path and, when configured, a body digest).
    /// Hashed with the key; at most [`MAX_FINGERPRINT_LEN`] bytes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{CheckOptions, MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let policies = [Policy::per_minute(5).name("api").build()?];
    /// let key = |path: &str| CheckOptions::new()
    ///     .idempotency_key("same", Duration::from_secs(60))
    ///     .fingerprint(path);
    /// store.check_with("acme", &policies, 1, &key("POST /pay")).await?;
    /// let other = store.check_with("acme", &policies, 1, &key("POST /refund")).await?;
    /// assert!(!other.is_replay(), "another request under the same key is charged");
    /// assert_eq!(store.peek("acme", &policies).await?.decisions()[0].remaining(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn fingerprint(mut self, fingerprint: impl AsRef<[u8]>) -> Self {
        self.fingerprint = Some(fingerprint.as_ref().to_vec());
        self
    }

    /// How many repeats of an admitted request one record answers without
    /// charging (default 2); the repeat after them is
    /// charged as a new request (and, admitted, records anew). 0 makes
    /// every repeat a charged request: the key then only says "the same
    /// request" to the application.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{CheckOptions, MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let policies = [Policy::per_minute(5).name("api").build()?];
    /// let options = CheckOptions::new()
    ///     .idempotency_key("pay-1", Duration::from_secs(60))
    ///     .free_replays(1);
    /// let mut replays = Vec::new();
    /// for _ in 0..4 {
    ///     replays.push(store.check_with("acme", &policies, 1, &options).await?.is_replay());
    /// }
    /// // First charged, one free repeat, then charged (and recorded) again.
    /// assert_eq!(replays, [false, true, false, true]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn free_replays(mut self, free_replays: u32) -> Self {
        self.free_replays = free_replays;
        self
    }

    /// Checks as priority class `class` ([`PolicyBuilder::class`](crate::PolicyBuilder::class)).
    /// A policy that does not define `class` checks the request as its
    /// default class ([`PolicyBuilder::default_class`](crate::PolicyBuilder::default_class)).
    /// Take the class from what the application trusts (authentication,
    /// the route, the customer's plan), never from a value the client
    /// sends.
    ///
    /// ```
    /// use portcullis::CheckOptions;
    ///
    /// assert_eq!(CheckOptions::new().class("batch").priority_class(), Some("batch"));
    /// ```
    #[must_use]
    pub fn class(mut self, class: impl Into<String>) -> Self {
        self.class = Some(class.into());
        self
    }

    /// The idempotency key and window, if any.
    #[must_use]
    pub fn idempotency(&self) -> Option<(&str, Duration)> {
        self.idempotency
            .as_ref()
            .map(|(key, window)| (key.as_str(), *window))
    }

    /// The priority class, if any.
    #[must_use]
    pub fn priority_class(&self) -> Option<&str> {
        self.class.as_deref()
    }

    /// Whether the options ask for nothing beyond a plain check.
    ///
    /// ```
    /// assert!(portcullis::CheckOptions::new().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.idempotency.is_none() && self.class.is_none()
    }

    /// For store implementations (the facade's `portcullis::store::plan`,
    /// where it is documented): validates a check with these options
    /// (as [`validate_check`], plus the options) and plans it: each
    /// policy's reserve in permits, in order, and the idempotency record
    /// to consult.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{CheckOptions, Policy};
    ///
    /// let policies = [Policy::per_second(10).class("batch", 50).build()?];
    /// let plan = CheckOptions::new().class("batch").plan(&policies, 1)?;
    /// assert_eq!(plan.reserves(), &[5]);
    /// assert!(plan.record().is_none());
    /// let err = CheckOptions::new().class("batch").plan(&policies, 6).unwrap_err();
    /// assert!(err.to_string().contains("cost 6"), "{err}");
    /// let zero = CheckOptions::new().idempotency_key("k", Duration::ZERO).plan(&policies, 1);
    /// assert!(zero.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`validate_check`]; [`StoreError::Unsupported`] for an empty or
    /// too long idempotency key or fingerprint, or a window of zero or
    /// above [`MAX_IDEMPOTENCY_WINDOW`]; [`StoreError::CostTooHigh`] when
    /// the cost and the class's reserve together exceed a policy's
    /// capacity (the class can never be admitted that cost). A class a
    /// policy does not define is no error: the policy's default class
    /// applies.
    #[doc(hidden)]
    pub fn plan(&self, policies: &[Policy], cost: u64) -> Result<CheckPlan, StoreError> {
        validate_check(policies, cost)?;
        let mut reserves = Vec::with_capacity(policies.len());
        for policy in policies {
            let reserve = policy.reserve_of(self.class.as_deref());
            if cost.saturating_add(reserve) > policy.capacity() {
                return Err(StoreError::CostTooHigh {
                    policy: policy.name().to_owned(),
                    cost,
                    capacity: policy.capacity() - reserve,
                });
            }
            reserves.push(reserve);
        }
        let record = match &self.idempotency {
            Some((key, window)) => {
                let refuse = |detail: String| StoreError::Unsupported {
                    operation: "idempotency key",
                    detail,
                };
                if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
                    return Err(refuse(format!(
                        "the key is {} bytes long: send a key of 1 to {MAX_IDEMPOTENCY_KEY_LEN} bytes",
                        key.len()
                    )));
                }
                if window.is_zero() || *window > MAX_IDEMPOTENCY_WINDOW {
                    return Err(refuse(format!(
                        "the window {window:?} is out of range: give a window of 1 ms to 30 days"
                    )));
                }
                let fingerprint = self.fingerprint.as_deref().unwrap_or_default();
                if fingerprint.len() > MAX_FINGERPRINT_LEN {
                    return Err(refuse(format!(
                        "the request fingerprint is {} bytes long: give at most {MAX_FINGERPRINT_LEN} bytes (a digest, not the body)",
                        fingerprint.len()
                    )));
                }
                let window_us = u64::try_from(window.as_micros()).unwrap_or(u64::MAX).max(1);
                Some(Record {
                    id: record_id(policies, key, fingerprint, cost),
                    window_us,
                    free_replays: self.free_replays,
                })
            }
            None => None,
        };
        Ok(CheckPlan { reserves, record })
    }
}

/// `#` and the hex SHA-256 of the policy names, the cost, the key and the
/// request's fingerprint: the suffix of the record's key, the same in
/// every store.
fn record_id(policies: &[Policy], key: &str, fingerprint: &[u8], cost: u64) -> String {
    let mut hasher = Sha256::new();
    for policy in policies {
        hasher.update(policy.name().as_bytes());
        // Names never hold a control character.
        hasher.update([0x1f]);
    }
    hasher.update([0x1e]);
    hasher.update(cost.to_be_bytes());
    // Length-prefixed: no key and fingerprint pair reads as another.
    hasher.update((key.len() as u64).to_be_bytes());
    hasher.update(key.as_bytes());
    hasher.update(fingerprint);
    hash_subject(&hasher.finalize())
}

/// A validated check with options (`portcullis::store::plan`), for store
/// implementations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckPlan {
    reserves: Vec<u64>,
    record: Option<Record>,
}

/// The idempotency record a check consults and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    id: String,
    window_us: u64,
    free_replays: u32,
}

impl Record {
    /// `#` and 64 hex digits naming the record among the subject's: the
    /// SHA-256 of the policy names, the cost, the idempotency key and the
    /// request's fingerprint. A store keeps
    /// it beside the subject's state (Redis: `<prefix>:{<subject>}:<id>`,
    /// which no policy name can equal).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How long the record answers repeats, in microseconds (at least 1).
    #[must_use]
    pub fn window_micros(&self) -> u64 {
        self.window_us
    }

    /// How many repeats the record answers without charging
    /// ([`CheckOptions::free_replays`]).
    #[must_use]
    pub fn free_replays(&self) -> u32 {
        self.free_replays
    }
}

impl CheckPlan {
    /// Each policy's reserve in permits (0 for none), in order.
    #[must_use]
    pub fn reserves(&self) -> &[u64] {
        &self.reserves
    }

    /// Whether any policy has a reserve.
    #[must_use]
    pub fn has_reserves(&self) -> bool {
        self.reserves.iter().any(|r| *r > 0)
    }

    /// The idempotency record, when the check has a key.
    #[must_use]
    pub fn record(&self) -> Option<&Record> {
        self.record.as_ref()
    }
}

/// What [`Store::check_with`](crate::Store::check_with) answers: the
/// verdict, and whether it is a replay of an earlier check with the same
/// idempotency key (which charged nothing).
///
/// ```
/// use std::time::Duration;
/// use portcullis::{Checked, Decision, Verdict};
///
/// let verdict = Verdict::from_iter([Decision::allowed(5, 4, Duration::from_secs(1))]);
/// let checked = Checked::new(verdict.clone(), true);
/// assert!(checked.is_replay());
/// assert_eq!(checked.into_verdict(), verdict);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    verdict: Verdict,
    replayed: bool,
}

impl Checked {
    /// A verdict, replayed or not.
    #[must_use]
    pub fn new(verdict: Verdict, replayed: bool) -> Self {
        Self { verdict, replayed }
    }

    /// The verdict (for a replay, the first check's, as it was then).
    #[must_use]
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The verdict, by value.
    #[must_use]
    pub fn into_verdict(self) -> Verdict {
        self.verdict
    }

    /// Whether this answers a repeated idempotency key: the first check's
    /// decision, and nothing charged now.
    #[must_use]
    pub fn is_replay(&self) -> bool {
        self.replayed
    }
}
