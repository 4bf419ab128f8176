//! One coalesced batch's call: the checks of one subject and policies,
//! decided in turn by the batch function of one policy's fast path
//! (`gcra_batch`, batch.lua; the other algorithms', batch_fast.lua) when
//! every check of the batch is one that fast path takes, else (or when it
//! answers `GENERAL`, having written nothing) by the general batch; one
//! call per check, as scripts, on a server that refuses Functions.

use std::sync::Arc;

use portcullis_core::{Algorithm, Policy, StoreError};
use redis::Value;

use super::Reply;
use crate::call::reply::{out_of_memory, parse_verdict, protocol};
use crate::call::{int_reply, push_time, Call, Caller, Kind, Target};
use crate::functions::CallPath;
use crate::scripts::{Library, LuaScript};

/// Decides `costs` in turn in one call (two when the fast batch hands a
/// state to the general one; one call per check, in turn, on a server
/// that refuses Functions from now on).
pub(super) async fn decide(
    caller: &Caller,
    batch: &Arc<Target>,
    costs: &[u64],
) -> Result<Vec<Reply>, StoreError> {
    let library = caller.scripts.library();
    let first_key = batch.first_key();
    let set = batch.set();
    let now = caller.now();
    if let Some((policy, function)) = fast_batch(library, batch, costs) {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(function.sha())
            .arg(1)
            .arg(first_key)
            .arg(set.argument(0));
        push_time(&mut cmd, now);
        for cost in costs {
            cmd.arg(*cost);
        }
        match caller.run(function, &cmd, first_key).await {
            Ok(Value::Array(items)) if items.len() == costs.len() => {
                return Ok(items
                    .into_iter()
                    .zip(costs)
                    .map(|(item, &cost)| fast_reply(policy, set.capacities(), item, cost))
                    .collect());
            }
            // A state only the general check reads: nothing was written.
            Ok(Value::SimpleString(status)) if status == "GENERAL" => {}
            Ok(other) => {
                return Err(protocol(format!(
                    "coalesced {} checks answered {other:?}",
                    policy.algorithm()
                )))
            }
            Err(error) if caller.scripts.path().refused(&error, first_key) => {
                return one_by_one(caller, batch, costs).await;
            }
            Err(error) => return Err(error),
        }
    }
    let general = library.batch_function();
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(general.sha()).arg(batch.key_count());
    for key in batch.keys() {
        cmd.arg(key);
    }
    cmd.arg(set.letters().unwrap_or_default().as_slice());
    push_time(&mut cmd, now);
    cmd.arg(costs.len());
    for cost in costs {
        cmd.arg(*cost);
    }
    for argument in set.arguments() {
        cmd.arg(argument);
    }
    match caller.run(general, &cmd, first_key).await {
        Ok(Value::Array(items)) if items.len() == costs.len() => Ok(items
            .into_iter()
            .map(|item| match item {
                Value::SimpleString(status) if status == "NOROOM" => Err(out_of_memory()),
                item => parse_verdict(item, set.capacities()),
            })
            .collect()),
        Ok(other) => Err(protocol(format!("coalesced checks answered {other:?}"))),
        Err(error) if caller.scripts.path().refused(&error, first_key) => {
            one_by_one(caller, batch, costs).await
        }
        Err(error) => Err(error),
    }
}

/// The one policy of `batch` and its fast path's batch function, when
/// every check of the batch is one that fast path takes (the policy and
/// each cost decide, not the lead's cost alone: a fast function's own
/// bounds, such as a window's cost of at most its limit, hold for each).
fn fast_batch<'a>(
    library: &'a Library,
    batch: &'a Target,
    costs: &[u64],
) -> Option<(&'a Policy, &'a LuaScript)> {
    let policies = batch.policies();
    let [policy] = policies else {
        return None;
    };
    let serving = batch.set().serving();
    let function = library.fast_batch_function(serving)?;
    costs
        .iter()
        .all(|&cost| Library::serving(policies, cost) == serving)
        .then_some((policy, function))
}

/// The verdict of one check of a fast batch: the fast function's integer,
/// or (a sliding log's denial) the general check's five integers.
fn fast_reply(policy: &Policy, capacities: &[u64], item: Value, cost: u64) -> Reply {
    match item {
        Value::Int(reply) => int_reply::verdict(policy, reply, cost),
        item @ Value::Array(_) if policy.algorithm() == Algorithm::SlidingLog => {
            parse_verdict(item, capacities)
        }
        other => Err(protocol(format!(
            "a coalesced {} check answered {other:?}",
            policy.algorithm()
        ))),
    }
}

/// The checks as scripts, one call each, in turn: Redis refused the
/// Functions (nothing ran) and the store uses `EVALSHA` from now on.
#[cold]
async fn one_by_one(
    caller: &Caller,
    batch: &Arc<Target>,
    costs: &[u64],
) -> Result<Vec<Reply>, StoreError> {
    let mut replies = Vec::with_capacity(costs.len());
    for &cost in costs {
        let call = Call::new(
            caller,
            CallPath::Evalsha,
            Kind::Check,
            Arc::clone(batch),
            cost,
        );
        let reply = match call {
            Ok(call) => call.verdict(caller).await,
            Err(error) => Err(error),
        };
        replies.push(reply);
    }
    Ok(replies)
}
