//! The decisions of the layer, independent of how the future is driven:
//! what to do with a new request, a store verdict, a store error, the end
//! of a wait.

use bytes::Bytes;
use http::request::Parts;
use http::{Extensions, HeaderValue, Response, StatusCode};
use tokio::time::Instant;
use tollgate_core::{BoxCheckFuture, Decision, ErrorScope, Store, StoreError, Verdict};

use crate::config::{FailurePolicy, HeaderMode, MissingKey, Mode};
use crate::headers::RateLimitHeaders;
use crate::key::{KeyBuf, KeyExtractor};
use crate::layer::{Shared, Tier};
use crate::response::{self, grpc_content_type};
use crate::{observe, RateLimitInfo};

/// One request on its way through the limiter.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// The key, inline for IP keys (no `String` per request).
    pub(crate) key: KeyBuf,
    pub(crate) tier: usize,
    pub(crate) cost: u64,
    /// When the current check was sent.
    pub(crate) sent: Instant,
    /// In shape mode, the latest time the request may be forwarded.
    pub(crate) deadline: Option<Instant>,
    /// The request's content type if it is a gRPC request.
    pub(crate) grpc: Option<HeaderValue>,
    /// Whether the current check goes to the fallback store.
    pub(crate) fallback: bool,
    /// The `rate_limit` span the request's events belong to; `None` (no
    /// span object to drop or enter) unless `debug` is enabled.
    pub(crate) span: Option<tracing::Span>,
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
    /// Answer with this response.
    Respond(Response<Bytes>),
    /// The store (or the fallback store) answered at once
    /// ([`Store::check_now`]): hand this to `on_result`.
    Ready(Result<Verdict, StoreError>),
    /// Wait for this check of the store.
    Check(St::CheckFuture),
    /// Wait for this check of the fallback store.
    Fallback(BoxCheckFuture),
    /// Wait until then, then do that.
    Wait(Instant, Then),
}

impl<St: Store, K: KeyExtractor> Shared<St, K> {
    fn tier(&self, ticket: &Ticket) -> &Tier {
        // Tickets only carry indices from `tier_index`, which are in range;
        // fall back to the default tier rather than panic.
        self.tiers.get(ticket.tier).unwrap_or(&self.tiers[0])
    }

    /// The first step for a new request; its ticket, when it needs one, is
    /// written to `slot` (an out-parameter rather than a returned pair, so
    /// the large values are not copied on the hot path).
    pub(crate) fn start(&self, parts: &mut Parts, slot: &mut Option<Ticket>) -> Next<St> {
        let mut key = KeyBuf::new();
        if !self.key.extract_into(parts, &mut key) {
            match &self.missing_key {
                MissingKey::Skip => {
                    tracing::trace!("no rate-limit key; not limited");
                    return Next::Forward(None);
                }
                MissingKey::Reject { status, message } => {
                    if !self
                        .warned_missing_key
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::warn!(
                            %status,
                            key = std::any::type_name::<K>(),
                            "a request had no rate-limit key and was rejected (logged once per layer); \
                             for a peer IP, serve Axum with into_make_service_with_connect_info::<SocketAddr>() \
                             or put the SocketAddr in the request extensions; or choose MissingKey::Skip or a fallback key"
                        );
                    }
                    tracing::debug!(%status, "no rate-limit key; rejected");
                    let grpc = grpc_content_type(&parts.headers);
                    return Next::Respond(response::plain(grpc, *status, message));
                }
                MissingKey::Fallback(fallback) => {
                    key.clear();
                    key.push_str(fallback);
                }
            }
        }
        // Charging after the response: only a peek now.
        let cost = if self.charge.is_some() {
            0
        } else {
            let cost = self.cost(parts);
            if cost == 0 {
                return Next::Forward(None);
            }
            cost
        };
        let now = Instant::now();
        let tier = self.tier_index(parts);
        // The span only when it is recorded: building one costs even with
        // no subscriber (and more when `tracing`'s `log` feature is on in
        // the tree).
        let span = if tracing::enabled!(tracing::Level::DEBUG) {
            Some(tracing::debug_span!(
                "rate_limit",
                key = %key,
                tier = %self.tiers.get(tier).map_or("default", |t| &*t.name),
                cost
            ))
        } else {
            None
        };
        let _entered = span.as_ref().map(|span| span.clone().entered());
        let ticket = slot.insert(Ticket {
            key,
            tier,
            cost,
            sent: now,
            deadline: match self.mode {
                Mode::Shape { max_wait } => Some(now + max_wait),
                _ => None,
            },
            grpc: grpc_content_type(&parts.headers),
            fallback: false,
            span,
        });
        if let Some(cache) = &self.deny_cache {
            if let Some(verdict) = cache.get(ticket.tier, &ticket.key, cost, now) {
                tracing::trace!(key = %ticket.key, "denied by the local deny cache");
                return self.on_verdict(ticket, &mut parts.extensions, verdict);
            }
        }
        self.ask_store_or_decide(ticket, &mut parts.extensions)
    }

    /// [`ask_store`](Self::ask_store) for a new request, deciding at once
    /// when the store answers synchronously: the decision is returned
    /// straight to `call` rather than as a [`Next::Ready`] that `call`
    /// moves back into `on_result`.
    fn ask_store_or_decide(&self, ticket: &mut Ticket, extensions: &mut Extensions) -> Next<St> {
        if !self.breaker.allow() {
            tracing::debug!("store skipped: circuit breaker open");
            return self.on_failure(ticket);
        }
        ticket.fallback = false;
        let tier = self.tier(ticket);
        match self
            .store
            .check_now(&ticket.key, &tier.policies, ticket.cost)
        {
            Some(result) => self.on_result(ticket, extensions, result),
            None => Next::Check(self.store.check(&ticket.key, &tier.policies, ticket.cost)),
        }
    }

    /// Checks the store, unless the circuit breaker is open.
    fn ask_store(&self, ticket: &mut Ticket) -> Next<St> {
        if !self.breaker.allow() {
            tracing::debug!("store skipped: circuit breaker open");
            return self.on_failure(ticket);
        }
        ticket.fallback = false;
        let tier = self.tier(ticket);
        // A synchronous store answers here; the future is for stores that
        // wait.
        match self
            .store
            .check_now(&ticket.key, &tier.policies, ticket.cost)
        {
            Some(result) => Next::Ready(result),
            None => Next::Check(self.store.check(&ticket.key, &tier.policies, ticket.cost)),
        }
    }

    /// The check timed out.
    pub(crate) fn on_timeout(&self, ticket: &mut Ticket, extensions: &mut Extensions) -> Next<St> {
        let error = StoreError::Timeout {
            after: self.timeout,
        };
        self.on_result(ticket, extensions, Err(error))
    }

    /// The store (or the fallback store) answered.
    pub(crate) fn on_result(
        &self,
        ticket: &mut Ticket,
        extensions: &mut Extensions,
        result: Result<Verdict, StoreError>,
    ) -> Next<St> {
        // Without a span (`debug` off), no guard to create and drop.
        match &ticket.span {
            None => self.on_result_in_span(ticket, extensions, result),
            Some(span) => {
                let _entered = span.clone().entered();
                self.on_result_in_span(ticket, extensions, result)
            }
        }
    }

    fn on_result_in_span(
        &self,
        ticket: &mut Ticket,
        extensions: &mut Extensions,
        result: Result<Verdict, StoreError>,
    ) -> Next<St> {
        let tier = self.tier(ticket);
        if ticket.fallback {
            return match result {
                Ok(verdict) => self.on_verdict(ticket, extensions, verdict),
                Err(error) if error.scope() == ErrorScope::NoRoom => self.no_room(ticket, &error),
                Err(error) => {
                    tracing::error!(%error, "the fallback store failed too; request let through");
                    self.let_through(tier);
                    Next::Forward(None)
                }
            };
        }
        #[cfg(feature = "metrics")]
        observe::store_latency(tier, ticket.sent.elapsed());
        let error = match result {
            Ok(verdict) => {
                if self.breaker.success() {
                    tracing::info!("rate-limit store answers again; circuit breaker closed");
                }
                if !verdict.is_allowed() {
                    if let Some(cache) = &self.deny_cache {
                        cache.insert(ticket.tier, &ticket.key, ticket.cost, &verdict, ticket.sent);
                    }
                }
                return self.on_verdict(ticket, extensions, verdict);
            }
            Err(error) => error,
        };
        // What an error reaches decides what it may change (the table at
        // `tollgate_core::ErrorScope`): only store-wide errors count toward
        // the breaker, so no subject's fault changes another's decision.
        match error.scope() {
            ErrorScope::Store => {
                observe::store_error(tier);
                if self.breaker.failure() {
                    tracing::warn!(%error, pause = ?self.breaker.pause(), "rate-limit store failing; circuit breaker opened");
                } else {
                    self.log_error(&error);
                }
                self.on_failure(ticket)
            }
            ErrorScope::NoRoom => {
                observe::store_error(tier);
                self.no_room(ticket, &error)
            }
            ErrorScope::Subject => {
                observe::store_error(tier);
                tracing::debug!(%error, key = %ticket.key, "rate-limit check failed for this subject alone; its failure policy applies to this request");
                self.log_error(&error);
                self.on_failure(ticket)
            }
            // `ErrorScope::Request` and any scope this version does not
            // know: the request itself cannot be checked.
            _ => {
                tracing::error!(%error, key = %ticket.key, "rate-limit check refused");
                let message = format!("{error}\n");
                Next::Respond(response::plain(
                    ticket.grpc.take(),
                    StatusCode::TOO_MANY_REQUESTS,
                    &message,
                ))
            }
        }
    }

    /// A new subject the store has no room for: denied, whatever the
    /// failure policy (letting it through would leave every fresh identity
    /// of a flood unlimited), with the store's `Retry-After`.
    fn no_room(&self, ticket: &mut Ticket, error: &StoreError) -> Next<St> {
        if self.mode == Mode::DryRun {
            // A dry run never rejects: it reports what enforcing would do.
            tracing::info!(%error, key = %ticket.key, "dry run: would have been denied (no room for a new subject)");
            return Next::Forward(None);
        }
        tracing::debug!(%error, key = %ticket.key, "no room for a new subject; denied");
        let mut response = response::plain(
            ticket.grpc.take(),
            self.no_room_status,
            "the rate limiter cannot take on new clients right now; retry later\n",
        );
        if let Some(retry_after) = error.retry_after() {
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                HeaderValue::from(crate::headers::ceil_secs(retry_after).max(1)),
            );
        }
        Next::Respond(response)
    }

    /// Logs a store error at `warn`, at most once per second per layer with
    /// the count since the last log (every one at `debug`).
    fn log_error(&self, error: &StoreError) {
        tracing::debug!(%error, "rate-limit store failed");
        if let Some(count) = self.errors.record() {
            tracing::warn!(
                %error,
                count,
                "rate-limit store failed: {count} error(s) since the last such warning"
            );
        }
    }

    /// Counts and logs (at most once per second) a request let through
    /// undecided.
    fn let_through(&self, tier: &Tier) {
        observe::fail_open(tier);
        if let Some(count) = self.undecided.record() {
            tracing::warn!(
                count,
                "rate limiter failing open: {count} request(s) let through undecided since the last such warning"
            );
        }
    }

    /// The store failed, or is skipped (breaker open): apply the failure
    /// policy.
    fn on_failure(&self, ticket: &mut Ticket) -> Next<St> {
        match &self.failure {
            FailurePolicy::FailOpen => {
                self.let_through(self.tier(ticket));
                Next::Forward(None)
            }
            FailurePolicy::FailClosed => Next::Respond(response::plain(
                ticket.grpc.take(),
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate limiter is unavailable; retry later\n",
            )),
            FailurePolicy::Fallback(store) => {
                ticket.fallback = true;
                let tier = self.tier(ticket);
                match store.check_now(&ticket.key, &tier.policies, ticket.cost) {
                    Some(result) => Next::Ready(result),
                    None => Next::Fallback(store.check(&ticket.key, &tier.policies, ticket.cost)),
                }
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
        let tier = self.tier(ticket);
        RateLimitInfo::new(
            std::mem::take(&mut ticket.key).into_string(),
            std::sync::Arc::clone(&tier.name),
            std::sync::Arc::clone(&tier.policies),
            verdict,
            self.mode == Mode::DryRun,
        )
    }

    fn limited(&self, ticket: &mut Ticket, verdict: Verdict) -> Next<St> {
        let tier = self.tier(ticket);
        observe::denied(tier, &verdict);
        let headers = self.headers(tier, &verdict, true);
        let grpc = ticket.grpc.take();
        let info = self.info(ticket, verdict);
        tracing::debug!(key = %info.key(), policy = info.binding_policy(), retry_after = ?info.retry_after(), "rate limited");
        Next::Respond(response::limited(&self.body, grpc, &info, headers))
    }

    /// A verdict from the store, the fallback store or the deny cache.
    pub(crate) fn on_verdict(
        &self,
        ticket: &mut Ticket,
        extensions: &mut Extensions,
        verdict: Verdict,
    ) -> Next<St> {
        let tier = self.tier(ticket);
        if verdict.is_allowed() {
            if let Some(charge) = extensions.get::<crate::Charge>() {
                charge.admit(&ticket.key, ticket.tier, ticket.fallback);
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
                    return self.limited(ticket, delayed_as_denied(&verdict));
                }
                Some(now + delay)
            };
            // No headers to add (headers only on limited responses): no
            // work on the response.
            // (An admitted response gets fields only with `HeaderMode::All`.)
            let headers = if self.header_mode == HeaderMode::All {
                Some(self.headers(tier, &verdict, false)).filter(|h| !h.is_empty())
            } else {
                None
            };
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
                        _ => self.limited(ticket, verdict),
                    }
                }
                Mode::Enforce => self.limited(ticket, verdict),
            }
        }
    }

    /// A wait ended.
    pub(crate) fn after_wait(&self, ticket: &mut Ticket, then: Then) -> Next<St> {
        let _entered = ticket.span.as_ref().map(|span| span.clone().entered());
        match then {
            Then::Recheck => {
                ticket.sent = Instant::now();
                self.ask_store(ticket)
            }
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
