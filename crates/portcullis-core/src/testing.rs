//! The test kit's store side (feature `testing`): [`FaultStore`], a store
//! wrapper that fails, times out or stalls when a test tells it to. The
//! kit's clock is [`ManualClock`](crate::ManualClock); its header reader is
//! in `portcullis-tower`; the facade gathers all three in
//! `portcullis::testing`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{CheckOptions, Checked, Policy, Store, StoreError, Verdict};

/// What a [`FaultStore`] does with the calls it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Every call goes to the wrapped store (the default).
    #[default]
    Pass,
    /// Every call fails at once with [`StoreError::Unavailable`]: the store
    /// is down and nothing was charged (a refused connection).
    Unavailable,
    /// Every call fails at once with [`StoreError::Timeout`] (after
    /// [`Fault::TIMEOUT_AFTER`]), as a store does when its own per-call
    /// timeout ends the wait.
    Timeout,
    /// Every call fails at once with [`StoreError::OutcomeUnknown`]: the
    /// connection broke after the call may have been applied.
    OutcomeUnknown,
    /// No call ever answers: the caller's own timeout (the layer's
    /// `check_timeout`) must end the wait. Calls already waiting keep waiting after the fault is lifted.
    Stall,
}

impl Fault {
    /// The `after` of the [`StoreError::Timeout`] that [`Fault::Timeout`]
    /// answers (a `RedisStore`'s default per-call timeout).
    pub const TIMEOUT_AFTER: Duration = Duration::from_millis(250);

    fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Unavailable,
            2 => Self::Timeout,
            3 => Self::OutcomeUnknown,
            4 => Self::Stall,
            _ => Self::Pass,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Self::Pass => 0,
            Self::Unavailable => 1,
            Self::Timeout => 2,
            Self::OutcomeUnknown => 3,
            Self::Stall => 4,
        }
    }

    /// The error a failing call answers, or `None` for [`Fault::Pass`] and
    /// [`Fault::Stall`].
    fn error(self) -> Option<StoreError> {
        const WHY: &str = "injected by FaultStore";
        match self {
            Self::Pass | Self::Stall => None,
            Self::Unavailable => Some(StoreError::unavailable(WHY)),
            Self::Timeout => Some(StoreError::Timeout {
                after: Self::TIMEOUT_AFTER,
            }),
            Self::OutcomeUnknown => Some(StoreError::OutcomeUnknown { source: WHY.into() }),
        }
    }
}

/// A store that fails, times out or stalls on command, in front of a real
/// one: for testing what an app does when its store is down (fail open or
/// closed, a fallback store, the circuit breaker).
///
/// Clones share one switch, so a test keeps a clone after handing the store
/// to a layer and changes the [`Fault`] while requests run. Every call
/// counts in [`calls`](Self::calls), faulted or not.
///
/// [`new`](Self::new) answers at once where the wrapped store does (as a
/// [`MemoryStore`](crate::MemoryStore) does, through
/// [`Store::check_now`]); [`remote`](Self::remote) answers only through
/// futures, as a store across a network does, so a layer in front of it
/// behaves as in front of Redis: it times its checks and holds denials in
/// its deny cache.
///
/// ```
/// use portcullis::{MemoryStore, Policy, Store};
/// use portcullis::testing::{Fault, FaultStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = FaultStore::new(MemoryStore::new());
/// let policies = [Policy::per_minute(10).build()?];
/// assert!(store.check("acme", &policies, 1).await?.is_allowed());
///
/// store.set(Fault::Unavailable);
/// let error = store.check("acme", &policies, 1).await.unwrap_err();
/// assert!(error.is_store_wide());
///
/// store.set(Fault::Pass);
/// assert!(store.check("acme", &policies, 1).await?.is_allowed());
/// assert_eq!(store.calls(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct FaultStore<S> {
    inner: Arc<S>,
    state: Arc<State>,
    /// Whether `check_now` may answer (else every call is a future).
    at_once: bool,
}

#[derive(Debug, Default)]
struct State {
    fault: AtomicU8,
    calls: AtomicU64,
}

impl<S> Clone for FaultStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            state: Arc::clone(&self.state),
            at_once: self.at_once,
        }
    }
}

impl<S> fmt::Debug for FaultStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultStore")
            .field("fault", &self.fault())
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl<S> FaultStore<S> {
    /// Wraps `inner`, passing every call to it until told otherwise.
    #[must_use]
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            state: Arc::default(),
            at_once: true,
        }
    }

    /// Wraps `inner` as [`new`](Self::new) does, but answers every call
    /// through its future, never at once: what a layer sees of a store
    /// across a network.
    #[must_use]
    pub fn remote(inner: S) -> Self {
        Self {
            at_once: false,
            ..Self::new(inner)
        }
    }

    /// Applies `fault` to every call from now on (on every clone).
    pub fn set(&self, fault: Fault) {
        self.state.fault.store(fault.as_u8(), Ordering::SeqCst);
    }

    /// The fault in force.
    #[must_use]
    pub fn fault(&self) -> Fault {
        Fault::from_u8(self.state.fault.load(Ordering::SeqCst))
    }

    /// How many calls this store (and its clones) were given.
    #[must_use]
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::SeqCst)
    }

    /// The wrapped store.
    #[must_use]
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Counts a call and answers the fault in force.
    fn enter(&self) -> Fault {
        self.state.calls.fetch_add(1, Ordering::SeqCst);
        self.fault()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// The answer of a faulted call: its error at once, or never.
fn faulted<T: Send + 'static>(fault: Fault) -> BoxFuture<T> {
    match fault.error() {
        Some(error) => Box::pin(std::future::ready(Err(error))),
        None => Box::pin(std::future::pending()),
    }
}

impl<S: Store> Store for FaultStore<S> {
    type CheckFuture = BoxFuture<Verdict>;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        match self.enter() {
            Fault::Pass => Box::pin(self.inner.check(subject, policies, cost)),
            fault => faulted(fault),
        }
    }

    fn check_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        // A stalled call must go through `check` (whose future never ends);
        // a failing one answers here, so that a synchronous inner store
        // stays synchronous to the caller. Counted once: by whichever of
        // this and `check` runs it.
        if !self.at_once {
            return None;
        }
        match self.fault() {
            Fault::Pass => {
                let answer = self.inner.check_now(subject, policies, cost);
                if answer.is_some() {
                    self.state.calls.fetch_add(1, Ordering::SeqCst);
                }
                answer
            }
            Fault::Stall => None,
            fault => {
                self.state.calls.fetch_add(1, Ordering::SeqCst);
                fault.error().map(Err)
            }
        }
    }

    fn charge(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send + 'static {
        match self.enter() {
            Fault::Pass => Box::pin(self.inner.charge(subject, policies, cost)),
            fault => faulted(fault),
        }
    }

    fn check_with(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &CheckOptions,
    ) -> impl Future<Output = Result<Checked, StoreError>> + Send + 'static {
        match self.enter() {
            Fault::Pass => Box::pin(self.inner.check_with(subject, policies, cost, options)),
            fault => faulted(fault),
        }
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        match self.enter() {
            Fault::Pass => Box::pin(self.inner.reset(subject, policies)),
            fault => faulted(fault),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use std::task::{Context, Poll, Waker};

    #[test]
    fn each_fault_answers_its_error_and_pass_charges_the_inner_store() {
        let store = FaultStore::new(MemoryStore::new());
        let policies = [Policy::per_minute(2).build().unwrap()];
        for (fault, kind) in [
            (Fault::Unavailable, "unavailable"),
            (Fault::Timeout, "timeout"),
            (Fault::OutcomeUnknown, "outcome"),
        ] {
            store.set(fault);
            let error = store.check_now("a", &policies, 1).unwrap().unwrap_err();
            let matches = match error {
                StoreError::Unavailable { .. } => kind == "unavailable",
                StoreError::Timeout { after } => kind == "timeout" && after == Fault::TIMEOUT_AFTER,
                StoreError::OutcomeUnknown { .. } => kind == "outcome",
                _ => false,
            };
            assert!(matches, "{fault:?} answered {error:?}");
        }
        // Nothing was charged while faulted: both permits remain.
        store.set(Fault::Pass);
        assert!(store
            .check_now("a", &policies, 1)
            .unwrap()
            .unwrap()
            .is_allowed());
        assert!(store
            .check_now("a", &policies, 1)
            .unwrap()
            .unwrap()
            .is_allowed());
        assert!(!store
            .check_now("a", &policies, 1)
            .unwrap()
            .unwrap()
            .is_allowed());
        assert_eq!(store.calls(), 6);
    }

    #[test]
    fn a_remote_store_answers_only_through_futures() {
        let store = FaultStore::remote(MemoryStore::new());
        let policies = [Policy::per_minute(1).build().unwrap()];
        assert!(store.check_now("a", &policies, 1).is_none());
        store.set(Fault::Unavailable);
        assert!(store.check_now("a", &policies, 1).is_none());
        assert_eq!(store.calls(), 0, "nothing was asked");
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            store.check("a", &policies, 1).as_mut().poll(&mut cx),
            Poll::Ready(Err(StoreError::Unavailable { .. }))
        ));
        assert_eq!(store.calls(), 1);
    }

    #[test]
    fn a_stalled_check_never_answers() {
        let store = FaultStore::new(MemoryStore::new());
        let clone = store.clone();
        clone.set(Fault::Stall);
        let policies = [Policy::per_minute(2).build().unwrap()];
        assert!(store.check_now("a", &policies, 1).is_none());
        let mut future = store.check("a", &policies, 1);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..3 {
            assert!(future.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(store.calls(), 1);
        // Still pending after the fault is lifted, as documented.
        store.set(Fault::Pass);
        assert!(future.as_mut().poll(&mut cx).is_pending());
        assert!(matches!(
            Box::pin(store.check("a", &policies, 1))
                .as_mut()
                .poll(&mut cx),
            Poll::Ready(Ok(_))
        ));
    }
}
