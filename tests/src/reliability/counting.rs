//! A [`Store`] wrapper that counts and logs every call: how many reached the
//! real store, what each answered, and when.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use portcullis_core::{Policy, Store, StoreError, Verdict};

/// What one store call ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The store admitted (and charged) the request.
    Allowed,
    /// The store denied the request.
    Denied,
    /// The store returned an error of this kind.
    Failed(FailureKind),
    /// The caller dropped the call before it finished (for example the
    /// layer's own check timeout fired first).
    Cancelled,
}

impl Outcome {
    /// What a finished call ended with.
    #[must_use]
    pub fn of(result: &Result<Verdict, StoreError>) -> Self {
        match result {
            Ok(verdict) if verdict.is_allowed() => Self::Allowed,
            Ok(_) => Self::Denied,
            Err(error) => Self::Failed(FailureKind::of(error)),
        }
    }

    /// A short name for tables (a failure is named by its kind).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Failed(kind) => kind.as_str(),
            Self::Cancelled => "cancelled",
        }
    }
}

/// The kind of a store error, as the reliability table reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// [`StoreError::Timeout`]: sent, no answer within the configured bound.
    Timeout,
    /// [`StoreError::Unavailable`]: refused or unreachable; nothing charged.
    Unavailable,
    /// [`StoreError::OutcomeUnknown`]: the connection broke mid-call.
    OutcomeUnknown,
    /// [`StoreError::Protocol`] or [`StoreError::Rejected`]: an unexpected
    /// reply, or an error Redis answered.
    Protocol,
    /// [`StoreError::Full`] or a request error (cost, policies).
    Other,
}

impl FailureKind {
    /// Classifies a store error.
    #[must_use]
    pub fn of(error: &StoreError) -> Self {
        match error {
            StoreError::Timeout { .. } => Self::Timeout,
            StoreError::Unavailable { .. } => Self::Unavailable,
            StoreError::OutcomeUnknown { .. } => Self::OutcomeUnknown,
            StoreError::Protocol { .. } | StoreError::Rejected { .. } => Self::Protocol,
            _ => Self::Other,
        }
    }

    /// A short name for tables.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
            Self::OutcomeUnknown => "unknown",
            Self::Protocol => "protocol",
            Self::Other => "other",
        }
    }

    /// Whether the call may have been applied by the store (so a later
    /// count may include it).
    #[must_use]
    pub fn may_have_run(self) -> bool {
        matches!(self, Self::Timeout | Self::OutcomeUnknown)
    }
}

/// One store call.
#[derive(Debug, Clone)]
pub struct CallRecord {
    /// The subject checked.
    pub subject: String,
    /// When the call was made.
    pub sent: Instant,
    /// When it finished (or was dropped).
    pub done: Instant,
    /// What it ended with.
    pub outcome: Outcome,
}

/// Counters and the call log of a [`CountingStore`].
#[derive(Debug, Default)]
pub struct StoreStats {
    calls: AtomicU64,
    log: Mutex<Vec<CallRecord>>,
}

impl StoreStats {
    /// Calls made so far (finished or not).
    #[must_use]
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// A copy of the log of finished calls, in the order they finished.
    ///
    /// # Panics
    ///
    /// When a thread panicked while holding the log's lock.
    #[must_use]
    pub fn log(&self) -> Vec<CallRecord> {
        self.log
            .lock()
            .expect("the call log's lock is never poisoned")
            .clone()
    }

    fn record(&self, record: CallRecord) {
        if let Ok(mut log) = self.log.lock() {
            log.push(record);
        }
    }
}

/// Wraps a [`Store`], counting and logging every call that reaches it.
/// Cheap to clone; clones share the counters.
///
/// Used to measure how many requests reach Redis (deny cache, circuit
/// breaker) and to check decisions against the store's own answers.
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: Arc<S>,
    stats: Arc<StoreStats>,
}

impl<S> Clone for CountingStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            stats: Arc::clone(&self.stats),
        }
    }
}

impl<S: Store> CountingStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            stats: Arc::default(),
        }
    }

    /// The counters (shared with clones).
    #[must_use]
    pub fn stats(&self) -> Arc<StoreStats> {
        Arc::clone(&self.stats)
    }

    /// The wrapped store.
    #[must_use]
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

/// Records the call when dropped: finished with an outcome, or cancelled.
struct Pending {
    stats: Arc<StoreStats>,
    subject: String,
    sent: Instant,
    outcome: Outcome,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.stats.record(CallRecord {
            subject: std::mem::take(&mut self.subject),
            sent: self.sent,
            done: Instant::now(),
            outcome: self.outcome,
        });
    }
}

impl<S: Store> Store for CountingStore<S> {
    type CheckFuture = Pin<Box<dyn Future<Output = Result<Verdict, StoreError>> + Send + 'static>>;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let mut pending = Pending {
            stats: Arc::clone(&self.stats),
            subject: subject.to_owned(),
            sent: Instant::now(),
            outcome: Outcome::Cancelled,
        };
        let check = self.inner.check(subject, policies, cost);
        Box::pin(async move {
            let result = check.await;
            pending.outcome = Outcome::of(&result);
            drop(pending);
            result
        })
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.inner.reset(subject, policies)
    }
}
