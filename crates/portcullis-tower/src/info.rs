//! The decision attached to a request and passed to custom responses.

use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{Policy, Verdict};

/// What the rate limit decided for one request.
///
/// Forwarded requests carry it in their extensions (read it in a handler
/// with `Extension<RateLimitInfo>` in Axum, or
/// `request.extensions().get::<RateLimitInfo>()`); in
/// [`Mode::DryRun`](crate::Mode::DryRun) this is how a handler learns that
/// the request would have been limited. A custom limited-response closure
/// receives it too.
///
/// ```
/// use std::time::Duration;
/// use portcullis::{Decision, Policy, Verdict};
/// use portcullis::tower::RateLimitInfo;
///
/// let policy = Policy::per_second(1).name("api").build().unwrap();
/// let verdict = Verdict::from_iter([Decision::denied(1, 0, Duration::from_millis(300), Duration::from_secs(1))]);
/// let info = RateLimitInfo::new("alice", "default", vec![policy].into(), verdict, true);
/// assert!(info.is_denied() && info.is_dry_run());
/// assert_eq!(info.retry_after_secs(), Some(1));
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitInfo {
    key: String,
    tier: Arc<str>,
    policies: Arc<[Policy]>,
    verdict: Verdict,
    dry_run: bool,
}

impl RateLimitInfo {
    /// Builds an info (the layer does this; public for tests of custom
    /// response closures).
    #[must_use]
    pub fn new(
        key: impl Into<String>,
        tier: impl Into<Arc<str>>,
        policies: Arc<[Policy]>,
        verdict: Verdict,
        dry_run: bool,
    ) -> Self {
        Self {
            key: key.into(),
            tier: tier.into(),
            policies,
            verdict,
            dry_run,
        }
    }

    /// The key the request was counted against (hashed for tokens and API
    /// keys).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The tier whose policies applied (`default` unless a tier was chosen).
    #[must_use]
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// The policies checked, in the order of [`Verdict::decisions`].
    #[must_use]
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The store's verdict.
    #[must_use]
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// Whether the store denied the request (in dry-run mode it was
    /// forwarded anyway).
    #[must_use]
    pub fn is_denied(&self) -> bool {
        !self.verdict.is_allowed()
    }

    /// Whether the layer runs in dry-run mode.
    #[must_use]
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// When denied, how long until the request would be admitted.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.verdict.retry_after()
    }

    /// [`RateLimitInfo::retry_after`] in whole seconds, rounded up (the
    /// `Retry-After` header's value).
    #[must_use]
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(crate::headers::ceil_secs)
    }

    /// The name of the policy that decided: the denying one with the longest
    /// retry-after, or when admitted the one with the fewest remaining.
    #[must_use]
    pub fn binding_policy(&self) -> &str {
        crate::headers::binding_index(&self.verdict)
            .and_then(|i| self.policies.get(i))
            .map_or("", Policy::name)
    }
}
