//! The held permit ([`Permit`]): renews its lease while the request runs
//! and releases it when dropped.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use portcullis_core::{ConcurrencyPolicy, LeaseId, LeaseStore};
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

use crate::observe::LeaseMetrics;

type Release = Box<dyn FnOnce() + Send + Sync>;

/// A granted lease, held by the request: renewed every third of the TTL by
/// a task on the tokio runtime, released when dropped (response body sent,
/// errored or dropped; request future dropped or cancelled).
pub(crate) struct Permit {
    release: Option<Release>,
    renewer: Option<AbortHandle>,
    /// The lease gauge and hold time, when a recorder was in force at the
    /// grant; dropped with the permit.
    _metrics: Option<LeaseMetrics>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("held", &self.release.is_some())
            .finish()
    }
}

impl Permit {
    /// Holds `lease` of `subject`: starts its renewal (on the current tokio
    /// runtime, if any) and arranges its release.
    pub(crate) fn hold<St: LeaseStore>(
        store: &Arc<St>,
        subject: Arc<str>,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
        metrics: Option<LeaseMetrics>,
    ) -> Self {
        let renewer = Handle::try_current().ok().map(|handle| {
            let store = Arc::clone(store);
            let subject = Arc::clone(&subject);
            let policy = policy.clone();
            handle
                .spawn(async move { renew_until_lost(&*store, &subject, &policy, lease).await })
                .abort_handle()
        });
        let store = Arc::clone(store);
        let policy = policy.clone();
        let release: Release = Box::new(move || release(&*store, &subject, &policy, lease));
        Self {
            release: Some(release),
            renewer,
            _metrics: metrics,
        }
    }
}

impl Permit {
    /// Releases `lease` when dropped, without renewing it: armed while an
    /// acquire is under way (a cancelled or failed acquire may have been
    /// granted), disarmed by a denial.
    pub(crate) fn release_on_drop<St: LeaseStore>(
        store: &Arc<St>,
        subject: Arc<str>,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> Self {
        let store = Arc::clone(store);
        let policy = policy.clone();
        Self {
            release: Some(Box::new(move || release(&*store, &subject, &policy, lease))),
            renewer: None,
            _metrics: None,
        }
    }

    /// Forgets the lease without releasing it (it was never granted).
    pub(crate) fn disarm(mut self) {
        self.release = None;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Renews the lease every third of its TTL until it is lost (the task is
/// aborted when the permit is released).
async fn renew_until_lost<St: LeaseStore>(
    store: &St,
    subject: &str,
    policy: &ConcurrencyPolicy,
    lease: LeaseId,
) {
    let every = policy.lease_ttl() / 3;
    loop {
        tokio::time::sleep(every).await;
        match store.renew(subject, policy, lease).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!(
                    policy = policy.name(),
                    "a concurrency lease expired while its request was still running (renewals were late or failed): the subject may briefly have more than max_in_flight requests in flight; raise the lease TTL"
                );
                return;
            }
            Err(error) => {
                tracing::warn!(policy = policy.name(), error = crate::observe::chain(&error), "renewing a concurrency lease failed; trying again at the next third of its TTL");
            }
        }
    }
}

/// Releases `lease`: at once where the store can (`release_now`: the
/// memory store, with no future to box), else its release future is polled
/// once here and the rest spawned on the tokio runtime. Without a runtime,
/// a store that needs one cannot release: the lease then expires at the end
/// of its TTL.
fn release<St: LeaseStore>(store: &St, subject: &str, policy: &ConcurrencyPolicy, lease: LeaseId) {
    if let Some(result) = store.release_now(subject, policy, lease) {
        log_release(result);
        return;
    }
    let Ok(handle) = Handle::try_current() else {
        // Dropping the future: the memory store released at the call; a
        // network store's lease expires with its TTL.
        drop(store.release(subject, policy, lease));
        tracing::debug!("a concurrency permit was dropped outside a tokio runtime; a network store's lease expires with its TTL");
        return;
    };
    let mut future = Box::pin(store.release(subject, policy, lease));
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(result) => log_release(result),
        Poll::Pending => {
            handle.spawn(async move { log_release(future.await) });
        }
    }
}

fn log_release(result: Result<bool, portcullis_core::StoreError>) {
    if let Err(error) = result {
        tracing::warn!(
            error = crate::observe::chain(&error),
            "releasing a concurrency lease failed; it expires at the end of its TTL"
        );
    }
}
