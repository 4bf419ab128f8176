//! The grant call: a rate share of a busy subject (the next emission
//! slots over one grant period, up to the asked permits, this check's
//! cost first when due at once), charged in Redis in one call of
//! grant.lua's `gcra_take` (the library's function, or the grant script
//! on the `EVALSHA` path), and handed to the [`Budget`].

use std::sync::Arc;

use portcullis_core::{Policy, StoreError, Verdict};
use redis::{Cmd, Value};

use super::{Ask, Budget, Share};
use crate::call::reply::{ints, protocol};
use crate::call::{int_reply, push_time, Call, Caller, Kind, PolicySet, Target};
use crate::functions::CallPath;

/// Clears the subject's `granting` mark if the grant call's future is
/// dropped before it ends.
struct Granting {
    budget: Arc<Budget>,
    key: String,
    ask: Ask,
    cost: u64,
    sent: u64,
    done: bool,
}

impl Drop for Granting {
    fn drop(&mut self) {
        if !self.done {
            self.budget.grant_ended(
                self.key.as_bytes(),
                self.ask,
                self.cost,
                None,
                false,
                (self.sent, self.sent),
            );
        }
    }
}

/// The grant call: up to `want.permits` permits of `policy` (its `set`)
/// for `key`, this check's `cost` first.
pub(crate) async fn grant(
    caller: Arc<Caller>,
    budget: Arc<Budget>,
    key: String,
    policy: Policy,
    set: PolicySet,
    cost: u64,
    want: Ask,
) -> Result<Verdict, StoreError> {
    let mut guard = Granting {
        sent: caller.clock.budget_time(),
        budget,
        key,
        ask: want,
        cost,
        done: false,
    };
    let mut args = Cmd::new();
    args.arg(1).arg(guard.key.as_str()).arg(set.argument(0));
    push_time(&mut args, caller.now());
    let horizon = u64::try_from(guard.budget.period().as_micros()).unwrap_or(u64::MAX);
    args.arg(cost).arg(want.permits).arg(horizon);
    // The library's function, or the same code as a script on the
    // `EVALSHA` path, or once more as the script when Redis refuses the
    // function (nothing ran; the store takes `EVALSHA` from then on). The
    // two answer alike, so the reply is read alike.
    let answer = caller
        .run_either(
            caller.scripts.library().grant_function(),
            caller.scripts.get_grant(),
            &guard.key,
            &args,
        )
        .await;
    let (share, admitted, verdict) = match answer {
        Ok(Value::Array(items)) => {
            let [slots, lead] = ints::<2>(&items)?;
            let (Ok(slots), Ok(lead)) = (u64::try_from(slots), u64::try_from(lead)) else {
                return Err(protocol(format!(
                    "a rate share answered {slots} slots at a lead of {lead} µs"
                )));
            };
            let share = Share { slots, lead };
            let interval = policy.period_micros() / policy.limit().max(1);
            let cap = policy.capacity().saturating_mul(interval);
            let at_once = lead.saturating_add(cost.saturating_mul(interval)) <= cap;
            let signed = |lead: u64| i64::try_from(lead).unwrap_or(i64::MAX);
            if slots >= cost && at_once {
                (
                    Some(share),
                    true,
                    int_reply::verdict(&policy, signed(lead), cost)?,
                )
            } else {
                // Denied: the exact answer for this instance, whose own
                // slots come first when it holds enough of them, else
                // Redis' after the share.
                let behind = if slots >= cost {
                    lead
                } else {
                    lead.saturating_add(slots.saturating_mul(interval))
                };
                (
                    Some(share),
                    false,
                    int_reply::verdict(&policy, -1 - signed(behind), cost)?,
                )
            }
        }
        // A state only the general check reads: this check alone,
        // exactly; the next grant finds the state read.
        Ok(Value::SimpleString(status)) if status == "GENERAL" => {
            (None, false, exact(&caller, &guard.key, set, cost).await?)
        }
        Ok(other) => return Err(protocol(format!("a grant of permits answered {other:?}"))),
        Err(error) => return Err(error),
    };
    let received = caller.clock.budget_time();
    guard.budget.grant_ended(
        guard.key.as_bytes(),
        want,
        cost,
        share,
        admitted,
        (guard.sent, received),
    );
    guard.done = true;
    Ok(verdict)
}

/// One check of `cost`, as the general script decides it (`EVALSHA`).
#[cold]
async fn exact(
    caller: &Caller,
    key: &str,
    set: PolicySet,
    cost: u64,
) -> Result<Verdict, StoreError> {
    let target = Arc::new(Target::new(set, &[]).with_key(key));
    let call = Call::new(caller, CallPath::Evalsha, Kind::Check, target, cost)?;
    call.verdict(caller).await
}
