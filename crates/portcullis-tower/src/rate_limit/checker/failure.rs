//! What the [`Checker`] does when its store fails or is skipped: the
//! failure policy (fail open, fail closed, a fallback store), the answer
//! to a new subject the store has no room for, and the rate-limited logs
//! of errors and of requests let through undecided.

use http::{HeaderMap, StatusCode};
use portcullis_core::{Store, StoreError};

use super::shared::Checker;
use super::step::{Next, Ticket};
use crate::config::{FailurePolicy, Mode};
use crate::key::KeyExtractor;
use crate::observe;
use crate::rate_limit::options::{self, Asked};
use crate::rate_limit::tier::Tier;
use crate::response::{self, grpc_content_type};

impl<St: Store, K: KeyExtractor> Checker<St, K> {
    /// A new subject the store has no room for: denied, whatever the
    /// failure policy (letting it through would leave every fresh identity
    /// of a flood unlimited), with the store's `Retry-After`.
    pub(super) fn no_room(&self, headers: &HeaderMap, error: &StoreError) -> Next<St> {
        if self.mode == Mode::DryRun {
            // A dry run never rejects: it reports what enforcing would do.
            tracing::info!(
                error = crate::observe::chain(error),
                "dry run: would have been denied (no room for a new subject)"
            );
            return Next::Forward(None);
        }
        tracing::debug!(
            error = crate::observe::chain(error),
            "no room for a new subject; denied"
        );
        let grpc = grpc_content_type(headers);
        let is_grpc = grpc.is_some();
        let mut response = response::plain(
            grpc,
            self.no_room_status,
            "the rate limiter cannot take on new clients right now; retry later\n",
        );
        if let Some(retry_after) = error.retry_after() {
            response::set_retry_after(&mut response, retry_after, is_grpc);
        }
        Next::Respond(Box::new(response))
    }

    /// Logs a store error (`what` happened) at `warn`, at most once per
    /// second per layer with the count of errors since the last log (every
    /// one at `debug`).
    pub(super) fn log_error(&self, error: &StoreError, what: &str) {
        tracing::debug!(error = crate::observe::chain(error), "{what}");
        if let Some(count) = self.errors.record() {
            tracing::warn!(
                error = crate::observe::chain(error),
                count,
                "{what}: {count} store error(s) since the last such warning"
            );
        }
    }

    /// Counts and logs (at most once per second) a request let through
    /// undecided.
    pub(super) fn let_through(&self, tier: &Tier) {
        observe::fail_open(&tier.labels);
        if let Some(count) = self.undecided.record() {
            tracing::warn!(
                count,
                "rate limiter failing open: {count} request(s) let through undecided since the last such warning"
            );
        }
    }

    /// The store answered: the end of an outage (store-wide failures since
    /// the last answer), if there was one. Logs (at most once per second)
    /// the requests let through undecided and the store errors counted
    /// since the last such warning, so the last ones of a short outage are
    /// reported. Called before the breaker records the success; one atomic
    /// load when there was no outage. (Errors of one subject are no outage:
    /// their counts wait for the next due warning.)
    pub(super) fn outage_over(&self) {
        let counts = crate::breaker::outage_counts(&self.breaker, &self.undecided, &self.errors);
        if let Some((undecided, errors)) = counts {
            tracing::warn!(
                count = undecided,
                errors,
                "rate-limit store answers again: {undecided} request(s) let through undecided and {errors} store error(s) since the last such warning"
            );
        }
    }

    /// The store failed, or is skipped (breaker open): apply the failure
    /// policy.
    pub(crate) fn on_failure(&self, ticket: &mut Ticket, headers: &HeaderMap) -> Next<St> {
        match &self.failure {
            FailurePolicy::FailOpen => {
                self.let_through(&ticket.tier);
                Next::Forward(None)
            }
            FailurePolicy::FailClosed => Next::Respond(Box::new(response::plain(
                grpc_content_type(headers),
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate limiter is unavailable; retry later\n",
            ))),
            FailurePolicy::Fallback(store) => {
                ticket.fallback = true;
                let tier = &ticket.tier;
                // With a class or an idempotency key (a classed tier always
                // has one: its default), the fallback store keeps them too:
                // its reserves hold while the main store is down.
                if let Some(request) = ticket.options.as_deref() {
                    return match options::ask(
                        store,
                        &ticket.key,
                        &tier.policies,
                        ticket.cost,
                        request,
                    ) {
                        Asked::Now(result) => Next::Ready(result),
                        Asked::Later(future) => Next::Fallback(future),
                    };
                }
                match store.check_now(&ticket.key, &tier.policies, ticket.cost) {
                    Some(result) => Next::Ready(result),
                    None => Next::Fallback(store.check(&ticket.key, &tier.policies, ticket.cost)),
                }
            }
        }
    }
}
