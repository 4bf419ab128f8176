//! The grant call: a slice of a busy subject's allowance (up to the
//! asked permits, this check's cost first), charged in Redis in one call
//! of the library's `gcra_take` function, and handed to the [`Budget`].

use std::sync::Arc;

use portcullis_core::{Policy, StoreError, Verdict};
use redis::Value;

use super::{Ask, Budget};
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
            self.budget
                .grant_ended(&self.key, self.ask, self.cost, 0, self.sent, None);
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
    let script = caller.scripts.library().grant_function();
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(script.sha())
        .arg(1)
        .arg(guard.key.as_str())
        .arg(set.argument(0));
    push_time(&mut cmd, caller.now());
    cmd.arg(cost).arg(want.permits);
    let answer = caller.run(script, &cmd, &guard.key).await;
    let (granted, verdict) = match answer {
        Ok(Value::Array(items)) => match ints::<2>(&items)? {
            [granted, ahead] if granted > 0 => {
                let granted = granted.unsigned_abs();
                (granted, int_reply::verdict(&policy, ahead, cost)?)
            }
            [_, ahead] => (0, int_reply::verdict(&policy, -1 - ahead, cost)?),
        },
        // A state only the general check reads, or a refused function:
        // this check alone, exactly; the next grant finds the state read.
        Ok(Value::SimpleString(status)) if status == "GENERAL" => {
            (0, exact(&caller, &guard.key, set, cost).await?)
        }
        Ok(other) => return Err(protocol(format!("a grant of permits answered {other:?}"))),
        Err(error) if caller.scripts.path().refused(&error, &guard.key) => {
            (0, exact(&caller, &guard.key, set, cost).await?)
        }
        Err(error) => return Err(error),
    };
    guard.budget.grant_ended(
        &guard.key,
        want,
        cost,
        granted,
        guard.sent,
        Some(verdict.binding()),
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
