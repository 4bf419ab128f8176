//! [`Checker`], the state the services of one layer share, and its
//! methods: the decisions of the layer, independent of how the future is
//! driven (what to do with a new request, a plan lookup's answer, a store
//! verdict, the end of a wait), and the [`Ticket`] and [`Next`] step they
//! pass along. What it does when the store fails is `failure.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use portcullis_core::{BoxCheckFuture, Decision, ErrorScope, Store, StoreError, Verdict};
use tokio::time::Instant;

use super::charge::ChargeFn;
use super::deny_cache::DenyCache;
use super::resolve::{Cached, Live, Lookup, Picked};
use super::tier::Tier;
use crate::breaker::{Breaker, UndecidedLog};
use crate::config::{FailurePolicy, HeaderMode, MissingKey, Mode};
use crate::headers::RateLimitHeaders;
use crate::key::{KeyBuf, KeyExtractor};
use crate::response::{self, grpc_content_type, LimitedBody};
use crate::{observe, RateLimitInfo};

/// Chooses a tier by name from a request and its key.
pub(crate) type TierFn = Box<dyn for<'a> Fn(&'a Parts, &'a str) -> Option<&'a str> + Send + Sync>;
/// The cost of a request.
pub(crate) type CostFn = Box<dyn Fn(&Parts) -> u64 + Send + Sync>;

/// The state the services of one layer share: its store, key extractor,
/// tiers and settings, circuit breaker and deny cache. Its methods are the
/// steps of a request ([`Checker::start`], [`Checker::on_result`], ...).
/// Charging after the response (`charge.rs`) reads its store, timeout,
/// breaker and failure policy.
pub(crate) struct Checker<St, K> {
    pub(crate) store: Arc<St>,
    pub(crate) key: K,
    /// Tier 0 holds the default policies (with live limits: those when
    /// the layer was built).
    pub(crate) tiers: Box<[Arc<Tier>]>,
    /// Policies from data (`limits`, `resolve_plan`), when configured.
    pub(crate) live: Option<Live>,
    pub(crate) select_tier: Option<TierFn>,
    pub(crate) cost: Option<CostFn>,
    pub(crate) mode: Mode,
    pub(crate) failure: FailurePolicy,
    pub(crate) timeout: Duration,
    pub(crate) breaker: Breaker,
    pub(crate) deny_cache: Option<DenyCache>,
    pub(crate) missing_key: MissingKey,
    pub(crate) header_mode: HeaderMode,
    pub(crate) legacy_headers: bool,
    pub(crate) info_in_extensions: bool,
    pub(crate) body: LimitedBody,
    /// Requests let through undecided, logged at most once per second.
    pub(crate) undecided: UndecidedLog,
    /// Store errors, logged at most once per second.
    pub(crate) errors: UndecidedLog,
    /// Requests the store refused to check as sent, and requests without
    /// a key that were rejected: each logged at most once per second.
    pub(crate) refused: UndecidedLog,
    pub(crate) rejected: UndecidedLog,
    /// The status of a new subject the store has no room for.
    pub(crate) no_room_status: StatusCode,
    /// Charging after the response: the cost of a response head.
    pub(crate) charge: Option<ChargeFn>,
    /// Idempotency keys and priority classes, when configured
    /// (`options.rs`).
    pub(crate) options: Option<super::options::OptionSources>,
}

impl<St, K> fmt::Debug for Checker<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("store", &std::any::type_name::<St>())
            .field("key", &std::any::type_name::<K>())
            .field("tiers", &self.tiers)
            .field("mode", &self.mode)
            .field("failure", &self.failure)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache.is_some())
            .field("missing_key", &self.missing_key)
            .field("header_mode", &self.header_mode)
            .field("legacy_headers", &self.legacy_headers)
            .field("info_in_extensions", &self.info_in_extensions)
            .field("body", &self.body)
            .field("no_room_status", &self.no_room_status)
            .finish_non_exhaustive()
    }
}

impl<St, K> Checker<St, K> {
    /// The tier for this request: the one the selector names, else the
    /// default.
    pub(crate) fn tier_index(&self, parts: &Parts, key: &str) -> usize {
        let Some(select) = &self.select_tier else {
            return 0;
        };
        select(parts, key)
            .and_then(|name| self.tiers.iter().skip(1).position(|t| &*t.name == name))
            .map_or(0, |i| i + 1)
    }

    pub(crate) fn cost(&self, parts: &Parts) -> u64 {
        self.cost.as_ref().map_or(1, |cost| cost(parts))
    }
}

/// One request on its way through the checker.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// The key, inline for IP keys (no `String` per request).
    pub(crate) key: KeyBuf,
    /// The policies the request is checked under (one set, whatever
    /// changes meanwhile).
    pub(crate) tier: Arc<Tier>,
    pub(crate) cost: u64,
    /// When the check being waited for was sent; `None` while no store
    /// future is pending (a store that answers at once needs no clock).
    pub(crate) sent: Option<Instant>,
    /// In shape mode, the latest time the request may be forwarded.
    pub(crate) deadline: Option<Instant>,
    /// Whether the current check goes to the fallback store.
    pub(crate) fallback: bool,
    /// The `rate_limit` span the request's events belong to; `None` (no
    /// span object to drop or enter) unless `debug` is enabled.
    pub(crate) span: Option<tracing::Span>,
    /// The request's idempotency key and class (`options.rs`), if any.
    pub(crate) options: Option<Box<super::options::RequestOptions>>,
}

/// How the store's answer for a new request came, before its ticket is
/// written.
enum Answer {
    /// The deny cache holds a denial.
    Cached(Verdict),
    /// The circuit breaker is open: the store is not asked.
    BreakerOpen,
    /// The store answered at once.
    Now(Result<Verdict, StoreError>),
    /// The store answers later, through its future.
    Later,
}

/// What to do after a wait.
#[derive(Debug)]
pub(crate) enum Then {
    /// Ask the store again.
    Recheck,
    /// Forward the request, adding these headers to the response.
    Forward(Option<RateLimitHeaders>),
}

/// The next step of a request.
pub(crate) enum Next<St: Store> {
    /// Call the inner service; add these headers to its response.
    Forward(Option<RateLimitHeaders>),
    /// Answer with this response (boxed: it is rare, and would make every
    /// step twice as large to move).
    Respond(Box<Response<Bytes>>),
    /// The store (or the fallback store) answered at once
    /// ([`Store::check_now`]): hand this to `on_result`.
    Ready(Result<Verdict, StoreError>),
    /// Wait for this check of the store.
    Check(St::CheckFuture),
    /// Wait for this check of the fallback store.
    Fallback(BoxCheckFuture),
    /// Wait until then, then do that.
    Wait(Instant, Then),
    /// Wait for the subject's plan to be looked up.
    Resolve(Lookup),
}

/// The request's span, only when it is recorded: building one costs even
/// with no subscriber (and more when `tracing`'s `log` feature is on in the
/// tree).
#[inline]
fn request_span(key: &KeyBuf, tier: &Tier, cost: u64) -> Option<tracing::Span> {
    tracing::enabled!(tracing::Level::DEBUG).then(|| {
        tracing::debug_span!(
            "rate_limit",
            key = %key,
            tier = %tier.name,
            cost
        )
    })
}

impl<St: Store, K: KeyExtractor> Checker<St, K> {
    #[allow(clippy::unused_self)]
    pub(super) fn tier<'t>(&self, ticket: &'t Ticket) -> &'t Tier {
        &ticket.tier
    }

    /// The first step for a new request; its ticket, when it needs one, is
    /// written to `slot` (an out-parameter rather than a returned pair, so
    /// the large values are not copied on the hot path).
    pub(crate) fn start(&self, parts: &mut Parts, slot: &mut Option<Ticket>) -> Next<St> {
        let mut key = KeyBuf::new();
        if let Err(next) = self.read_key(parts, &mut key) {
            return next;
        }
        let Some(cost) = self.request_cost(parts) else {
            return Next::Forward(None);
        };
        let request = self
            .options
            .as_ref()
            .and_then(|sources| sources.for_request(parts));
        let picked = self.pick_tier(parts, &key);
        let tier: &Arc<Tier> = match &picked {
            Picked::Static(index) => self.tiers.get(*index).unwrap_or(&self.tiers[0]),
            Picked::Live(tier) => tier,
            Picked::Later(_) | Picked::Failed => &self.tiers[0],
        };
        // Classes apply to every request of a classed tier: one without a
        // class of its own is checked as the default class.
        let request = match request {
            None if tier.classed => Some(super::options::RequestOptions::default_class()),
            request => request,
        };
        let span = request_span(&key, tier, cost);
        if matches!(picked, Picked::Later(_) | Picked::Failed) {
            let ticket = slot.insert(self.ticket(key, tier, cost, span));
            ticket.options = request;
            return match picked {
                Picked::Later(lookup) => Next::Resolve(lookup),
                _ => self.on_failure(ticket, &parts.headers),
            };
        }
        let _entered = span.as_ref().map(|span| span.clone().entered());
        // With an idempotency key or a class, the check with options (the
        // deny cache is off for such a layer); else the plain answer.
        let mut asked = None;
        let answer = match request.as_deref() {
            Some(options) if self.breaker.allow() => {
                match self.ask_with(tier, &key, cost, Some(options), &mut asked) {
                    Some(result) => Answer::Now(result),
                    None => Answer::Later,
                }
            }
            Some(_) => Answer::BreakerOpen,
            None => match self.answer(tier, &key, cost, span.is_none()) {
                Ok(answer) => answer,
                Err(next) => return next,
            },
        };
        let ticket = slot.insert(self.ticket(key, tier, cost, span));
        ticket.options = request;
        match answer {
            Answer::Cached(verdict) => {
                tracing::trace!(key = %ticket.key, "denied by the local deny cache");
                self.on_verdict(ticket, parts, verdict)
            }
            Answer::BreakerOpen => {
                tracing::debug!("store skipped: circuit breaker open");
                self.on_failure(ticket, &parts.headers)
            }
            // Decided at once: straight to `call`, rather than as a
            // `Next::Ready` that `call` moves back into `on_result`.
            Answer::Now(result) => self.on_result(ticket, parts, result),
            Answer::Later => match asked {
                // The check with options, already sent.
                Some(future) => {
                    ticket.sent = Some(Instant::now());
                    Next::Fallback(future)
                }
                None => self.check_later(ticket),
            },
        }
    }

    /// A check with a request's options (`options.rs`): its answer now,
    /// or `None` with the future that answers later in `asked`.
    fn ask_with(
        &self,
        tier: &Tier,
        key: &str,
        cost: u64,
        request: Option<&super::options::RequestOptions>,
        asked: &mut Option<BoxCheckFuture>,
    ) -> Option<Result<Verdict, StoreError>> {
        let request = request?;
        match super::options::ask(&*self.store, key, &tier.policies, cost, request) {
            super::options::Asked::Now(result) => Some(result),
            super::options::Asked::Later(future) => {
                *asked = Some(future);
                None
            }
        }
    }

    /// Reads the request's key into `key`; a request without one is
    /// forwarded, rejected, or given the fallback key, as configured.
    #[inline]
    fn read_key(&self, parts: &Parts, key: &mut KeyBuf) -> Result<(), Next<St>> {
        if self.key.extract_into(parts, key) {
            return Ok(());
        }
        match &self.missing_key {
            MissingKey::Skip => {
                tracing::trace!("no rate-limit key; not limited");
                Err(Next::Forward(None))
            }
            MissingKey::Reject { status, message } => {
                let grpc = grpc_content_type(&parts.headers);
                response::log_missing_key(&self.rejected, &self.key, *status, grpc.is_some());
                Err(Next::Respond(Box::new(response::plain(
                    grpc, *status, message,
                ))))
            }
            MissingKey::Fallback(fallback) => {
                key.clear();
                key.push_str(fallback);
                Ok(())
            }
        }
    }

    /// The cost to check now: 0 (a peek) when the layer charges after the
    /// response; `None` for a request that costs nothing (not limited).
    #[inline]
    fn request_cost(&self, parts: &Parts) -> Option<u64> {
        if self.charge.is_some() {
            return Some(0);
        }
        let cost = self.cost(parts);
        (cost != 0).then_some(cost)
    }

    /// The answer that needs no waiting: a denial held by the deny cache
    /// (only answers that took a round trip are held), the open breaker,
    /// or a synchronous store's verdict; else `Later`. `Err` is a request
    /// admitted at once that needs no ticket (only when `fast`: no span).
    #[inline]
    fn answer(&self, tier: &Tier, key: &str, cost: u64, fast: bool) -> Result<Answer, Next<St>> {
        let cached = self
            .deny_cache
            .as_ref()
            .filter(|cache| !cache.is_empty())
            .and_then(|cache| cache.get(tier.slot, tier.id, key, cost, Instant::now()));
        Ok(match cached {
            Some(verdict) => Answer::Cached(verdict),
            None if !self.breaker.allow() => Answer::BreakerOpen,
            None => match self.check_now(tier, key, cost) {
                Some(Ok(verdict)) if fast => {
                    // The common case of a store that answers at once: an
                    // admitted request that needs nothing more than its
                    // headers is forwarded with no ticket written.
                    if let Some(next) = self.forward_at_once(tier, &verdict) {
                        return Err(next);
                    }
                    Answer::Now(Ok(verdict))
                }
                Some(result) => Answer::Now(result),
                None => Answer::Later,
            },
        })
    }

    /// A new request's ticket. The clock is read only where it is needed:
    /// the shaping deadline here, a check sent to a store that answers
    /// later, a non-empty deny cache.
    #[inline]
    fn ticket(
        &self,
        key: KeyBuf,
        tier: &Arc<Tier>,
        cost: u64,
        span: Option<tracing::Span>,
    ) -> Ticket {
        Ticket {
            key,
            tier: Arc::clone(tier),
            cost,
            sent: None,
            deadline: match self.mode {
                Mode::Shape { max_wait } => Some(Instant::now() + max_wait),
                _ => None,
            },
            fallback: false,
            span,
            options: None,
        }
    }

    /// The store's answer now, if it answers synchronously
    /// ([`Store::check_now`]).
    #[inline]
    fn check_now(&self, tier: &Tier, key: &str, cost: u64) -> Option<Result<Verdict, StoreError>> {
        #[cfg(feature = "metrics")]
        let begun = Instant::now();
        let result = self.store.check_now(key, &tier.policies, cost);
        #[cfg(feature = "metrics")]
        if result.is_some() {
            observe::store_latency(tier, begun.elapsed());
        }
        result
    }

    /// Sends the check to a store that answers later.
    fn check_later(&self, ticket: &mut Ticket) -> Next<St> {
        ticket.sent = Some(Instant::now());
        let tier = self.tier(ticket);
        Next::Check(self.store.check(&ticket.key, &tier.policies, ticket.cost))
    }

    /// Forwards an admitted verdict the store gave at once, when forwarding
    /// needs nothing from a ticket: no queueing delay, no dry run, no
    /// [`RateLimitInfo`] or [`Charge`](crate::Charge) in the extensions.
    /// `None` leaves the verdict to [`on_verdict`](Self::on_verdict).
    #[inline]
    fn forward_at_once(&self, tier: &Tier, verdict: &Verdict) -> Option<Next<St>> {
        if !verdict.is_allowed()
            || !verdict.delay().is_zero()
            || self.mode == Mode::DryRun
            || self.info_in_extensions
            || self.charge.is_some()
        {
            return None;
        }
        self.store_answered();
        observe::allowed(tier);
        Some(Next::Forward(self.admitted_headers(tier, verdict)))
    }

    /// The store answered: closes the circuit breaker if it was open.
    fn store_answered(&self) {
        self.outage_over();
        if self.breaker.success() {
            tracing::info!("rate-limit store answers again; circuit breaker closed");
        }
    }

    /// The headers of an admitted response: fields only with
    /// [`HeaderMode::All`], else none (no work on the response).
    fn admitted_headers(&self, tier: &Tier, verdict: &Verdict) -> Option<RateLimitHeaders> {
        if self.header_mode == HeaderMode::All {
            Some(self.headers(tier, verdict, false)).filter(|h| !h.is_empty())
        } else {
            None
        }
    }

    /// Checks the store again (after a shaping wait), unless the circuit
    /// breaker is open. A store that answers at once answers here, as
    /// [`Next::Ready`].
    pub(crate) fn ask_store(&self, ticket: &mut Ticket, headers: &HeaderMap) -> Next<St> {
        if !self.breaker.allow() {
            tracing::debug!("store skipped: circuit breaker open");
            return self.on_failure(ticket, headers);
        }
        ticket.fallback = false;
        ticket.sent = None;
        if ticket.options.is_none() && ticket.tier.classed {
            // A tier chosen after the request began (a plan lookup).
            ticket.options = Some(super::options::RequestOptions::default_class());
        }
        // A request with an idempotency key or a class is checked again
        // with them: its class's reserve still holds, and its record is
        // the one written when it is admitted.
        if let Some(request) = ticket.options.as_deref() {
            let mut asked = None;
            return match self.ask_with(
                &ticket.tier,
                &ticket.key,
                ticket.cost,
                Some(request),
                &mut asked,
            ) {
                Some(result) => Next::Ready(result),
                None => match asked {
                    Some(future) => {
                        ticket.sent = Some(Instant::now());
                        Next::Fallback(future)
                    }
                    None => self.check_later(ticket),
                },
            };
        }
        match self.check_now(&ticket.tier, &ticket.key, ticket.cost) {
            Some(result) => Next::Ready(result),
            None => self.check_later(ticket),
        }
    }

    /// The check timed out.
    pub(crate) fn on_timeout(&self, ticket: &mut Ticket, parts: &mut Parts) -> Next<St> {
        let error = StoreError::Timeout {
            after: self.timeout,
        };
        self.on_result(ticket, parts, Err(error))
    }

    /// The store (or the fallback store) answered. `parts` are the
    /// request's: its extensions get the [`RateLimitInfo`], its headers
    /// say whether an answer must be a gRPC one.
    pub(crate) fn on_result(
        &self,
        ticket: &mut Ticket,
        parts: &mut Parts,
        result: Result<Verdict, StoreError>,
    ) -> Next<St> {
        // Without a span (`debug` off), no guard to create and drop.
        match &ticket.span {
            None => self.on_result_in_span(ticket, parts, result),
            Some(span) => {
                let _entered = span.clone().entered();
                self.on_result_in_span(ticket, parts, result)
            }
        }
    }

    fn on_result_in_span(
        &self,
        ticket: &mut Ticket,
        parts: &mut Parts,
        result: Result<Verdict, StoreError>,
    ) -> Next<St> {
        let tier = self.tier(ticket);
        if ticket.fallback {
            return match result {
                Ok(verdict) => self.on_verdict(ticket, parts, verdict),
                Err(error) if error.scope() == ErrorScope::NoRoom => {
                    self.no_room(&parts.headers, &error)
                }
                // Failed too, or did not answer within the check timeout
                // (`on_timeout`): let through, counted and logged as every
                // request let through undecided is.
                Err(error) => {
                    self.log_error(&error, "the fallback store failed too; request let through");
                    self.let_through(tier);
                    Next::Forward(None)
                }
            };
        }
        #[cfg(feature = "metrics")]
        if let Some(sent) = ticket.sent {
            observe::store_latency(tier, sent.elapsed());
        }
        let error = match result {
            Ok(verdict) => {
                self.store_answered();
                // Only answers that took a round trip are cached: a store
                // that answers at once is as quick as the cache.
                if let Some((cache, sent)) = self.deny_cache.as_ref().zip(ticket.sent) {
                    if !verdict.is_allowed() {
                        cache.insert(
                            ticket.tier.slot,
                            ticket.tier.id,
                            &ticket.key,
                            ticket.cost,
                            &verdict,
                            sent,
                        );
                    }
                }
                return self.on_verdict(ticket, parts, verdict);
            }
            Err(error) => error,
        };
        // What an error reaches decides what it may change (the table at
        // `portcullis_core::ErrorScope`): only store-wide errors count toward
        // the breaker, so no subject's fault changes another's decision.
        match error.scope() {
            ErrorScope::Store => {
                observe::store_error(tier);
                if self.breaker.failure() {
                    tracing::warn!(error = crate::observe::chain(&error), pause = ?self.breaker.pause(), "rate-limit store failing; circuit breaker opened");
                } else {
                    self.log_error(&error, "rate-limit store failed");
                }
                self.on_failure(ticket, &parts.headers)
            }
            ErrorScope::NoRoom => {
                observe::store_error(tier);
                self.no_room(&parts.headers, &error)
            }
            ErrorScope::Subject => {
                observe::store_error(tier);
                tracing::debug!(error = crate::observe::chain(&error), key = %ticket.key, "rate-limit check failed for this subject alone; its failure policy applies to this request");
                self.log_error(&error, "rate-limit store failed");
                self.on_failure(ticket, &parts.headers)
            }
            // `ErrorScope::Request` and any scope this version does not
            // know: the request itself cannot be checked.
            _ => {
                // The client sent what cannot be checked (a cost above the
                // limit, a bad idempotency key): it hears what it may act
                // on; the operator's detail goes to a rate-limited log.
                tracing::debug!(error = crate::observe::chain(&error), key = %ticket.key, "rate-limit check refused for this request");
                if let Some(count) = self.refused.record() {
                    tracing::warn!(
                        error = crate::observe::chain(&error),
                        count,
                        "rate-limit check refused: {count} request(s) the store could not check as sent, since the last such warning"
                    );
                }
                Next::Respond(Box::new(response::plain(
                    grpc_content_type(&parts.headers),
                    StatusCode::TOO_MANY_REQUESTS,
                    response::refused_message(&error),
                )))
            }
        }
    }

    pub(crate) fn headers(
        &self,
        tier: &Tier,
        verdict: &Verdict,
        limited: bool,
    ) -> RateLimitHeaders {
        let fields = match self.header_mode {
            HeaderMode::All => true,
            HeaderMode::LimitedOnly => limited,
            HeaderMode::None => false,
        };
        let mut headers = if fields {
            RateLimitHeaders::new(
                &tier.ratelimit_prefixes,
                tier.policy_header.as_ref(),
                verdict,
                self.legacy_headers,
            )
        } else {
            RateLimitHeaders::default()
        };
        if limited {
            headers.set_retry_after(
                verdict
                    .retry_after()
                    .map(|d| HeaderValue::from(crate::headers::ceil_secs(d))),
            );
        }
        headers
    }

    fn info(&self, ticket: &mut Ticket, verdict: Verdict) -> RateLimitInfo {
        let key = std::mem::take(&mut ticket.key).into_string();
        let tier = self.tier(ticket);
        let info = RateLimitInfo::new(
            key,
            std::sync::Arc::clone(&tier.name),
            std::sync::Arc::clone(&tier.policies),
            verdict,
        )
        .with_source(tier.source, tier.version);
        if self.mode == Mode::DryRun {
            info.in_dry_run()
        } else {
            info
        }
    }

    fn limited(&self, ticket: &mut Ticket, headers: &HeaderMap, verdict: Verdict) -> Next<St> {
        let tier = self.tier(ticket);
        observe::denied(tier, &verdict);
        let grpc = grpc_content_type(headers);
        let headers = self.headers(tier, &verdict, true);
        let info = self.info(ticket, verdict);
        tracing::debug!(key = %info.key(), policy = info.binding_policy(), retry_after = ?info.retry_after(), "rate limited");
        Next::Respond(Box::new(response::limited(
            &self.body, grpc, &info, headers,
        )))
    }

    /// A verdict from the store, the fallback store or the deny cache.
    pub(crate) fn on_verdict(
        &self,
        ticket: &mut Ticket,
        parts: &mut Parts,
        verdict: Verdict,
    ) -> Next<St> {
        let tier = self.tier(ticket);
        let extensions = &mut parts.extensions;
        if verdict.is_allowed() {
            // A replay was charged by the request it repeats.
            let replay = ticket
                .options
                .as_ref()
                .is_some_and(|request| request.is_replay());
            if self.charge.is_some() && !replay {
                if let Some(charge) = extensions.get::<crate::Charge>() {
                    charge.admit(&ticket.key, &ticket.tier, ticket.fallback);
                }
            }
            observe::allowed(tier);
            let delay = verdict.delay();
            if self.mode == Mode::DryRun {
                extensions.insert(self.info(ticket, verdict));
                return Next::Forward(None);
            }
            // Queued (a leaky bucket in queue mode): until when, unless the
            // delay passes the shaping deadline.
            let until = if delay.is_zero() {
                None
            } else {
                let now = Instant::now();
                if ticket
                    .deadline
                    .is_some_and(|deadline| now + delay > deadline)
                {
                    tracing::debug!(
                        ?delay,
                        "queue delay longer than the shaping limit; rejected"
                    );
                    return self.limited(ticket, &parts.headers, delayed_as_denied(&verdict));
                }
                Some(now + delay)
            };
            let headers = self.admitted_headers(tier, &verdict);
            if self.info_in_extensions {
                extensions.insert(self.info(ticket, verdict));
            }
            match until {
                None => Next::Forward(headers),
                Some(until) => {
                    tracing::trace!(?delay, "queued");
                    Next::Wait(until, Then::Forward(headers))
                }
            }
        } else {
            match self.mode {
                Mode::DryRun => {
                    observe::dry_run_denied(tier, &verdict);
                    let info = self.info(ticket, verdict);
                    tracing::info!(key = %info.key(), policy = info.binding_policy(), retry_after = ?info.retry_after(), "dry run: would have been rate limited");
                    extensions.insert(info);
                    Next::Forward(None)
                }
                Mode::Shape { .. } => {
                    let now = Instant::now();
                    let retry = verdict.retry_after().unwrap_or_default();
                    match ticket.deadline {
                        Some(deadline) if now + retry <= deadline => {
                            tracing::trace!(?retry, "shaping: waiting to retry");
                            Next::Wait(now + retry, Then::Recheck)
                        }
                        _ => self.limited(ticket, &parts.headers, verdict),
                    }
                }
                Mode::Enforce => self.limited(ticket, &parts.headers, verdict),
            }
        }
    }

    /// A wait ended.
    pub(crate) fn after_wait(
        &self,
        ticket: &mut Ticket,
        headers: &HeaderMap,
        then: Then,
    ) -> Next<St> {
        let _entered = ticket.span.as_ref().map(|span| span.clone().entered());
        match then {
            Then::Recheck => self.ask_store(ticket, headers),
            Then::Forward(headers) => Next::Forward(headers),
        }
    }
}

/// An admitted verdict whose queue delay is too long, as a denial whose
/// retry-after is that delay.
fn delayed_as_denied(verdict: &Verdict) -> Verdict {
    verdict
        .decisions()
        .iter()
        .map(|d| {
            if d.delay().is_zero() {
                *d
            } else {
                Decision::denied(d.limit(), d.remaining(), d.delay(), d.reset_after())
            }
        })
        .collect()
}

/// Per-request policies from data (`resolve.rs`): which tier a request
/// is checked under, and the step after a plan lookup.
impl<St: Store, K: KeyExtractor> Checker<St, K> {
    /// The tier of a request (`key` is its key).
    #[inline]
    pub(crate) fn pick_tier(&self, parts: &Parts, key: &str) -> Picked {
        match &self.live {
            None => Picked::Static(self.tier_index(parts, key)),
            Some(live) => {
                let select = self.select_tier.as_ref().and_then(|s| s(parts, key));
                live.pick(parts, key, select)
            }
        }
    }

    /// A lookup answered: check the request under the tier it gives.
    pub(crate) fn on_resolved(
        &self,
        ticket: &mut Ticket,
        parts: &mut Parts,
        cached: &Cached,
    ) -> Next<St> {
        let _entered = ticket.span.as_ref().map(|span| span.clone().entered());
        let picked = match &self.live {
            Some(live) => live.picked_later(&ticket.key, cached),
            None => Picked::Failed,
        };
        match picked {
            Picked::Live(tier) => ticket.tier = tier,
            Picked::Static(index) => {
                if let Some(tier) = self.tiers.get(index) {
                    ticket.tier = Arc::clone(tier);
                }
            }
            Picked::Later(_) | Picked::Failed => {
                tracing::debug!("plan lookup failed; the failure policy applies");
                return self.on_failure(ticket, &parts.headers);
            }
        }
        let cached = self
            .deny_cache
            .as_ref()
            .filter(|cache| !cache.is_empty())
            .and_then(|cache| {
                cache.get(
                    ticket.tier.slot,
                    ticket.tier.id,
                    &ticket.key,
                    ticket.cost,
                    Instant::now(),
                )
            });
        match cached {
            Some(verdict) => self.on_verdict(ticket, parts, verdict),
            None => self.ask_store(ticket, &parts.headers),
        }
    }
}
