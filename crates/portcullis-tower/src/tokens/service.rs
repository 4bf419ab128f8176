//! [`TokenBudgetService`]: a request's way through the token layer —
//! key, estimate (reading the body when asked), reserve under the
//! timeout, the refusals, then the inner call with its response body
//! watched for usage ([`TokenBody`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use portcullis_core::{ErrorScope, Refusal, ReservationId, ReservationStore, Reserved, StoreError};
use tower_service::Service;

use super::body::{Settler, TokenBody, Watch};
use super::request::{read_body, Rejection, TokenRequestBody};
use super::shared::Shared;
use super::usage::UsageReader;
use crate::headers::{ceil_secs, ratelimit_value, RATELIMIT, RATELIMIT_POLICY};
use crate::key::{KeyBuf, RequestHead};

/// The service [`TokenBudgetLayer`](crate::TokenBudgetLayer) wraps
/// around an upstream. See the layer for what it does.
pub struct TokenBudgetService<S, St> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for TokenBudgetService<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, St> std::fmt::Debug for TokenBudgetService<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBudgetService")
            .field("budget", &self.shared.budget)
            .finish_non_exhaustive()
    }
}

/// The future of [`TokenBudgetService`]: boxed (it reads a body, reserves
/// and calls the upstream, each an `async` step).
pub type TokenBudgetFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<TokenBody<B>>, E>> + Send + 'static>>;

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for TokenBudgetService<S, St>
where
    S: Service<Request<TokenRequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: ReservationStore,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<TokenBody<ResB>>;
    type Error = S::Error;
    type Future = TokenBudgetFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The clone that was made ready is the one called.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(run(inner, Arc::clone(&self.shared), request))
    }
}

async fn run<S, St, ReqB, ResB>(
    mut inner: S,
    shared: Arc<Shared<St>>,
    request: Request<ReqB>,
) -> Result<Response<TokenBody<ResB>>, S::Error>
where
    S: Service<Request<TokenRequestBody<ReqB>>, Response = Response<ResB>>,
    St: ReservationStore,
    ReqB: Body<Data = Bytes> + Send + 'static,
{
    let (parts, body) = request.into_parts();
    let mut key = KeyBuf::new();
    if !shared
        .key
        .extract_into(&RequestHead::from_parts(&parts), &mut key)
    {
        let message = format!(
            "this request carries no {}, which the token budget needs to tell callers apart",
            shared.key.describe()
        );
        return Ok(own(
            StatusCode::UNAUTHORIZED,
            &message,
            "invalid_request_error",
            "missing_key",
        ));
    }
    let key = key.into_string();
    let (estimate, body) = if shared.estimate.reads_body() {
        let bytes = match read_body(body, shared.estimate.body_limit()).await {
            Ok(bytes) => bytes,
            Err(rejection) => return Ok(rejected(&rejection)),
        };
        match shared.estimate.of(&parts, Some(&bytes)) {
            Ok(estimate) => (estimate, TokenRequestBody::read(bytes)),
            Err(rejection) => return Ok(rejected(&rejection)),
        }
    } else {
        match shared.estimate.of(&parts, None) {
            Ok(estimate) => (estimate, TokenRequestBody::inner(body)),
            Err(rejection) => return Ok(rejected(&rejection)),
        }
    };
    let key: Arc<str> = key.into();
    let id = ReservationId::generate();
    let budget = &shared.budget;
    let reserve = shared.store.reserve(&key, budget, estimate, id);
    let answer = match tokio::time::timeout(shared.timeout, reserve).await {
        Ok(answer) => answer,
        Err(_) => Err(StoreError::Timeout {
            after: shared.timeout,
        }),
    };
    let settler = || {
        Settler::new(
            Arc::clone(&shared.store),
            Arc::clone(&key),
            budget.clone(),
            id,
            estimate,
            shared.timeout,
            Arc::clone(&shared.logs),
        )
    };
    let reserved = match answer {
        Ok(reserved) if reserved.is_admitted() => Some(reserved),
        Ok(refused) => return Ok(limited(&shared, &refused)),
        Err(error) => {
            // A reserve that timed out or lost its connection may have
            // been made: settled (with its usage when let through, else
            // nothing used) so that nothing stays held.
            let maybe_made = matches!(
                error,
                StoreError::Timeout { .. } | StoreError::OutcomeUnknown { .. }
            );
            match store_failure(&shared, &error, estimate) {
                Some(response) => {
                    if maybe_made {
                        settler().settle(Some(0));
                    }
                    return Ok(response);
                }
                None if maybe_made => None,
                None => {
                    let response = inner.call(Request::from_parts(parts, body)).await?;
                    return Ok(response.map(|b| TokenBody::inner(b, None)));
                }
            }
        }
    };
    // Armed before the upstream is called: a request dropped while the
    // upstream works (the client went away) or an upstream error settles
    // at the estimate.
    let mut settler = settler();
    settler.keep_open(
        Arc::clone(&shared.store),
        Arc::clone(&key),
        budget.clone(),
        id,
        shared.timeout,
        Arc::clone(&shared.logs),
    );
    let response = match inner.call(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(error) => {
            settler.settle(None);
            return Err(error);
        }
    };
    let (mut head, body) = response.into_parts();
    if let Some(reserved) = &reserved {
        if let Some(policy) = &shared.policy_header {
            head.headers.append(&RATELIMIT_POLICY, policy.clone());
        }
        if let Some(value) = ratelimit_value(&shared.prefixes, reserved.verdict()) {
            head.headers.append(&RATELIMIT, value);
        }
    }
    let reader = UsageReader::new(
        &head.headers,
        shared.usage_header.as_ref(),
        shared.body_usage,
    );
    let watch = Watch { settler, reader };
    Ok(Response::from_parts(
        head,
        TokenBody::inner(body, Some(watch)),
    ))
}

/// A response the layer writes: `status`, a JSON error, and headers.
fn own<B>(status: StatusCode, message: &str, kind: &str, code: &str) -> Response<TokenBody<B>> {
    let body = serde_json::json!({
        "error": { "message": message, "type": kind, "code": code }
    });
    let mut response = Response::new(TokenBody::own(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn rejected<B>(rejection: &Rejection) -> Response<TokenBody<B>> {
    own(
        rejection.status,
        &rejection.message,
        "invalid_request_error",
        "token_estimate",
    )
}

/// The `429` of a refused reservation: which budget refused, when to
/// retry, and the budget's `RateLimit` fields.
fn limited<St, B>(shared: &Shared<St>, refused: &Reserved) -> Response<TokenBody<B>> {
    let budget = &shared.budget;
    let name = refused
        .refusal()
        .map_or_else(|| budget.name().to_owned(), |r| r.name(budget));
    let message = match refused.refusal() {
        Some(Refusal::InFlight { max }) => format!(
            "too many streams in flight: {max} at once is the most the budget \"{}\" allows; retry when one ends",
            budget.name()
        ),
        _ => format!("the budget \"{name}\" has no room for this request's estimate now; retry later or ask for fewer tokens"),
    };
    let mut response = own(
        StatusCode::TOO_MANY_REQUESTS,
        &message,
        "rate_limit_exceeded",
        &name,
    );
    let headers = response.headers_mut();
    // Streams end at times no store knows: a place in flight is worth
    // asking for again in a second, not at the worst case (the first
    // open reservation's expiry).
    let retry_after = match refused.refusal() {
        Some(Refusal::InFlight { .. }) => refused
            .retry_after()
            .map(|retry| retry.min(Duration::from_secs(1))),
        _ => refused.retry_after(),
    };
    if let Some(retry) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(retry).max(1)));
    }
    if let Some(policy) = &shared.policy_header {
        headers.insert(&RATELIMIT_POLICY, policy.clone());
    }
    if let Some(value) = ratelimit_value(&shared.prefixes, refused.verdict()) {
        headers.insert(&RATELIMIT, value);
    }
    response
}

/// The answer to a store that failed: `None` to let the request through
/// (fail-open, for the errors that reach beyond this request), else the
/// response.
fn store_failure<St, B>(
    shared: &Shared<St>,
    error: &StoreError,
    estimate: u64,
) -> Option<Response<TokenBody<B>>> {
    match error.scope() {
        ErrorScope::Request => {
            let message = match error {
                StoreError::CostTooHigh {
                    policy, capacity, ..
                } => format!(
                    "this request's estimate of {estimate} tokens is more than the budget \"{policy}\" ever holds ({capacity}); ask for fewer tokens"
                ),
                _ => "this request could not be checked against the token budget as sent".to_owned(),
            };
            if let Some(count) = shared.logs.refused.record() {
                tracing::warn!(
                    error = crate::observe::chain(error),
                    count,
                    "requests the token budget refused to reserve as sent (count: since the last such line)"
                );
            }
            Some(own(
                StatusCode::BAD_REQUEST,
                &message,
                "invalid_request_error",
                "token_estimate",
            ))
        }
        ErrorScope::NoRoom => {
            let mut response = own(
                StatusCode::TOO_MANY_REQUESTS,
                "the token budget has no room for a new caller now; retry later",
                "rate_limit_exceeded",
                shared.budget.name(),
            );
            let retry = error.retry_after().unwrap_or(Duration::from_secs(1));
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(ceil_secs(retry).max(1)));
            Some(response)
        }
        _ => {
            if let Some(count) = shared.logs.failed.record() {
                tracing::warn!(
                    error = crate::observe::chain(error),
                    fail_open = shared.fail_open,
                    count,
                    "the token budget's store failed (count: failures since the last such line)"
                );
            }
            if shared.fail_open {
                return None;
            }
            let mut response = own(
                StatusCode::SERVICE_UNAVAILABLE,
                "the token budget cannot be checked now; retry shortly",
                "service_unavailable",
                shared.budget.name(),
            );
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            Some(response)
        }
    }
}
