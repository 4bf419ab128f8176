//! The store's answer turned into the request's next step: a verdict
//! (from the store, the fallback store or the deny cache) forwards the
//! request, queues or shapes it, or answers it limited, with the
//! rate-limit headers and the [`RateLimitInfo`]; an error is answered by
//! what it reaches (the store, the subject, the request); a timeout is a
//! store error; a wait's end forwards or asks again.

use http::{HeaderMap, HeaderValue, Request, StatusCode};
use portcullis_core::{Decision, ErrorScope, Store, StoreError, Verdict};
use tokio::time::Instant;

use super::shared::Checker;
use super::step::{Next, Then, Ticket};
use crate::config::{HeaderMode, Mode};
use crate::headers::RateLimitHeaders;
use crate::info::RateLimitInfo;
use crate::key::KeyExtractor;
use crate::observe;
use crate::rate_limit::charge::Charge;
use crate::rate_limit::tier::Tier;
use crate::response::{self, grpc_content_type};

impl<St: Store, K: KeyExtractor> Checker<St, K> {
    /// The store answered: closes the circuit breaker if it was open.
    #[inline]
    pub(super) fn store_answered(&self) {
        // No store-wide failure since the last answer (the common case):
        // one atomic load, no outage to report, no breaker to close.
        if !self.breaker.failing() {
            return;
        }
        self.outage_over();
        if self.breaker.success() {
            tracing::info!("rate-limit store answers again; circuit breaker closed");
        }
    }

    /// The headers of an admitted response: fields only with
    /// [`HeaderMode::All`], else none (no work on the response).
    pub(super) fn admitted_headers(
        &self,
        tier: &Tier,
        verdict: &Verdict,
    ) -> Option<RateLimitHeaders> {
        if self.header_mode == HeaderMode::All {
            Some(self.headers(tier, verdict, false)).filter(|h| !h.is_empty())
        } else {
            None
        }
    }

    /// The check timed out.
    pub(crate) fn on_timeout<B>(&self, ticket: &mut Ticket, request: &mut Request<B>) -> Next<St> {
        let error = StoreError::Timeout {
            after: self.timeout,
        };
        self.on_result(ticket, request, Err(error))
    }

    /// The store (or the fallback store) answered for `request`: its
    /// extensions get the [`RateLimitInfo`], its headers
    /// say whether an answer must be a gRPC one.
    pub(crate) fn on_result<B>(
        &self,
        ticket: &mut Ticket,
        request: &mut Request<B>,
        result: Result<Verdict, StoreError>,
    ) -> Next<St> {
        // Without a span (`debug` off), no guard to create and drop.
        match &ticket.span {
            None => self.on_result_in_span(ticket, request, result),
            Some(span) => {
                let _entered = span.clone().entered();
                self.on_result_in_span(ticket, request, result)
            }
        }
    }

    fn on_result_in_span<B>(
        &self,
        ticket: &mut Ticket,
        request: &mut Request<B>,
        result: Result<Verdict, StoreError>,
    ) -> Next<St> {
        let tier = &ticket.tier;
        if ticket.fallback {
            return match result {
                Ok(verdict) => self.on_verdict(ticket, request, verdict),
                Err(error) if error.scope() == ErrorScope::NoRoom => {
                    self.no_room(request.headers(), &error)
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
        if let Some(sent) = ticket.sent.filter(|_| observe::recording()) {
            observe::store_latency(&tier.labels, sent.elapsed());
        }
        let error = match result {
            Ok(verdict) => {
                self.store_answered();
                // Only answers that took a round trip are cached: a store
                // that answers at once is as quick as the cache.
                if let Some((cache, sent)) = self.deny_cache.as_ref().zip(ticket.sent)
                    && !verdict.is_allowed()
                {
                    cache.insert(
                        ticket.tier.slot,
                        ticket.tier.id,
                        &ticket.key,
                        ticket.cost,
                        &verdict,
                        sent,
                    );
                }
                return self.on_verdict(ticket, request, verdict);
            }
            Err(error) => error,
        };
        // What an error reaches decides what it may change (the table at
        // `portcullis_core::ErrorScope`): only store-wide errors count toward
        // the breaker, so no subject's fault changes another's decision.
        match error.scope() {
            ErrorScope::Store => {
                observe::store_error(&tier.labels);
                if self.breaker.failure() {
                    tracing::warn!(error = crate::observe::chain(&error), pause = ?self.breaker.pause(), "rate-limit store failing; circuit breaker opened");
                } else {
                    self.log_error(&error, "rate-limit store failed");
                }
                self.on_failure(ticket, request.headers())
            }
            ErrorScope::NoRoom => {
                observe::store_error(&tier.labels);
                self.no_room(request.headers(), &error)
            }
            ErrorScope::Subject => {
                observe::store_error(&tier.labels);
                tracing::debug!(error = crate::observe::chain(&error), key = %ticket.key, "rate-limit check failed for this subject alone; its failure policy applies to this request");
                self.log_error(&error, "rate-limit store failed");
                self.on_failure(ticket, request.headers())
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
                    grpc_content_type(request.headers()),
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
        let tier = &ticket.tier;
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
        let tier = &ticket.tier;
        observe::denied(&tier.labels, &verdict);
        if let Some(top) = &self.top_denied {
            let policy = crate::headers::binding_index(&verdict)
                .and_then(|i| tier.policies.get(i))
                .map_or("", portcullis_core::Policy::name);
            top.record(&ticket.key, policy);
        }
        let grpc = grpc_content_type(headers);
        let headers = self.headers(tier, &verdict, true);
        let info = self.info(ticket, verdict);
        tracing::debug!(key = %info.key(), policy = info.binding_policy(), retry_after = ?info.retry_after(), "rate limited");
        Next::Respond(Box::new(response::limited(
            &self.body, grpc, &info, headers,
        )))
    }

    /// A verdict from the store, the fallback store or the deny cache.
    pub(crate) fn on_verdict<B>(
        &self,
        ticket: &mut Ticket,
        request: &mut Request<B>,
        verdict: Verdict,
    ) -> Next<St> {
        let tier = &ticket.tier;
        if verdict.is_allowed() {
            // A replay was charged by the request it repeats.
            let replay = ticket
                .options
                .as_ref()
                .is_some_and(|request| request.is_replay());
            if self.charge.is_some()
                && !replay
                && let Some(charge) = request.extensions().get::<Charge>()
            {
                charge.admit(&ticket.key, &ticket.tier, ticket.fallback);
            }
            observe::allowed(&tier.labels);
            let delay = verdict.delay();
            if self.mode == Mode::DryRun {
                request.extensions_mut().insert(self.info(ticket, verdict));
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
                    return self.limited(ticket, request.headers(), delayed_as_denied(&verdict));
                }
                Some(now + delay)
            };
            let headers = self.admitted_headers(tier, &verdict);
            if self.info_in_extensions {
                request.extensions_mut().insert(self.info(ticket, verdict));
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
                    observe::dry_run_denied(&tier.labels, &verdict);
                    let info = self.info(ticket, verdict);
                    tracing::info!(key = %info.key(), policy = info.binding_policy(), retry_after = ?info.retry_after(), "dry run: would have been rate limited");
                    request.extensions_mut().insert(info);
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
                        _ => self.limited(ticket, request.headers(), verdict),
                    }
                }
                Mode::Enforce => self.limited(ticket, request.headers(), verdict),
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
