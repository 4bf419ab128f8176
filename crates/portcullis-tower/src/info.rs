//! The decision attached to a request and passed to custom responses.

use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{Policy, PolicySource, Verdict};

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
/// let info = RateLimitInfo::new("alice", "default", vec![policy].into(), verdict).in_dry_run();
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
    source: PolicySource,
    limits_version: u64,
}

impl RateLimitInfo {
    /// Builds an info for `key`, counted under `tier`'s `policies` with
    /// this `verdict`, enforced (see [`in_dry_run`](Self::in_dry_run)). The
    /// layer builds these; the constructor is public for tests of custom
    /// limited-response closures.
    #[must_use]
    pub fn new(
        key: impl Into<String>,
        tier: impl Into<Arc<str>>,
        policies: Arc<[Policy]>,
        verdict: Verdict,
    ) -> Self {
        Self {
            key: key.into(),
            tier: tier.into(),
            policies,
            verdict,
            dry_run: false,
            source: PolicySource::Default,
            limits_version: 0,
        }
    }

    /// This info as the layer reports it in [`Mode::DryRun`](crate::Mode::DryRun):
    /// the decision was only logged, never enforced.
    #[must_use]
    pub fn in_dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }

    /// This info with what chose its policies and the version of the live
    /// limits they came from (0 for policies fixed when the layer was
    /// built).
    ///
    /// ```
    /// use portcullis::{Policy, PolicySource, Verdict};
    /// use portcullis::tower::RateLimitInfo;
    ///
    /// let policy = Policy::per_second(1).name("acme").build().unwrap();
    /// let info = RateLimitInfo::new("acme", "acme", vec![policy].into(), Verdict::from_iter([]))
    ///     .with_source(PolicySource::Override, 7);
    /// assert_eq!((info.source(), info.limits_version()), (PolicySource::Override, Some(7)));
    /// ```
    #[must_use]
    pub fn with_source(mut self, source: PolicySource, limits_version: u64) -> Self {
        self.source = source;
        self.limits_version = limits_version;
        self
    }

    /// What chose the policies: the defaults, a tier, the subject's
    /// override, or its plan from a resolver (or the defaults because the
    /// resolver failed). [`tier`](Self::tier) names the tier (the subject,
    /// for policies of its own).
    #[must_use]
    pub fn source(&self) -> PolicySource {
        self.source
    }

    /// The version of the live [`Limits`](portcullis_core::Limits) the
    /// policies came from; `None` when they were fixed at build time (or
    /// came from a resolver's own plan).
    #[must_use]
    pub fn limits_version(&self) -> Option<u64> {
        (self.limits_version > 0).then_some(self.limits_version)
    }

    /// The key the request was counted against (hashed for tokens and API
    /// keys).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The tier whose policies applied (`default` unless a tier was chosen;
    /// the subject's key for an override or a plan of its own policies).
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
