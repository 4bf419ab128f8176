//! What the steps of a request pass along: its [`Ticket`] (key, tier,
//! cost, clock readings, span, options), the [`Next`] step the service or
//! future takes, and what to do after a wait ([`Then`]).

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use portcullis_core::{BoxCheckFuture, Store, StoreError, Verdict};
use tokio::time::Instant;

use crate::headers::RateLimitHeaders;
use crate::key::KeyBuf;
use crate::rate_limit::options::RequestOptions;
use crate::rate_limit::resolve::Lookup;
use crate::rate_limit::tier::Tier;

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
    /// The request's idempotency key and class (`rate_limit/options.rs`), if any.
    pub(crate) options: Option<Box<RequestOptions>>,
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
