//! The waiting side of a coalesced check: how long it waits for its batch
//! to be taken, and what it answers (see the parent module's docs, "How
//! long a waiting check waits").

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::StoreError;
use tokio::sync::oneshot;

use super::Reply;

/// A waiting check's state: waiting, taken into a batch (sent), or
/// withdrawn (its wait ran out first). Each waiting check moves once, to
/// one of the other two, by a compare-and-swap: taken and withdrawn never
/// both happen.
pub(super) const WAITING: u8 = 0;
pub(super) const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// The waiting check's side: its answer to come, its state, and how many
/// calls were ahead of it when it joined (for [`wait_bound`]).
pub(crate) struct Waiting {
    answer: oneshot::Receiver<Reply>,
    state: Arc<AtomicU8>,
    batches_ahead: usize,
}

impl Waiting {
    pub(super) fn new(
        answer: oneshot::Receiver<Reply>,
        state: Arc<AtomicU8>,
        batches_ahead: usize,
    ) -> Self {
        Self {
            answer,
            state,
            batches_ahead,
        }
    }

    #[cfg(test)]
    pub(super) fn batches_ahead(&self) -> usize {
        self.batches_ahead
    }

    /// Withdraws the check, unless its batch took it first.
    fn withdraw(&self) -> bool {
        self.state
            .compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// How long a waiting check waits at most for its batch to be taken:
/// `2 × timeout` for each call ahead of it when it joined (the call in
/// flight, and one batch per [`MAX_BATCH`](super::MAX_BATCH) checks queued
/// before it), each of which usually makes one or two calls bounded by the
/// timeout. See the parent module's docs for what happens after.
pub(crate) fn wait_bound(timeout: Duration, batches_ahead: usize) -> Duration {
    let calls = u32::try_from(batches_ahead.max(1)).unwrap_or(u32::MAX);
    timeout.saturating_mul(2).saturating_mul(calls)
}

/// The answer of a waiting check: its batch's, or, when its batch was not
/// taken within [`wait_bound`], an error that says it was not sent.
pub(crate) async fn wait(waiting: Waiting, timeout: Duration) -> Reply {
    let mut waiting = waiting;
    let batches_ahead = waiting.batches_ahead;
    let bound = wait_bound(timeout, batches_ahead);
    if let Ok(received) = tokio::time::timeout(bound, &mut waiting.answer).await {
        return answered(received);
    }
    if waiting.withdraw() {
        // Never sent, and now never will be: the batch that comes for
        // this subject leaves it out.
        return Err(StoreError::unavailable(format!(
            "not sent: the {batches_ahead} call(s) ahead of this check for its subject took longer \
             than {bound:?}"
        )));
    }
    // Its batch was taken and is in flight: its answer, whatever it says.
    // That call is bounded by the store's timeout, so this ends.
    answered(waiting.answer.await)
}

fn answered(received: Result<Reply, oneshot::error::RecvError>) -> Reply {
    match received {
        Ok(reply) => reply,
        // The task sending the batch ended without answering (the runtime
        // shut down): the check may have been sent.
        Err(_) => Err(StoreError::OutcomeUnknown {
            source: "the coalesced call ended without an answer".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Coalescer, Join};
    use super::*;

    fn waiting(join: Join) -> Waiting {
        match join {
            Join::Wait(waiting) => waiting,
            Join::Lead(_) => panic!("a second leader while a call is in flight"),
        }
    }

    #[test]
    fn the_bound_grows_with_the_calls_ahead() {
        let timeout = Duration::from_millis(250);
        assert_eq!(wait_bound(timeout, 1), Duration::from_millis(500));
        assert_eq!(wait_bound(timeout, 3), Duration::from_millis(1_500));
    }

    #[test]
    fn a_withdrawn_check_is_never_taken_and_a_taken_one_cannot_withdraw() {
        let coalescer = Coalescer::<&str>::new();
        assert!(matches!(coalescer.join(&"k", 1), Join::Lead(_)));
        let first = waiting(coalescer.join(&"k", 1));
        let second = waiting(coalescer.join(&"k", 2));
        assert!(first.withdraw());
        let batch = coalescer.next_of(&"k").expect("the second is taken");
        assert_eq!(batch.iter().map(|w| w.cost).collect::<Vec<_>>(), [2]);
        assert!(!second.withdraw(), "taken: it waits for its batch's answer");
        drop(batch);
        assert!(coalescer.next_of(&"k").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_not_taken_in_time_withdraws_and_says_it_was_not_sent() {
        let coalescer = Coalescer::<&str>::new();
        assert!(matches!(coalescer.join(&"k", 1), Join::Lead(_)));
        let check = waiting(coalescer.join(&"k", 1));
        let error = wait(check, Duration::from_millis(100)).await.unwrap_err();
        assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
        let cause = std::error::Error::source(&error).unwrap().to_string();
        assert!(cause.contains("not sent"), "{cause}");
        assert!(
            coalescer.next_of(&"k").is_none(),
            "left out of the next batch"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_taken_before_its_wait_ran_out_gets_its_batch_answer() {
        let coalescer = Coalescer::<&str>::new();
        assert!(matches!(coalescer.join(&"k", 1), Join::Lead(_)));
        let check = waiting(coalescer.join(&"k", 1));
        let mut batch = coalescer.next_of(&"k").expect("taken");
        let waiter = batch.pop().unwrap();
        let answer = tokio::spawn(wait(check, Duration::from_millis(100)));
        // Far past the bound, the batch answers: the check gets that
        // answer, not a timeout of its own.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let _ = waiter.reply.send(Err(StoreError::Protocol {
            detail: "the batch's own answer".to_owned(),
        }));
        let error = answer.await.unwrap().unwrap_err();
        assert!(
            matches!(&error, StoreError::Protocol { detail } if detail == "the batch's own answer"),
            "{error:?}"
        );
    }
}
