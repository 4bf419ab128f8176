//! Load through the tower layer or straight at a store, and the checks that
//! turn the answers into "wrong decisions".

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderName, Request, Response, StatusCode};
use portcullis_core::Store;
use portcullis_tower::Header;
use tokio::task::JoinHandle;
use tower::{service_fn, Service, ServiceExt};

use super::counting::{CallRecord, Outcome};

/// The request header the scenarios key on.
pub const SUBJECT_HEADER: &str = "x-subject";

/// A key extractor reading [`SUBJECT_HEADER`].
#[must_use]
pub fn subject_key() -> Header {
    Header::new(HeaderName::from_static(SUBJECT_HEADER))
}

/// How a request through the layer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reply {
    /// Forwarded with a decision (the store or the fallback admitted it).
    Admitted,
    /// Forwarded without a decision (fail-open, or not limited).
    Passed,
    /// `429 Too Many Requests`.
    Limited,
    /// `503 Service Unavailable` (fail-closed).
    Closed,
    /// Any other status: never expected.
    Other(u16),
    /// No answer within the hang bound: never expected.
    Hung,
}

/// One request through the layer.
#[derive(Debug, Clone)]
pub struct ReplyRecord {
    /// The subject (the `x-subject` header).
    pub subject: String,
    /// When it was sent.
    pub sent: Instant,
    /// When the answer came.
    pub done: Instant,
    /// The answer.
    pub reply: Reply,
}

/// Replies counted by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplyCounts {
    /// [`Reply::Admitted`].
    pub admitted: u64,
    /// [`Reply::Passed`].
    pub passed: u64,
    /// [`Reply::Limited`].
    pub limited: u64,
    /// [`Reply::Closed`].
    pub closed: u64,
    /// [`Reply::Other`].
    pub other: u64,
    /// [`Reply::Hung`].
    pub hung: u64,
}

impl ReplyCounts {
    /// Counts `replies`.
    pub fn of(replies: impl IntoIterator<Item = Reply>) -> Self {
        let mut counts = Self::default();
        for reply in replies {
            match reply {
                Reply::Admitted => counts.admitted += 1,
                Reply::Passed => counts.passed += 1,
                Reply::Limited => counts.limited += 1,
                Reply::Closed => counts.closed += 1,
                Reply::Other(_) => counts.other += 1,
                Reply::Hung => counts.hung += 1,
            }
        }
        counts
    }

    /// All replies.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.admitted + self.passed + self.limited + self.closed + self.other + self.hung
    }
}

/// The inner service of the scenarios: answers `200` with an empty body.
pub fn probe_service(
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + 'static {
    service_fn(
        |_request: Request<()>| async move { Ok::<_, Infallible>(Response::new(String::new())) },
    )
}

/// Classifies a response of a layer (with the default header mode) over
/// [`probe_service`]: a forwarded response carries the `RateLimit` field
/// when the store or the fallback decided, and none when the layer let it
/// through undecided (fail-open).
#[must_use]
pub fn classify<B>(response: &Response<B>) -> Reply {
    match response.status() {
        StatusCode::OK => {
            if response.headers().contains_key("ratelimit") {
                Reply::Admitted
            } else {
                Reply::Passed
            }
        }
        StatusCode::TOO_MANY_REQUESTS => Reply::Limited,
        StatusCode::SERVICE_UNAVAILABLE => Reply::Closed,
        other => Reply::Other(other.as_u16()),
    }
}

/// Sends `request` through `service`; [`Reply::Hung`] after `hang`.
pub async fn send<S, B>(service: &S, request: Request<()>, hang: Duration) -> Reply
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
{
    match tokio::time::timeout(hang, service.clone().oneshot(request)).await {
        Err(_) => Reply::Hung,
        Ok(Ok(response)) => classify(&response),
        Ok(Err(never)) => match never {},
    }
}

/// A request for `subject` (in the [`SUBJECT_HEADER`]).
///
/// # Panics
///
/// When `subject` is not a valid header value.
#[must_use]
pub fn request_for(subject: &str) -> Request<()> {
    Request::get("/")
        .header(SUBJECT_HEADER, subject)
        .body(())
        .expect("scenario subjects are valid header values")
}

/// Who the load generator asks for: fresh subjects every `slot`, so each
/// subject lives in one short span of time.
#[derive(Debug, Clone)]
pub struct Load {
    /// Concurrent senders.
    pub tasks: usize,
    /// Pause of each sender between two requests.
    pub pace: Duration,
    /// How long one set of subjects is used.
    pub slot: Duration,
    /// Subjects per slot.
    pub per_slot: usize,
    /// Subject name prefix.
    pub prefix: String,
    /// A request without an answer after this long counts as hung.
    pub hang: Duration,
}

impl Load {
    fn subject(&self, tag: &str, start: Instant, task: usize, n: usize) -> String {
        let slot = start.elapsed().as_nanos() / self.slot.as_nanos().max(1);
        let index = (task + n * self.tasks) % self.per_slot.max(1);
        format!("{}-{tag}-{slot}-{index}", self.prefix)
    }
}

/// A running load; [`Running::stop`] ends it and returns what it saw.
#[derive(Debug)]
pub struct Running<T> {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Vec<T>>>,
}

impl<T> Running<T> {
    /// Stops the senders and collects their records.
    ///
    /// # Panics
    ///
    /// When a sender panicked.
    pub async fn stop(self) -> Vec<T> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(task.await.expect("a load task panicked"));
        }
        all
    }
}

/// Starts `load` through `service` (a layer over [`probe_service`]).
pub fn start_layer_load<S, B>(service: &S, load: &Load) -> Running<ReplyRecord>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tag: Arc<str> = crate::unique_prefix("load").into();
    let tasks = (0..load.tasks)
        .map(|task| {
            let service = service.clone();
            let tag = Arc::clone(&tag);
            let stop = Arc::clone(&stop);
            let load = load.clone();
            tokio::spawn(async move {
                let mut records = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let subject = load.subject(&tag, start, task, n);
                    n += 1;
                    let sent = Instant::now();
                    let reply = send(&service, request_for(&subject), load.hang).await;
                    records.push(ReplyRecord {
                        subject,
                        sent,
                        done: Instant::now(),
                        reply,
                    });
                    tokio::time::sleep(load.pace).await;
                }
                records
            })
        })
        .collect();
    Running { stop, tasks }
}

/// One store call of a store-level load.
#[derive(Debug, Clone)]
pub struct StoreCall {
    /// The subject.
    pub subject: String,
    /// When it was sent.
    pub sent: Instant,
    /// `None` when it hung (no answer within the hang bound).
    pub outcome: Option<Outcome>,
    /// The error message of a failed call.
    pub error: Option<String>,
}

/// Starts `load` straight at `store` (no layer), checking `policies` with
/// cost 1; subjects come from `subject(task, n)` when given, else from the
/// load's slots.
pub fn start_store_load<St, F>(
    store: &Arc<St>,
    policies: &Arc<[portcullis_core::Policy]>,
    load: &Load,
    subject: Option<&F>,
) -> Running<StoreCall>
where
    St: Store,
    F: Fn(usize, usize) -> String + Clone + Send + Sync + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tag: Arc<str> = crate::unique_prefix("load").into();
    let tasks = (0..load.tasks)
        .map(|task| {
            let store = Arc::clone(store);
            let tag = Arc::clone(&tag);
            let policies = Arc::clone(policies);
            let stop = Arc::clone(&stop);
            let load = load.clone();
            let subject_fn = subject.cloned();
            tokio::spawn(async move {
                let mut records = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let subject = match &subject_fn {
                        Some(f) => f(task, n),
                        None => load.subject(&tag, start, task, n),
                    };
                    n += 1;
                    let sent = Instant::now();
                    let result =
                        tokio::time::timeout(load.hang, store.check(&subject, &policies, 1)).await;
                    let (outcome, error) = match result {
                        Err(_) => (None, None),
                        Ok(result) => (
                            Some(Outcome::of(&result)),
                            result.err().map(|error| error.to_string()),
                        ),
                    };
                    records.push(StoreCall {
                        subject,
                        sent,
                        outcome,
                        error,
                    });
                    tokio::time::sleep(load.pace).await;
                }
                records
            })
        })
        .collect();
    Running { stop, tasks }
}

/// Over- and under-admission found by [`judge_admission`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admission {
    /// Permits admitted beyond what the policy allows.
    pub overshoot: u64,
    /// Subjects denied although fewer than their limit had been admitted
    /// (counting calls that may have run).
    pub undershoot: u64,
}

impl Admission {
    /// Both, as one count of wrong decisions.
    #[must_use]
    pub fn wrong(&self) -> u64 {
        self.overshoot + self.undershoot
    }
}

/// Checks a store's answers against a policy that admits `allowance`
/// permits per subject over the run (for GCRA, burst plus the refill over
/// the run): per subject and epoch (calls sent after the `n`-th instant of
/// `epochs` belong to epoch `n`, for servers that lost their state),
/// admitted ≤ allowance, and a denial only once admitted plus calls that
/// may have run reach the burst `limit`.
#[must_use]
pub fn judge_admission(
    log: &[CallRecord],
    limit: u64,
    allowance: u64,
    epochs: &[Instant],
) -> Admission {
    #[derive(Default)]
    struct Tally {
        allowed: u64,
        denied: u64,
        maybe: u64,
    }
    let mut tallies: HashMap<(&str, usize), Tally> = HashMap::new();
    for record in log {
        let epoch = epochs.iter().filter(|e| **e <= record.sent).count();
        let tally = tallies.entry((record.subject.as_str(), epoch)).or_default();
        match record.outcome {
            Outcome::Allowed => tally.allowed += 1,
            Outcome::Denied => tally.denied += 1,
            Outcome::Failed(kind) if kind.may_have_run() => tally.maybe += 1,
            Outcome::Cancelled => tally.maybe += 1,
            Outcome::Failed(_) => {}
        }
    }
    let mut admission = Admission::default();
    for tally in tallies.values() {
        admission.overshoot += tally.allowed.saturating_sub(allowance);
        if tally.denied > 0 && tally.allowed + tally.maybe < limit {
            admission.undershoot += 1;
        }
    }
    admission
}

/// The same check for store-level loads.
#[must_use]
pub fn judge_calls(calls: &[StoreCall], limit: u64, allowance: u64) -> Admission {
    let log: Vec<CallRecord> = calls
        .iter()
        .filter_map(|c| {
            Some(CallRecord {
                subject: c.subject.clone(),
                sent: c.sent,
                done: c.sent,
                outcome: c.outcome?,
            })
        })
        .collect();
    judge_admission(&log, limit, allowance, &[])
}

/// GCRA allowance of a policy of `limit` per `period` (burst = limit) over
/// `elapsed`: the burst plus every permit refilled meanwhile.
#[must_use]
pub fn gcra_allowance(limit: u64, period: Duration, elapsed: Duration) -> u64 {
    let refill = u128::from(limit) * elapsed.as_micros() / period.as_micros().max(1);
    limit + u64::try_from(refill).unwrap_or(u64::MAX)
}

/// Percentile (0..=100) of `values`, sorted in place; zero when empty.
pub fn percentile(values: &mut [Duration], pct: usize) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let index = (values.len() - 1) * pct.min(100) / 100;
    values[index]
}

/// Runs `future`, failing with `what` when it takes longer than `bound`
/// (a hang detector, not a performance check).
///
/// # Panics
///
/// When `future` hangs.
pub async fn no_hang<T>(bound: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(bound, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} hung for more than {bound:?}"),
    }
}
