//! Batches across subjects ([`Lane`]): a store sends at most [`IN_FLIGHT`]
//! calls of checks at a time; a check that finds them all in flight waits,
//! and the checks that waited go together in one call, whatever their
//! subjects and policies, in arrival order: `FCALL` of the library's
//! `mixed` (mixed.lua), each check run as the function it would have been
//! sent to alone, or on the `EVALSHA` path one `EVALSHA` of the script of such
//! batches (mixed_script.lua), each decided as the check script composed
//! for its policy set would alone. Consecutive checks sent to the same
//! function (or plan) with the same counts go as one run that names it
//! once (lua/batch_each.lua): a batch of one policy set sends each check's
//! arguments and nothing more. So under load a store makes about
//! `IN_FLIGHT` calls per round trip instead of one per check, and a check
//! that finds a call free is sent at once: nothing waits for a batch to
//! fill.
//!
//! Standalone servers and Sentinel only: a Cluster refuses keys of
//! several slots in one call, and subjects spread over 16 384 slots, so
//! there every check goes alone (checks of one subject still coalesce).
//!
//! Waiting follows the same rules as a coalesced check (`wait.rs`): a
//! waiting check is either taken into a batch and answered by it, or
//! withdraws before (never sent, never charged); a check whose request was
//! dropped before its batch was taken is left out. It waits for the first
//! call in flight to end (and one batch per [`MAX_BATCH`] checks queued
//! before it); a call that fails store-wide (a timeout, a server gone)
//! fails the checks waiting at once, unsent, rather than sending them into
//! the same failure, and for [`UNHEALTHY`] after a store-wide failure
//! every check goes alone, as without a lane (so a check made after the
//! server is back never inherits the failure of a call made before, and no
//! check waits for a failing call and then its own). Checks queue in
//! arrival order: while any wait, a new check queues behind them rather
//! than taking a place that frees.
//!
//! The places are two atomic counters and the queue a mutex taken only when
//! every place is busy, so a check that goes at once takes no lock. A check
//! that queues counts itself (`queued`) before trying a place once more,
//! and a call that ends frees its place before looking at `queued`; both in
//! sequentially consistent order, so one of the two always sees the other
//! and a queued check is never left behind.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use portcullis_core::StoreError;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::oneshot;

use super::wait::{Waiting, TAKEN, WAITING};
use super::{share, Reply, Shared, MAX_BATCH};
use crate::call::reply::{out_of_memory, protocol};
use crate::call::{Call, Caller};
use crate::errors::RedisCause;
use crate::scripts::LuaScript;

/// Calls of checks a store has in flight before checks wait for a batch.
pub(crate) const IN_FLIGHT: usize = 2;

/// How long after a store-wide failure every check goes alone.
pub(crate) const UNHEALTHY: Duration = Duration::from_secs(1);

/// Milliseconds of a monotonic clock (since its first reading).
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A check waiting for a batch across subjects.
struct Queued {
    call: Call,
    reply: oneshot::Sender<Reply>,
    state: Arc<AtomicU8>,
}

/// A store's calls of checks in flight, and the checks waiting for them.
#[derive(Default)]
pub(crate) struct Lane {
    in_flight: AtomicUsize,
    queued: AtomicUsize,
    queue: Mutex<VecDeque<Queued>>,
    /// Until when (ms of [`now_ms`]) checks go alone: [`UNHEALTHY`] after
    /// the last store-wide failure.
    alone_until: AtomicU64,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish()
    }
}

/// What a check does: go now (holding a place until its call ends, or
/// alone, outside any lane), or wait for a batch.
pub(crate) enum Entry {
    Alone(Call),
    Go(InFlight, Call),
    Wait(Waiting),
}

/// A place among the calls in flight, held by a call sent alone: dropping it frees the
/// place and sends the checks that queued meanwhile.
pub(crate) struct InFlight {
    lane: Arc<Lane>,
    caller: Arc<Caller>,
    /// The store-wide error the call met, if it did.
    failed: Option<StoreError>,
}

impl InFlight {
    /// The call ended with `error`: when store-wide, the checks waiting
    /// fail with it at once, unsent.
    pub(crate) fn failed(&mut self, error: &StoreError) {
        if error.is_store_wide() {
            self.lane.failed(error);
            self.failed = Some(unsent(error));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.lane.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(error) = self.failed.take() {
            self.lane.fail_queued(&error);
        }
        self.lane.send_queued(&self.caller);
    }
}

/// The error of checks failed unsent because a call before them failed
/// store-wide with `error`.
fn unsent(error: &StoreError) -> StoreError {
    StoreError::Unavailable {
        source: Box::new(Shared::unsent(error)),
    }
}

impl Lane {
    /// A call ended with `error`: when store-wide, checks go alone for
    /// [`UNHEALTHY`].
    pub(crate) fn failed(&self, error: &StoreError) {
        if error.is_store_wide() {
            let until = now_ms().saturating_add(UNHEALTHY.as_millis() as u64);
            self.alone_until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Takes a free place, if there is one.
    fn try_place(&self) -> bool {
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < IN_FLIGHT).then_some(n + 1)
            })
            .is_ok()
    }

    /// The check of `call` goes now, or waits for a batch. Outside a tokio
    /// runtime (nothing to send a batch on) it goes now, without a place.
    pub(crate) fn enter(self: &Arc<Self>, caller: &Arc<Caller>, call: Call) -> Entry {
        let in_flight = || InFlight {
            lane: Arc::clone(self),
            caller: Arc::clone(caller),
            failed: None,
        };
        // The clock is read only after a failure.
        let alone_until = self.alone_until.load(Ordering::Relaxed);
        if alone_until != 0 && now_ms() < alone_until {
            return Entry::Alone(call);
        }
        // In arrival order: while checks wait, a new one waits behind them.
        if self.queued.load(Ordering::SeqCst) == 0 && self.try_place() {
            return Entry::Go(in_flight(), call);
        }
        if tokio::runtime::Handle::try_current().is_err() {
            // Counted, so that its end sends what queued meanwhile.
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            return Entry::Go(in_flight(), call);
        }
        let (reply, answer) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(WAITING));
        let ahead = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push_back(Queued {
                call,
                reply,
                state: Arc::clone(&state),
            });
            queue.len() - 1
        };
        self.queued.fetch_add(1, Ordering::SeqCst);
        // A place freed while this check queued: nobody else may look.
        self.send_queued(caller);
        // The first call in flight to end, and a batch per MAX_BATCH
        // queued before.
        Entry::Wait(Waiting::new(answer, state, 1 + ahead / MAX_BATCH))
    }

    /// When checks wait and a place is free, takes it and sends them, batch
    /// after batch, on a task of the runtime.
    fn send_queued(self: &Arc<Self>, caller: &Arc<Caller>) {
        if self.queued.load(Ordering::SeqCst) == 0 || !self.try_place() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(drain(Arc::clone(self), Arc::clone(caller)));
            }
            // Unreachable (checks queue only on a runtime, and their calls
            // end on it): free the place; the next call's end sends them.
            Err(_) => {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Fails every check waiting with `error`, unsent (those a batch took
    /// already are answered by it).
    fn fail_queued(&self, error: &StoreError) {
        loop {
            let batch = self.next_batch();
            if batch.is_empty() {
                return;
            }
            for queued in batch {
                let _ = queued.reply.send(Err(share(error)));
            }
        }
    }

    /// The next batch: up to [`MAX_BATCH`] waiting checks, marked taken;
    /// dropped and withdrawn ones are left out (never sent).
    fn next_batch(&self) -> Vec<Queued> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let mut batch = Vec::with_capacity(queue.len().min(MAX_BATCH));
        let mut popped = 0;
        while batch.len() < MAX_BATCH {
            let Some(queued) = queue.pop_front() else {
                break;
            };
            popped += 1;
            if queued.reply.is_closed() {
                continue;
            }
            if queued
                .state
                .compare_exchange(WAITING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                batch.push(queued);
            }
        }
        self.queued.fetch_sub(popped, Ordering::SeqCst);
        batch
    }
}

/// Holding a place: sends the waiting checks, batch after batch, then frees
/// the place (and looks once more, as a call's end does).
async fn drain(lane: Arc<Lane>, caller: Arc<Caller>) {
    loop {
        let batch = lane.next_batch();
        if batch.is_empty() {
            lane.in_flight.fetch_sub(1, Ordering::SeqCst);
            lane.send_queued(&caller);
            return;
        }
        if let Some(error) = send(&caller, batch).await {
            lane.failed(&error);
            lane.fail_queued(&unsent(&error));
        }
    }
}

/// Sends one batch and answers each of its checks; returns the error of
/// a call that failed store-wide.
async fn send(caller: &Caller, batch: Vec<Queued>) -> Option<StoreError> {
    if let [_] = batch.as_slice() {
        let mut failed = None;
        for queued in batch {
            let verdict = queued.call.verdict(caller).await;
            if let Err(error) = &verdict {
                failed = error.is_store_wide().then(|| share(error));
            }
            let _ = queued.reply.send(verdict);
        }
        return failed;
    }
    if !batch.iter().all(|queued| queued.call.is_function()) {
        return send_script(caller, batch).await;
    }
    let mixed = caller.scripts.library().mixed_function();
    let cmd = match command(mixed.sha(), &batch) {
        Ok(cmd) => cmd,
        Err(error) => return fail(batch, error),
    };
    let first_key = batch[0].call.first_key().to_owned();
    match caller.run(mixed, &cmd, &first_key).await {
        Ok(value) => {
            answer(batch, value);
            None
        }
        // Redis refused Functions (nothing ran): each check alone, which
        // sends it on the EVALSHA path the store takes from now on.
        Err(error) if caller.scripts.path().refused(&error, &first_key) => {
            alone(caller, batch).await;
            None
        }
        Err(error) => fail(batch, error),
    }
}

/// Sends a batch with a check of the `EVALSHA` path as one call of the
/// script of batches across subjects (mixed_script.lua), which decides each
/// check as the check script composed for its policy set would alone (a
/// check built for a function is sent so too, as its general check:
/// the store left Functions meanwhile); returns the error of a call that
/// failed store-wide.
async fn send_script(caller: &Caller, batch: Vec<Queued>) -> Option<StoreError> {
    let script = caller.scripts.get_mixed();
    let cmd = match script_command(script, &batch) {
        Ok(cmd) => cmd,
        Err(error) => return fail(batch, error),
    };
    let first_key = batch[0].call.first_key().to_owned();
    match caller.run(script, &cmd, &first_key).await {
        Ok(value) => {
            answer(batch, value);
            None
        }
        // Redis refused the script as a whole, having written nothing: a
        // server that cannot compile it, or (before Redis 7) its allow-oom
        // twin after an `OOM`. Each check alone answers as it would have:
        // a denial, say, where a full Redis before 7 refuses the batch.
        Err(error @ (StoreError::Rejected { .. } | StoreError::OutOfMemory { .. })) => {
            tracing::debug!(%error, "Redis refused a batch across subjects: each check alone");
            alone(caller, batch).await;
            None
        }
        Err(error) => fail(batch, error),
    }
}

/// Answers each check of a batch across subjects from the call's reply:
/// one item per check, as its call alone answers, `NOROOM` from an
/// allow-oom twin, or `FAILED <error>` for a check that failed alone.
fn answer(batch: Vec<Queued>, value: Value) {
    match value {
        Value::Array(items) if items.len() == batch.len() => {
            for (queued, item) in batch.into_iter().zip(items) {
                let reply = match item {
                    Value::SimpleString(status) if status == "NOROOM" => Err(out_of_memory()),
                    Value::SimpleString(status) if status.starts_with("FAILED ") => {
                        Err(StoreError::rejected(RedisCause::from(RedisError::from((
                            ErrorKind::Server(ServerErrorKind::ResponseError),
                            "Redis refused one check of a batch",
                            status["FAILED ".len()..].to_owned(),
                        )))))
                    }
                    item => queued.call.read(item),
                };
                let _ = queued.reply.send(reply);
            }
        }
        other => {
            fail(
                batch,
                protocol(format!("checks of several subjects answered {other:?}")),
            );
        }
    }
}

/// Sends each check of a batch alone, in turn, and answers it.
async fn alone(caller: &Caller, batch: Vec<Queued>) {
    for queued in batch {
        let verdict = queued.call.verdict(caller).await;
        let _ = queued.reply.send(verdict);
    }
}

/// Fails every check of a batch with its call's `error` (or one found
/// before the call: a command that could not be built, a reply of the
/// wrong shape); returns the error when it is store-wide.
fn fail(batch: Vec<Queued>, error: StoreError) -> Option<StoreError> {
    for queued in batch {
        let _ = queued.reply.send(Err(share(&error)));
    }
    error.is_store_wide().then_some(error)
}

/// `FCALL <mixed> <keys> <every check's keys> <m> [<function> <keys>
/// <arguments> <checks> <arguments...>...]...`: runs of consecutive checks
/// sent alone to the same function with the same counts, then each
/// check's arguments as it sends them alone, its keys moved to the front.
fn command(function: &str, batch: &[Queued]) -> Result<redis::Cmd, StoreError> {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function);
    across(cmd, batch, |call, arguments| {
        call.push_alone_arguments(arguments)?;
        Ok(call.function())
    })
}

/// `EVALSHA <mixed script> <keys> <every check's keys> <m> [<plan> <keys>
/// <arguments> <checks> <arguments...>...]...`: runs of consecutive checks
/// of the same plan letters and counts, then each check's arguments of the
/// check script composed for its policy set, its keys moved to the front
/// (mixed_script.lua).
fn script_command(script: &LuaScript, batch: &[Queued]) -> Result<redis::Cmd, StoreError> {
    across(script.call_cmd(), batch, |call, arguments| {
        call.push_script_arguments(arguments)?;
        call.letters()
    })
}

/// The rest of a batch's command after what it calls (`cmd`): the number
/// of keys and every check's keys, the number of checks, then the runs
/// (lua/batch_each.lua): consecutive checks that `each` names alike (it
/// writes a check's arguments and returns what the check is sent to) with
/// the same key and argument counts go as one run, its name, counts and
/// number of checks once, then each check's arguments, in arrival order.
fn across<'a, N: AsRef<[u8]> + PartialEq>(
    mut cmd: redis::Cmd,
    batch: &'a [Queued],
    each: impl Fn(&'a Call, &mut redis::Cmd) -> Result<N, StoreError>,
) -> Result<redis::Cmd, StoreError> {
    let keys: usize = batch.iter().map(|queued| queued.call.keys().len()).sum();
    cmd.arg(keys);
    for queued in batch {
        for key in queued.call.keys() {
            cmd.arg(key);
        }
    }
    cmd.arg(batch.len());
    // Every check's arguments, in order (sized for a few short ones
    // each), and the runs: (name, keys, arguments, checks).
    let mut arguments = redis::Cmd::with_capacity(4 * batch.len(), 48 * batch.len());
    let mut runs: Vec<(N, usize, usize, usize)> = Vec::new();
    for queued in batch {
        let before = arguments.args_iter().len();
        let name = each(&queued.call, &mut arguments)?;
        let counts = (
            queued.call.keys().len(),
            arguments.args_iter().len() - before,
        );
        match runs.last_mut() {
            Some((last, keys, count, checks)) if *last == name && (*keys, *count) == counts => {
                *checks += 1;
            }
            _ => runs.push((name, counts.0, counts.1, 1)),
        }
    }
    let mut arguments = arguments.args_iter();
    for (name, keys, count, checks) in &runs {
        cmd.arg(name.as_ref()).arg(*keys).arg(*count).arg(*checks);
        for argument in arguments.by_ref().take(count * checks) {
            if let redis::Arg::Simple(bytes) = argument {
                cmd.arg(bytes);
            }
        }
    }
    Ok(cmd)
}
