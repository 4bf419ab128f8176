//! [`Gate`], what the services of one concurrency layer share (store,
//! policy, key, failure policy, circuit breaker, logs), and the decision it
//! takes on an acquire's result: grant, 429, or the failure policy.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use portcullis_core::{
    ConcurrencyPolicy, ErrorScope, LeaseDecision, LeaseId, LeaseStore, StoreError,
};

use super::permit::Permit;
use crate::breaker::{Breaker, UndecidedLog};
use crate::config::MissingKey;
use crate::observe::{Concurrency, ConcurrencyLabels};
use crate::response::{self, plain};

/// What the services of one layer share.
pub(crate) struct Gate<St, K> {
    pub(crate) store: Arc<St>,
    pub(crate) policy: ConcurrencyPolicy,
    pub(crate) key: K,
    pub(crate) missing_key: MissingKey,
    pub(crate) fail_closed: bool,
    pub(crate) timeout: Duration,
    /// Stops asking a store that keeps failing store-wide, as the rate
    /// layer's does.
    pub(crate) breaker: Breaker,
    /// Store errors, logged at most once per second.
    pub(crate) errors: UndecidedLog,
    /// Requests run without a permit (fail-open), logged at most once per
    /// second.
    pub(crate) undecided: UndecidedLog,
    /// Requests without a key that were rejected, logged at most once per
    /// second (as the rate layer logs them).
    pub(crate) rejected: UndecidedLog,
    /// The policy's metric keys (feature `metrics`).
    pub(crate) metrics: ConcurrencyLabels,
}

impl<St, K> fmt::Debug for Gate<St, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("policy", &self.policy)
            .field("missing_key", &self.missing_key)
            .field("fail_closed", &self.fail_closed)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

/// What to do with a request once its acquire answered.
pub(crate) enum Outcome {
    /// Call the inner service, holding this permit (none: fail-open).
    Forward(Option<Permit>),
    /// Answer with this response.
    Respond(Response<Bytes>),
}

/// The request's identity for the store.
pub(crate) struct Ticket {
    pub(crate) subject: Arc<str>,
    pub(crate) lease: LeaseId,
    pub(crate) grpc: Option<HeaderValue>,
}

impl<St: LeaseStore, K> Gate<St, K> {
    /// Turns an acquire's result into what to do. `cleanup` releases the
    /// lease if it may have been granted (an error or a timeout).
    pub(crate) fn decide(
        &self,
        ticket: &Ticket,
        result: Result<LeaseDecision, StoreError>,
    ) -> Outcome {
        if result.is_ok() {
            self.outage_over();
            if self.breaker.success() {
                tracing::info!(
                    policy = self.policy.name(),
                    "concurrency limit store answers again; circuit breaker closed"
                );
            }
        }
        match result {
            Ok(decision) if decision.is_granted() => {
                let observed = self.metrics.acquired();
                Outcome::Forward(Some(Permit::hold(
                    &self.store,
                    Arc::clone(&ticket.subject),
                    &self.policy,
                    ticket.lease,
                    observed,
                )))
            }
            Ok(decision) => Outcome::Respond(self.limited(ticket, decision.retry_after())),
            Err(error) => self.on_error(ticket, &error),
        }
    }

    fn on_error(&self, ticket: &Ticket, error: &StoreError) -> Outcome {
        match error.scope() {
            // No room for a new subject, or a request the store refuses:
            // denied, never let through.
            ErrorScope::NoRoom => {
                self.metrics.count(Concurrency::StoreError);
                Outcome::Respond(self.limited(ticket, error.retry_after()))
            }
            ErrorScope::Request => {
                self.metrics.count(Concurrency::StoreError);
                Outcome::Respond(self.limited(ticket, None))
            }
            // Only store-wide errors count toward the breaker (the table
            // at `portcullis_core::ErrorScope`), as in the rate layer.
            scope => {
                self.metrics.count(Concurrency::StoreError);
                if scope == ErrorScope::Store && self.breaker.failure() {
                    tracing::warn!(policy = self.policy.name(), error = crate::observe::chain(error), pause = ?self.breaker.pause(), "concurrency limit store failing; circuit breaker opened");
                } else {
                    self.log_error(error);
                }
                self.on_failure(ticket)
            }
        }
    }

    /// The store answered after store-wide failures: logs (at most once a
    /// second) the requests run without a permit and the store errors
    /// counted since the last such warning, as the rate layer does, so the
    /// last ones of a short outage are reported. One atomic load when there
    /// was no outage.
    fn outage_over(&self) {
        let counts = crate::breaker::outage_counts(&self.breaker, &self.undecided, &self.errors);
        if let Some((undecided, errors)) = counts {
            tracing::warn!(
                policy = self.policy.name(),
                count = undecided,
                errors,
                "concurrency limit store answers again: {undecided} request(s) run without a permit and {errors} store error(s) since the last such warning"
            );
        }
    }

    /// Logs a store error at `warn`, at most once per second per layer with
    /// the count since the last log (every one at `debug`).
    fn log_error(&self, error: &StoreError) {
        tracing::debug!(
            policy = self.policy.name(),
            error = crate::observe::chain(error),
            "concurrency limit store failed"
        );
        if let Some(count) = self.errors.record() {
            tracing::warn!(
                policy = self.policy.name(),
                error = crate::observe::chain(error),
                count,
                "concurrency limit store failed: {count} error(s) since the last such warning"
            );
        }
    }

    /// Whether the store may be asked: `false` while the circuit breaker
    /// is open.
    pub(crate) fn store_allowed(&self) -> bool {
        let allowed = self.breaker.allow();
        if !allowed {
            tracing::debug!(
                policy = self.policy.name(),
                "store skipped: circuit breaker open"
            );
        }
        allowed
    }

    /// The failure policy, after the store failed or timed out, or while
    /// the circuit breaker skips it.
    pub(crate) fn on_failure(&self, ticket: &Ticket) -> Outcome {
        if self.fail_closed {
            Outcome::Respond(plain(
                ticket.grpc.clone(),
                StatusCode::SERVICE_UNAVAILABLE,
                "The service cannot check its concurrency limit right now; try again shortly.\n",
            ))
        } else {
            self.metrics.count(Concurrency::FailOpen);
            if let Some(count) = self.undecided.record() {
                tracing::warn!(
                    policy = self.policy.name(),
                    count,
                    "concurrency limit failing open: {count} request(s) run without a permit since the last such warning"
                );
            }
            Outcome::Forward(None)
        }
    }

    /// The `429` (gRPC `RESOURCE_EXHAUSTED`) of a denied request.
    fn limited(&self, ticket: &Ticket, retry_after: Option<Duration>) -> Response<Bytes> {
        self.metrics.count(Concurrency::Denied);
        response::concurrency_limited(
            ticket.grpc.clone(),
            self.policy.name(),
            self.policy.limit(),
            retry_after,
        )
    }
}
