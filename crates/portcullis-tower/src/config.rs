//! Configuration types: modes, failure policies, missing keys, headers, the
//! defaults both layers' builders start from (check timeout, circuit
//! breaker), and the errors a builder reports.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::time::Duration;

use http::StatusCode;
use portcullis_core::{BoxStore, Store, StoreError};

/// Default bound on one store check: 500 ms, above a `RedisStore`'s own
/// per-call default (250 ms), so that the store's own timeout answers
/// first. Measured on a 2-core box with four busy threads and 1024 checks
/// in flight through this layer over Redis, the slowest check took 164 ms:
/// a healthy store on a loaded machine does not fail open.
///
/// The three defaults of both layers' builders are not API (their values
/// are documented on the setters,
/// [`check_timeout`](crate::RateLimitLayerBuilder::check_timeout) and
/// [`circuit_breaker`](crate::RateLimitLayerBuilder::circuit_breaker)):
/// public, and hidden, for the workspace's reliability tests.
#[doc(hidden)]
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_millis(500);
/// Default number of consecutive store failures that open the circuit breaker.
#[doc(hidden)]
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 5;
/// Default pause of an open circuit breaker.
#[doc(hidden)]
pub const DEFAULT_BREAKER_PAUSE: Duration = Duration::from_secs(1);

/// What the layer does with a request the store denies.
///
/// ```
/// use std::time::Duration;
/// use portcullis::tower::Mode;
///
/// let shape = Mode::Shape { max_wait: Duration::from_millis(500) };
/// assert_ne!(shape, Mode::default());
/// assert_eq!(Mode::default(), Mode::Enforce);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Reject denied requests (the default). Admitted requests of a leaky
    /// bucket in queue mode wait out their queue delay first.
    #[default]
    Enforce,
    /// Never reject and never wait: every request is forwarded, with the
    /// decision in its extensions as a [`RateLimitInfo`](crate::RateLimitInfo)
    /// and denials logged through `tracing` (and counted with the `metrics`
    /// feature). No rate-limit headers are added. Use it to try a limit on
    /// live traffic.
    DryRun,
    /// Delay rather than reject: a denied request waits for its retry-after
    /// and is checked again, and an admitted queued request waits out its
    /// queue delay, as long as the total wait stays within `max_wait`;
    /// beyond it, the request is rejected. A queued request whose delay is
    /// longer than `max_wait` is rejected even though its slot was taken, so
    /// give a queue no more room than `max_wait` covers.
    Shape {
        /// The longest a request may be held back.
        max_wait: Duration,
    },
}

/// What the layer does when the store fails (is unreachable, answers with
/// an error, or does not answer within the check timeout).
///
/// ```
/// use std::time::Duration;
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{FailurePolicy, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let shared_store = MemoryStore::new(); // RedisStore in a real deployment
/// let layer = RateLimitLayer::builder(shared_store)
///     .policy(Policy::per_second(100).build()?)
///     // Keep limiting per instance while the shared store is down.
///     .on_store_failure(FailurePolicy::fallback(MemoryStore::new()))
///     .check_timeout(Duration::from_millis(50))
///     .circuit_breaker(5, Duration::from_secs(2))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through unlimited and log a warning (the default):
    /// an outage of the limiter is not an outage of the service.
    #[default]
    FailOpen,
    /// Reject the request with `503 Service Unavailable` (gRPC status 14
    /// `UNAVAILABLE`).
    FailClosed,
    /// Decide with this store instead, with the same policies, until the
    /// store answers again: usually an in-process
    /// [`MemoryStore`](portcullis_core::MemoryStore) (each instance then
    /// limits on its own, so the combined limit across `n` instances is up
    /// to `n` times the policy), but any store works (a second Redis, say).
    /// The fallback's check is bounded by the layer's
    /// [`check_timeout`](crate::RateLimitLayerBuilder::check_timeout) too,
    /// so a check takes at most twice that timeout. If the fallback fails
    /// too, or does not answer in time, the request is let through
    /// undecided: counted (`portcullis_requests_total{result="failed_open"}`) and logged (at
    /// most once a second), as with [`FailurePolicy::FailOpen`]. A new
    /// subject the fallback has no room for is denied.
    Fallback(BoxStore),
}

impl FailurePolicy {
    /// [`FailurePolicy::Fallback`] to `store`, any [`Store`] (for a store
    /// that is already a [`BoxStore`], write `FailurePolicy::Fallback(store)`).
    #[must_use]
    pub fn fallback<S: Store>(store: S) -> Self {
        Self::Fallback(BoxStore::new(store))
    }
}

/// What the layer does with a request its key extractor finds no key in.
///
/// ```
/// use axum::http::StatusCode;
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{BearerToken, MissingKey, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_minute(60).build()?)
///     .key(BearerToken::new())
///     .on_missing_key(MissingKey::reject(StatusCode::UNAUTHORIZED, "send a bearer token\n"))
///     .build()?;
/// // Or: MissingKey::Skip, or MissingKey::fallback("anonymous") to share one limit.
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Forward the request without limiting it.
    Skip,
    /// Answer with this status and plain-text message (for gRPC requests,
    /// the matching gRPC status and the message as `grpc-message`). A
    /// layer's default is `400 Bad Request` (gRPC `INVALID_ARGUMENT`)
    /// naming what its key extractor reads
    /// ([`KeyExtractor::describe`](crate::KeyExtractor::describe)); the
    /// operator's detail (why requests may lack it) goes to the log, at
    /// most once per second.
    Reject {
        /// The HTTP status.
        status: StatusCode,
        /// The response body.
        message: Cow<'static, str>,
    },
    /// Count the request against this one shared key (for example
    /// `"anonymous"`), so callers without a key share one limit.
    Fallback(Cow<'static, str>),
}

/// The default answer's body.
const MISSING_KEY_MESSAGE: &str =
    "this request carries nothing the rate limiter can tell callers apart by\n";

impl Default for MissingKey {
    /// `400 Bad Request` saying the caller could not be identified. (A
    /// layer that is not told otherwise answers more precisely: it names
    /// what its key extractor reads.)
    fn default() -> Self {
        Self::Reject {
            status: StatusCode::BAD_REQUEST,
            message: Cow::Borrowed(MISSING_KEY_MESSAGE),
        }
    }
}

impl MissingKey {
    /// [`MissingKey::Reject`] with `status` and `message`.
    #[must_use]
    pub fn reject(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self::Reject {
            status,
            message: message.into(),
        }
    }

    /// [`MissingKey::Fallback`] to the shared key `key`.
    #[must_use]
    pub fn fallback(key: impl Into<Cow<'static, str>>) -> Self {
        Self::Fallback(key.into())
    }
}

/// Which responses carry the IETF `RateLimit` and `RateLimit-Policy` fields
/// (and the legacy `X-RateLimit-*` headers when enabled). `Retry-After` is
/// always on limited responses.
///
/// ```
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{HeaderMode, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_second(10).build()?)
///     .headers(HeaderMode::LimitedOnly)
///     .legacy_headers(true)
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderMode {
    /// Limited and admitted responses (the default).
    #[default]
    All,
    /// Only limited (429) responses.
    LimitedOnly,
    /// No response.
    None,
}

/// Why a [`RateLimitLayer`](crate::RateLimitLayer) or a
/// [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) could not be built.
/// Each message says what to change; where the store's validation found
/// the problem, its error is the [`source()`](Error::source), not part of
/// the message.
///
/// ```
/// use portcullis::MemoryStore;
/// use portcullis::tower::{ConfigError, RateLimitLayer};
///
/// let err = RateLimitLayer::builder(MemoryStore::new()).build().unwrap_err();
/// assert!(matches!(err, ConfigError::NoPolicies));
/// assert!(err.to_string().contains(".policy("));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// No default policy was given.
    NoPolicies,
    /// A tier was given no policies.
    EmptyTier {
        /// The tier's name.
        tier: String,
    },
    /// Two tiers have the same name.
    DuplicateTier {
        /// The repeated name.
        tier: String,
    },
    /// The policies of one tier are not a valid check (for example two have
    /// the same name).
    InvalidPolicies {
        /// The tier (`default` for the policies given with `.policy(..)`).
        tier: String,
        /// What the store would have refused.
        source: StoreError,
    },
    /// The check timeout was zero.
    ZeroTimeout,
    /// The layer charges after the response
    /// ([`charge_from_response`](crate::RateLimitLayerBuilder::charge_from_response))
    /// but a tier has a policy whose algorithm cannot be charged after the
    /// fact (`source` says which), or a per-request
    /// [`cost`](crate::RateLimitLayerBuilder::cost) was set too (`tier` and
    /// `source` are then `None`).
    ChargeAfterResponse {
        /// The tier with the policy that cannot be charged.
        tier: Option<String>,
        /// What the store would refuse.
        source: Option<StoreError>,
    },
    /// A [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) was built
    /// without a [`ConcurrencyPolicy`](portcullis_core::ConcurrencyPolicy)
    /// ([`ConcurrencyLimitLayerBuilder::policy`](crate::ConcurrencyLimitLayerBuilder::policy)).
    NoConcurrencyPolicy,
    /// Policies or tiers were given with `.policy(..)` or `.tier(..)` and a
    /// live [`Limits`](portcullis_core::Limits) handle with `.limits(..)`.
    PoliciesWithLimits,
    /// The static policies and tiers do not make a valid
    /// [`LimitSet`](portcullis_core::LimitSet) for a plan resolver (for
    /// example a tier named `default`).
    Limits {
        /// What is wrong.
        source: portcullis_core::LimitsError,
    },
    /// The idempotency window
    /// ([`idempotency_key`](crate::RateLimitLayerBuilder::idempotency_key))
    /// is zero or longer than
    /// [`MAX_IDEMPOTENCY_WINDOW`](portcullis_core::MAX_IDEMPOTENCY_WINDOW).
    IdempotencyWindow {
        /// The window given.
        window: std::time::Duration,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPolicies => f.write_str(
                "the rate limit has no policy: add at least one with .policy(..); tiers chosen per request fall back to it",
            ),
            Self::EmptyTier { tier } => {
                write!(f, "tier {tier:?} has no policies: give it at least one")
            }
            Self::DuplicateTier { tier } => {
                write!(f, "tier {tier:?} is defined twice: give each tier its own name")
            }
            // The cause (which policy, what to change) is the `source()`.
            Self::InvalidPolicies { tier, .. } => {
                write!(f, "the policies of tier {tier:?} cannot be checked together")
            }
            Self::ChargeAfterResponse { tier: Some(tier), .. } => write!(
                f,
                "tier {tier:?} cannot be charged after the response: charge_from_response takes only gcra and token_bucket policies"
            ),
            Self::ChargeAfterResponse { tier: None, .. } => f.write_str(
                "charge_from_response and cost cannot be combined: the cost is decided after the response; drop .cost(..), or add a fixed amount in charge_from_response's function",
            ),
            Self::ZeroTimeout => f.write_str(
                "the check timeout is zero, so every check would fail: use a positive timeout such as 250 ms",
            ),
            Self::NoConcurrencyPolicy => f.write_str(
                "the concurrency limit has no policy: give it one with .policy(ConcurrencyPolicy::max_in_flight(n).build()?)",
            ),
            Self::PoliciesWithLimits => f.write_str(
                "the layer was given both policies (.policy/.tier) and a Limits handle (.limits): put the policies and tiers in the LimitSet of the handle",
            ),
            Self::Limits { .. } => f.write_str(
                "the layer's policies and tiers are not valid limits for a plan resolver: fix what the cause names",
            ),
            Self::IdempotencyWindow { window } => write!(
                f,
                "the idempotency window {window:?} is out of range: give a window of 1 ms to 30 days, as long as clients may retry"
            ),
        }
    }
}

impl Error for ConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::InvalidPolicies { source, .. } => Some(source),
            Self::Limits { source } => Some(source),
            Self::ChargeAfterResponse {
                source: Some(source),
                ..
            } => Some(source),
            _ => None,
        }
    }
}
