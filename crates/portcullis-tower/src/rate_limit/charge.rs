//! The [`Charge`] handle of charging after the response
//! ([`RateLimitLayerBuilder::charge_from_response`](crate::RateLimitLayerBuilder::charge_from_response)):
//! what a handler adds or refunds, the subject a verdict admitted, and the
//! amount owed once the response is ready. The checker records the
//! subject; the step of the response future that charges the store is
//! `post_charge.rs`.

use std::fmt;
use std::sync::{Arc, Mutex};

use super::tier::Tier;

/// What decides a request's cost from its response head.
pub(crate) type ChargeFn = Box<dyn Fn(&http::response::Parts) -> u64 + Send + Sync>;

/// A handle on the cost charged for this request once its response is
/// ready, found in the request's extensions when the layer charges after
/// the response
/// ([`charge_from_response`](crate::RateLimitLayerBuilder::charge_from_response)).
///
/// The amount charged is the response's cost (what the layer's function
/// computes from the response head), replaced by [`Charge::set`] if a
/// handler called it, plus every [`Charge::add`], minus every
/// [`Charge::refund`], and never below 0. It is charged **once**, after the
/// response head is ready and before the response is returned, so the
/// subject's next request sees it. A request the layer denied, or let
/// through without a verdict (a failing store with
/// [`FailurePolicy::FailOpen`](crate::FailurePolicy::FailOpen)), is not charged.
///
/// Clones share one amount (an `Arc` inside), so a handler may hand it to
/// the tasks doing the work.
///
/// ```
/// // Also add: cargo add tower --features util
/// use std::convert::Infallible;
/// use std::net::SocketAddr;
/// use axum::body::Body;
/// use axum::http::{Request, Response, StatusCode};
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{Charge, RateLimitLayer};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 100 "units of work" per minute; the handler knows what it spent.
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_minute(100).name("work").build()?)
///     .charge_from_response(|_parts| 0)
///     .build()?;
/// let service = layer.layer(service_fn(|req: Request<()>| async move {
///     if let Some(charge) = req.extensions().get::<Charge>() {
///         charge.add(150); // more than the whole budget: a debt
///         charge.refund(30);
///     }
///     Ok::<_, Infallible>(Response::new(Body::from("done")))
/// }));
/// let peer: SocketAddr = "192.0.2.1:4711".parse()?;
/// let request = || Request::get("/").extension(peer).body(()).unwrap();
///
/// assert_eq!(service.clone().oneshot(request()).await?.status(), StatusCode::OK);
/// // 120 charged against 100 per minute: denied before the handler runs.
/// let denied = service.oneshot(request()).await?;
/// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Charge {
    inner: Arc<Mutex<Amount>>,
}

#[derive(Debug, Default)]
struct Amount {
    /// Replaces the response's cost when set.
    set: Option<u64>,
    /// Added minus refunded.
    delta: i128,
    /// Who is charged, once a verdict admitted the request.
    subject: Option<Subject>,
}

/// The subject a verdict admitted: its key, tier and store.
#[derive(Debug, Clone)]
pub(super) struct Subject {
    pub(super) key: String,
    pub(super) tier: Arc<Tier>,
    pub(super) fallback: bool,
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let amount = self.lock();
        f.debug_struct("Charge")
            .field("set", &amount.set)
            .field("delta", &amount.delta)
            .field("admitted", &amount.subject.is_some())
            .finish()
    }
}

impl Charge {
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Amount> {
        // A handler that panicked while holding it left a plain number.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `cost` permits to what is charged after the response.
    pub fn add(&self, cost: u64) {
        self.lock().delta += i128::from(cost);
    }

    /// Takes `cost` permits off what is charged after the response (never
    /// below 0 in total: a refund cannot give back permits charged by
    /// earlier requests).
    pub fn refund(&self, cost: u64) {
        self.lock().delta -= i128::from(cost);
    }

    /// Sets what is charged after the response to `cost`, in place of the
    /// response's cost and of earlier adds and refunds (later ones still
    /// count).
    pub fn set(&self, cost: u64) {
        let mut amount = self.lock();
        amount.set = Some(cost);
        amount.delta = 0;
    }

    /// Records the subject a verdict admitted (the checker, before the
    /// inner service is called).
    pub(crate) fn admit(&self, key: &str, tier: &Arc<Tier>, fallback: bool) {
        self.lock().subject = Some(Subject {
            key: key.to_owned(),
            tier: Arc::clone(tier),
            fallback,
        });
    }

    /// The amount to charge, given the response's cost, and to whom; `None`
    /// when the request was not admitted by a verdict or nothing is owed.
    pub(super) fn finish(&self, from_response: u64) -> Option<(Subject, u64)> {
        let mut amount = self.lock();
        let subject = amount.subject.take()?;
        let base = amount.set.unwrap_or(from_response);
        let total = (i128::from(base) + amount.delta).clamp(0, i128::from(u64::MAX));
        let total = u64::try_from(total).unwrap_or(u64::MAX);
        (total > 0).then_some((subject, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_amount_is_set_added_refunded_and_never_negative() {
        let tier = Arc::new(Tier::from_valid_live(
            "default",
            vec![portcullis_core::Policy::per_second(1).build().unwrap()],
            portcullis_core::PolicySource::Default,
            0,
        ));
        let charge = Charge::new();
        assert!(charge.finish(10).is_none(), "not admitted: nothing charged");
        charge.admit("k", &tier, false);
        charge.add(5);
        charge.refund(2);
        let (subject, total) = charge.finish(10).unwrap();
        assert_eq!((subject.key.as_str(), total), ("k", 13));
        assert!(charge.finish(10).is_none(), "charged once");

        let charge = Charge::new();
        charge.admit("k", &tier, false);
        charge.add(100);
        charge.set(7);
        charge.add(1);
        assert_eq!(charge.finish(1_000).unwrap().1, 8);

        let charge = Charge::new();
        charge.admit("k", &tier, false);
        charge.refund(u64::MAX);
        charge.refund(u64::MAX);
        assert!(charge.finish(3).is_none());
        let clone = Charge::new();
        clone.admit("k", &tier, false);
        let shared = clone.clone();
        shared.add(u64::MAX);
        clone.add(u64::MAX);
        drop(shared);
        assert_eq!(clone.finish(u64::MAX).unwrap().1, u64::MAX);
        assert!(format!("{clone:?}").contains("Charge"));
    }
}
