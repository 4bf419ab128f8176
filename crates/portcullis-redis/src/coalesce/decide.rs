//! One coalesced batch's call: the checks of one subject and policies,
//! decided in turn by the batch function of one policy's fast path
//! (`gcra_batch`, batch.lua; the other algorithms', batch_fast.lua) when
//! every check of the batch is one that fast path takes, else (or when it
//! answers `GENERAL`, having written nothing) by the general batch; on a
//! server that refuses Functions, by the batch script composed for the
//! policy set (batch_script.lua), also one call.

use std::sync::Arc;

use portcullis_core::{Algorithm, Policy, StoreError};
use redis::Value;

use super::Reply;
use crate::call::reply::{out_of_memory, parse_verdict, protocol};
use crate::call::{int_reply, push_time, Caller, Target};
use crate::functions::CallPath;
use crate::scripts::{Library, LuaScript};

/// Decides `costs` in turn in one call (two when the fast batch hands a
/// state to the general one, or when Redis refuses the function and the
/// batch goes again as a script).
pub(super) async fn decide(
    caller: &Caller,
    batch: &Arc<Target>,
    costs: &[u64],
) -> Result<Vec<Reply>, StoreError> {
    let library = caller.scripts.library();
    let first_key = batch.first_key();
    let set = batch.set();
    let now = caller.now();
    if caller.scripts.path().choose(first_key) == CallPath::Evalsha {
        return script_batch(caller, batch, costs).await;
    }
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
                return script_batch(caller, batch, costs).await;
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
        Ok(value) => general_replies(value, costs, set.capacities()),
        Err(error) if caller.scripts.path().refused(&error, first_key) => {
            script_batch(caller, batch, costs).await
        }
        Err(error) => Err(error),
    }
}

/// The replies of a general batch (the function or the script): one
/// verdict per check, as check.lua answers alone.
fn general_replies(
    value: Value,
    costs: &[u64],
    capacities: &[u64],
) -> Result<Vec<Reply>, StoreError> {
    match value {
        Value::Array(items) if items.len() == costs.len() => Ok(items
            .into_iter()
            .map(|item| match item {
                Value::SimpleString(status) if status == "NOROOM" => Err(out_of_memory()),
                item => parse_verdict(item, capacities),
            })
            .collect()),
        other => Err(protocol(format!("coalesced checks answered {other:?}"))),
    }
}

/// The checks in one call of the batch script composed for their policy
/// set (batch_script.lua, `EVALSHA`): the store is on scripts (a server
/// without Functions, or one that refused them), and a batch costs one
/// call there too.
async fn script_batch(
    caller: &Caller,
    batch: &Arc<Target>,
    costs: &[u64],
) -> Result<Vec<Reply>, StoreError> {
    let set = batch.set();
    let script = caller.scripts.get_batch(set.algorithms())?;
    let mut cmd = script.call_cmd();
    cmd.arg(batch.key_count());
    for key in batch.keys() {
        cmd.arg(key);
    }
    push_time(&mut cmd, caller.now());
    cmd.arg(costs.len());
    for cost in costs {
        cmd.arg(*cost);
    }
    for argument in set.arguments() {
        cmd.arg(argument);
    }
    let value = caller.run(&script, &cmd, batch.first_key()).await?;
    general_replies(value, costs, set.capacities())
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
