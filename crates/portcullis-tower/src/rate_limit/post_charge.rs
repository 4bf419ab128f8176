//! Charging after the response: [`PostCharge`], the step of the response
//! future that, once the inner service has answered, charges the store
//! the amount the [`Charge`] handle owes (within the layer's timeout,
//! falling back as the failure policy says) and holds the response until
//! it is charged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Response;
use portcullis_core::{ErrorScope, Store, StoreError, Verdict};

use super::charge::{Charge, Subject};
use super::checker::Checker;
use super::tier::Tier;
use crate::config::FailurePolicy;
use crate::headers::RateLimitHeaders;
use crate::key::KeyExtractor;

type ChargeFuture = Pin<Box<dyn Future<Output = Option<Verdict>> + Send>>;

/// The post-response step of a request of a layer that charges after the
/// response: holds the response while its charge is sent.
pub(crate) struct PostCharge<R, St, K> {
    checker: Arc<Checker<St, K>>,
    handle: Charge,
    response: Option<R>,
    charging: Option<ChargeFuture>,
    /// The headers of the peek, for a response whose charge failed.
    headers: Option<RateLimitHeaders>,
    /// The tier charged.
    tier: Option<Arc<Tier>>,
}

impl<B, St: Store, K: KeyExtractor> PostCharge<Response<B>, St, K> {
    pub(crate) fn new(checker: Arc<Checker<St, K>>, handle: Charge) -> Box<Self> {
        Box::new(Self {
            checker,
            handle,
            response: None,
            charging: None,
            headers: None,
            tier: None,
        })
    }

    /// Starts charging for `response`, whose peek gave `headers`:
    /// `Err(response)`, with `headers` applied, when there is nothing to
    /// charge (it is returned at once), else `Ok(())` and
    /// [`PostCharge::poll`] gives the response back once charged, with the
    /// headers of the state after the charge.
    pub(crate) fn begin(
        &mut self,
        response: Response<B>,
        headers: Option<RateLimitHeaders>,
    ) -> Result<(), Response<B>> {
        let (mut parts, body) = response.into_parts();
        let from_response = self.checker.charge.as_ref().map_or(0, |cost| cost(&parts));
        let Some((subject, cost)) = self.handle.finish(from_response) else {
            if let Some(headers) = headers {
                headers.apply(&mut parts.headers);
            }
            return Err(Response::from_parts(parts, body));
        };
        self.tier = Some(Arc::clone(&subject.tier));
        self.headers = headers;
        self.charging = Some(Box::pin(charge(Arc::clone(&self.checker), subject, cost)));
        self.response = Some(Response::from_parts(parts, body));
        Ok(())
    }

    /// Waits for the charge; then the response, with the rate-limit headers
    /// of the state the charge left (those of the peek when it failed).
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Response<B>>> {
        let mut headers = self.headers.take();
        if let Some(charging) = self.charging.as_mut() {
            let charged = match charging.as_mut().poll(cx) {
                Poll::Ready(charged) => charged,
                Poll::Pending => {
                    self.headers = headers;
                    return Poll::Pending;
                }
            };
            self.charging = None;
            // Headers only where the peek wrote some (the header mode):
            // the same fields, of the state after the charge.
            if let (Some(verdict), Some(_)) = (charged, &headers)
                && let Some(tier) = &self.tier
            {
                headers = Some(self.checker.headers(tier, &verdict, false));
            }
        }
        let mut response = self.response.take();
        if let (Some(response), Some(headers)) = (response.as_mut(), headers) {
            headers.apply(response.headers_mut());
        }
        Poll::Ready(response)
    }
}

/// Charges `cost` to `subject` in the store that admitted it, within the
/// layer's timeout. A failure is logged and, when the store as a whole
/// fails, counted by the circuit breaker; with
/// [`FailurePolicy::Fallback`] a charge the main store failed (not one it
/// refused) goes to the fallback store. The response is never lost.
async fn charge<St: Store, K: Send + Sync + 'static>(
    checker: Arc<Checker<St, K>>,
    subject: Subject,
    cost: u64,
) -> Option<Verdict> {
    let policies = Arc::clone(&subject.tier.policies);
    let fallback = match &checker.failure {
        FailurePolicy::Fallback(store) => Some(store),
        _ => None,
    };
    if !subject.fallback {
        let result = within(
            checker.timeout,
            checker.store.charge(&subject.key, &policies, cost),
        )
        .await;
        let error = match result {
            Ok(verdict) => {
                checker.breaker.success();
                trace_charged(&subject, cost, &verdict);
                return Some(verdict);
            }
            Err(error) => error,
        };
        if error.scope() == ErrorScope::Store {
            checker.breaker.failure();
        }
        tracing::warn!(error = crate::observe::chain(&error), key = %subject.key, cost, "charging after the response failed");
        // The fallback store takes what the failure policy sends it: the
        // store's failures (store-wide or this subject's), not a request
        // it refuses.
        if matches!(error.scope(), ErrorScope::Request) {
            return None;
        }
        fallback?;
    }
    let store = fallback?;
    match within(checker.timeout, store.charge(&subject.key, &policies, cost)).await {
        Ok(verdict) => {
            trace_charged(&subject, cost, &verdict);
            Some(verdict)
        }
        Err(error) => {
            tracing::warn!(error = crate::observe::chain(&error), key = %subject.key, cost, "charging the fallback store after the response failed");
            None
        }
    }
}

fn trace_charged(subject: &Subject, cost: u64, verdict: &Verdict) {
    tracing::debug!(key = %subject.key, cost, allowed_next = verdict.is_allowed(), retry_after = ?verdict.retry_after(), "charged after the response");
}

/// `future`, or a timeout error after `after`.
async fn within(
    after: std::time::Duration,
    future: impl Future<Output = Result<Verdict, StoreError>>,
) -> Result<Verdict, StoreError> {
    tokio::time::timeout(after, future)
        .await
        .unwrap_or(Err(StoreError::Timeout { after }))
}
