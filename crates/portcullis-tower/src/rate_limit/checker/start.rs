//! A new request's way to the store: its key (or what a request without
//! one gets), its cost, its tier (static, live, or a plan lookup to wait
//! for) and its options; the answers that need no waiting (the deny
//! cache, the open breaker, a store that answers at once, forwarded with
//! no ticket when nothing more is needed); asking the store again after a
//! wait; and the step after a plan lookup answered.

use std::sync::Arc;

use http::{HeaderMap, Request};
use portcullis_core::{BoxCheckFuture, Store, StoreError, Verdict};
use tokio::time::Instant;

use super::shared::Checker;
use super::step::{Next, Ticket};
use crate::config::{HeaderMode, MissingKey, Mode};
use crate::headers::RateLimitHeaders;
use crate::key::{KeyBuf, KeyExtractor, RequestHead};
use crate::observe;
use crate::rate_limit::options::{self, Asked, RequestOptions};
use crate::rate_limit::resolve::{Cached, Picked};
use crate::rate_limit::tier::Tier;
use crate::response::{self, grpc_content_type};

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
    /// The first step for a new request; its ticket, when it needs one, is
    /// written to `slot` (an out-parameter rather than a returned pair, so
    /// the large values are not copied on the hot path).
    pub(crate) fn start<B>(&self, request: &mut Request<B>, slot: &mut Option<Ticket>) -> Next<St> {
        let mut key = KeyBuf::new();
        if let Err(next) = self.read_key(&RequestHead::new(request), &mut key) {
            return next;
        }
        self.start_keyed(request, key, slot)
    }

    /// The first step for a new request on a layer built without any of
    /// what a request may bring beyond its key ([`Checker::straight`]: no
    /// tier selector, no cost function, no charge, no options, no
    /// [`RateLimitInfo`](crate::RateLimitInfo), not a dry run): the default
    /// tier, or with live limits the key's override, cached plan or the
    /// defaults in force; cost 1. `Ok` is an admitted request to forward
    /// with these headers, decided with no ticket and no [`Next`] built;
    /// everything else is the step [`start`](Self::start) would take, its
    /// ticket in `slot`.
    #[inline]
    pub(crate) fn start_straight<B>(
        &self,
        request: &mut Request<B>,
        slot: &mut Option<Ticket>,
    ) -> Result<Option<RateLimitHeaders>, Next<St>> {
        let mut key = KeyBuf::new();
        self.read_key(&RequestHead::new(request), &mut key)?;
        // A held denial (only a store that answers later fills the cache),
        // or a request span to record: the general way.
        if self
            .deny_cache
            .as_ref()
            .is_some_and(|cache| !cache.is_empty())
            || tracing::enabled!(tracing::Level::DEBUG)
        {
            return Err(self.start_keyed(request, key, slot));
        }
        match &self.live {
            None => self.straight_check(request, key, &self.tiers[0], slot),
            Some(live) if !live.has_plans() => {
                let in_force = live.in_force();
                let tier = in_force.tier(&key);
                self.straight_check(request, key, tier, slot)
            }
            Some(live) => match live.pick(&RequestHead::new(request), &key, None) {
                Picked::Live(tier) => self.straight_check(request, key, &tier, slot),
                Picked::Static(index) => {
                    let tier = self.tiers.get(index).unwrap_or(&self.tiers[0]);
                    self.straight_check(request, key, tier, slot)
                }
                Picked::Later(lookup) => {
                    *slot = Some(self.ticket(key, &self.tiers[0], 1, None));
                    Err(Next::Resolve(lookup))
                }
                Picked::Failed => {
                    let ticket = slot.insert(self.ticket(key, &self.tiers[0], 1, None));
                    Err(self.on_failure(ticket, request.headers()))
                }
            },
        }
    }

    /// [`start_straight`](Self::start_straight) once the key and tier are
    /// known.
    #[inline]
    fn straight_check<B>(
        &self,
        request: &mut Request<B>,
        key: KeyBuf,
        tier: &Arc<Tier>,
        slot: &mut Option<Ticket>,
    ) -> Result<Option<RateLimitHeaders>, Next<St>> {
        if tier.classed {
            // Checked as its default class (`ask_store` asks with it).
            let ticket = slot.insert(self.ticket(key, tier, 1, None));
            ticket.options = Some(RequestOptions::default_class());
            return Err(self.ask_store(ticket, request.headers()));
        }
        if !self.breaker.allow() {
            let ticket = slot.insert(self.ticket(key, tier, 1, None));
            tracing::debug!("store skipped: circuit breaker open");
            return Err(self.on_failure(ticket, request.headers()));
        }
        // Headers only on limited responses, and no admission that waits:
        // an admission's figures would be thrown away, so the store may
        // skip them (`Store::check_denial_now`).
        if self.header_mode != HeaderMode::All && !tier.may_delay {
            return match self.check_denial_now(tier, &key) {
                Some(Ok(None)) => {
                    self.store_answered();
                    observe::allowed(&tier.labels);
                    Ok(None)
                }
                Some(Ok(Some(denied))) => {
                    let ticket = slot.insert(self.ticket(key, tier, 1, None));
                    Err(self.on_result(ticket, request, Ok(denied)))
                }
                Some(Err(error)) => {
                    let ticket = slot.insert(self.ticket(key, tier, 1, None));
                    Err(self.on_result(ticket, request, Err(error)))
                }
                None => {
                    let ticket = slot.insert(self.ticket(key, tier, 1, None));
                    Err(self.check_later(ticket))
                }
            };
        }
        match self.check_now(tier, &key, 1) {
            Some(Ok(verdict)) if verdict.is_allowed() && verdict.delay().is_zero() => {
                self.store_answered();
                observe::allowed(&tier.labels);
                Ok(self.admitted_headers(tier, &verdict))
            }
            Some(result) => {
                let ticket = slot.insert(self.ticket(key, tier, 1, None));
                Err(self.on_result(ticket, request, result))
            }
            None => {
                let ticket = slot.insert(self.ticket(key, tier, 1, None));
                Err(self.check_later(ticket))
            }
        }
    }

    /// [`start`](Self::start) once the request's key is read.
    fn start_keyed<B>(
        &self,
        request: &mut Request<B>,
        key: KeyBuf,
        slot: &mut Option<Ticket>,
    ) -> Next<St> {
        let head = RequestHead::new(request);
        let Some(cost) = self.request_cost(&head) else {
            return Next::Forward(None);
        };
        let options = self
            .options
            .as_ref()
            .and_then(|sources| sources.for_request(&head));
        let picked = self.pick_tier(&head, &key);
        let tier: &Arc<Tier> = match &picked {
            Picked::Static(index) => self.tiers.get(*index).unwrap_or(&self.tiers[0]),
            Picked::Live(tier) => tier,
            Picked::Later(_) | Picked::Failed => &self.tiers[0],
        };
        // Classes apply to every request of a classed tier: one without a
        // class of its own is checked as the default class.
        let options = match options {
            None if tier.classed => Some(RequestOptions::default_class()),
            options => options,
        };
        let span = request_span(&key, tier, cost);
        if matches!(picked, Picked::Later(_) | Picked::Failed) {
            let ticket = slot.insert(self.ticket(key, tier, cost, span));
            ticket.options = options;
            return match picked {
                Picked::Later(lookup) => Next::Resolve(lookup),
                _ => self.on_failure(ticket, request.headers()),
            };
        }
        let _entered = span.as_ref().map(|span| span.clone().entered());
        // With an idempotency key or a class, the check with options (the
        // deny cache is off for such a layer); else the plain answer.
        let mut asked = None;
        let answer = match options.as_deref() {
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
        ticket.options = options;
        match answer {
            Answer::Cached(verdict) => {
                tracing::trace!(key = %ticket.key, "denied by the local deny cache");
                self.on_verdict(ticket, request, verdict)
            }
            Answer::BreakerOpen => {
                tracing::debug!("store skipped: circuit breaker open");
                self.on_failure(ticket, request.headers())
            }
            // Decided at once: straight to `call`, rather than as a
            // `Next::Ready` that `call` moves back into `on_result`.
            Answer::Now(result) => self.on_result(ticket, request, result),
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

    /// A check with a request's options (`rate_limit/options.rs`): its answer now,
    /// or `None` with the future that answers later in `asked`.
    fn ask_with(
        &self,
        tier: &Tier,
        key: &str,
        cost: u64,
        request: Option<&RequestOptions>,
        asked: &mut Option<BoxCheckFuture>,
    ) -> Option<Result<Verdict, StoreError>> {
        let request = request?;
        match options::ask(&*self.store, key, &tier.policies, cost, request) {
            Asked::Now(result) => Some(result),
            Asked::Later(future) => {
                *asked = Some(future);
                None
            }
        }
    }

    /// Reads the request's key into `key`; a request without one is
    /// forwarded, rejected, or given the fallback key, as configured.
    #[inline]
    fn read_key(&self, request: &RequestHead<'_>, key: &mut KeyBuf) -> Result<(), Next<St>> {
        if self.key.extract_into(request, key) {
            return Ok(());
        }
        match &self.missing_key {
            MissingKey::Skip => {
                tracing::trace!("no rate-limit key; not limited");
                Err(Next::Forward(None))
            }
            MissingKey::Reject { status, message } => {
                let grpc = grpc_content_type(request.headers());
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
    fn request_cost(&self, request: &RequestHead<'_>) -> Option<u64> {
        if self.charge.is_some() {
            return Some(0);
        }
        let cost = self.cost(request);
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
            .and_then(|cache| cache.get(tier.slot, tier.id, key, cost));
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
        self.timed(tier, || self.store.check_now(key, &tier.policies, cost))
    }

    /// The store's answer now, when it denies, if it answers synchronously
    /// ([`Store::check_denial_now`]): `Some(Ok(None))` is an admission
    /// whose figures were not computed. A cost of 1 (the straight path's).
    #[inline]
    fn check_denial_now(
        &self,
        tier: &Tier,
        key: &str,
    ) -> Option<Result<Option<Verdict>, StoreError>> {
        self.timed(tier, || self.store.check_denial_now(key, &tier.policies, 1))
    }

    /// `ask`, the store answering now, with its latency recorded when a
    /// recorder is in force (two clock reads: only then,
    /// `observe::recording`).
    #[inline]
    fn timed<T>(&self, tier: &Tier, ask: impl FnOnce() -> Option<T>) -> Option<T> {
        #[cfg(feature = "metrics")]
        if observe::recording() {
            let begun = Instant::now();
            let result = ask();
            if result.is_some() {
                observe::store_latency(&tier.labels, begun.elapsed());
            }
            return result;
        }
        #[cfg(not(feature = "metrics"))]
        let _ = tier;
        ask()
    }

    /// Sends the check to a store that answers later.
    fn check_later(&self, ticket: &mut Ticket) -> Next<St> {
        ticket.sent = Some(Instant::now());
        let tier = &ticket.tier;
        Next::Check(self.store.check(&ticket.key, &tier.policies, ticket.cost))
    }

    /// Forwards an admitted verdict the store gave at once, when forwarding
    /// needs nothing from a ticket: no queueing delay, no dry run, no
    /// [`RateLimitInfo`](crate::RateLimitInfo) or [`Charge`](crate::Charge) in the extensions.
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
        observe::allowed(&tier.labels);
        Some(Next::Forward(self.admitted_headers(tier, verdict)))
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
            ticket.options = Some(RequestOptions::default_class());
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

    /// The tier of a request (`key` is its key).
    #[inline]
    pub(crate) fn pick_tier(&self, request: &RequestHead<'_>, key: &str) -> Picked {
        match &self.live {
            None => Picked::Static(self.tier_index(request, key)),
            Some(live) => {
                let select = self.select_tier.as_ref().and_then(|s| s(request, key));
                live.pick(request, key, select)
            }
        }
    }

    /// A lookup answered: check the request under the tier it gives.
    pub(crate) fn on_resolved<B>(
        &self,
        ticket: &mut Ticket,
        request: &mut Request<B>,
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
                return self.on_failure(ticket, request.headers());
            }
        }
        let cached = self
            .deny_cache
            .as_ref()
            .filter(|cache| !cache.is_empty())
            .and_then(|cache| {
                cache.get(ticket.tier.slot, ticket.tier.id, &ticket.key, ticket.cost)
            });
        match cached {
            Some(verdict) => self.on_verdict(ticket, request, verdict),
            None => self.ask_store(ticket, request.headers()),
        }
    }
}
