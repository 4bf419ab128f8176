//! `RedisStore`'s check with options ([`Store::check_with`](portcullis_core::Store::check_with)):
//! the call of options.lua, as the library's `ext` function (`FCALL`) or a
//! composed script (`EVALSHA`), with the same fallback as a check. The
//! idempotency record is `<prefix>:{<subject>}:#<sha256 hex>` (beside the
//! subject's state keys, in their hash slot; the hash covers the policy
//! names, the cost, the idempotency key and the request's fingerprint,
//! none of which reaches Redis), read and written in the same call as the
//! check, with a `PXAT` expiry at the end of its window. Only an admitted
//! check writes one, holding its free replays (options.lua).

use std::sync::Arc;

use portcullis_core::{Algorithm, CheckOptions, Checked, Policy, StoreError};
use redis::Value;
use smallvec::SmallVec;

use crate::functions::CallPath;
use crate::scripts;
use crate::store::{evalsha_from_fcall, parse_verdict, run, RedisStore};

/// The future of a check with options.
pub(crate) type CheckWithFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Checked, StoreError>> + Send>>;

impl RedisStore {
    pub(crate) fn check_with_future(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &CheckOptions,
    ) -> Result<CheckWithFuture, StoreError> {
        let plan = options.plan(policies, cost)?;
        let algorithms: SmallVec<[Algorithm; 2]> = policies.iter().map(Policy::algorithm).collect();
        let script = match self.inner.scripts.path().choose() {
            CallPath::Evalsha => self.inner.scripts.get_ext(algorithms.iter().copied())?,
            _ => self.inner.scripts.library().ext_function().clone(),
        };
        let subject = self.subject(subject);
        let mut cmd = redis::cmd(if script.is_function() {
            "FCALL"
        } else {
            "EVALSHA"
        });
        let keys = policies.len() + usize::from(plan.record().is_some());
        cmd.arg(script.sha()).arg(keys);
        let mut first_key = String::new();
        for (i, policy) in policies.iter().enumerate() {
            let key = self.key(&subject, policy.name());
            if i == 0 {
                first_key.clone_from(&key);
            }
            cmd.arg(key);
        }
        if let Some(record) = plan.record() {
            cmd.arg(self.key(&subject, record.id()));
        }
        if script.is_function() {
            let letters = scripts::Library::plan(algorithms.iter().copied())?;
            cmd.arg(letters.as_slice());
        }
        self.push_now(&mut cmd);
        cmd.arg(cost);
        cmd.arg(
            plan.record()
                .map_or(0, portcullis_core::Record::window_micros),
        );
        cmd.arg(
            plan.record()
                .map_or(0, portcullis_core::Record::free_replays),
        );
        for policy in policies {
            cmd.arg(format!(
                "{}:{}:{}",
                policy.limit(),
                policy.period_micros(),
                policy.capacity()
            ));
        }
        for reserve in plan.reserves() {
            cmd.arg(*reserve);
        }
        let capacities: SmallVec<[u64; 2]> = policies.iter().map(Policy::capacity).collect();
        let inner = Arc::clone(&self.inner);
        Ok(Box::pin(async move {
            let value = match run(&inner, &script, &cmd, &first_key).await {
                // Redis refused FCALL or FUNCTION LOAD, so nothing ran:
                // EVALSHA from now on, this check first.
                Err(error) if script.is_function() && inner.scripts.path().refused(&error) => {
                    let script = inner.scripts.get_ext(algorithms.iter().copied())?;
                    let evalsha = evalsha_from_fcall(&script, &cmd, keys);
                    run(&inner, &script, &evalsha, &first_key).await?
                }
                other => other?,
            };
            parse_checked(value, &capacities)
        }))
    }
}

/// A fresh verdict (an array), or a record's (a bulk string of the first
/// check's integers, comma-separated): a replay.
fn parse_checked(value: Value, capacities: &[u64]) -> Result<Checked, StoreError> {
    let body = match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        other => return Ok(Checked::new(parse_verdict(other, capacities)?, false)),
    };
    let text = std::str::from_utf8(&body).map_err(|_| StoreError::Protocol {
        detail: "an idempotency record that is not text".to_owned(),
    })?;
    let items = text
        .split(',')
        .map(|item| {
            item.parse::<i64>()
                .map(Value::Int)
                .map_err(|_| StoreError::Protocol {
                    detail: format!("an idempotency record holds {item:?}, not an integer"),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checked::new(
        parse_verdict(Value::Array(items), capacities)?,
        true,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_parses_as_a_replay_and_garbage_is_a_protocol_error() {
        let record = Value::BulkString(b"1,4,-1,200000,0".to_vec());
        let checked = parse_checked(record, &[5]).unwrap();
        assert!(checked.is_replay());
        assert_eq!(checked.verdict().decisions()[0].remaining(), 4);
        let bad = parse_checked(Value::BulkString(b"1,x".to_vec()), &[5]).unwrap_err();
        assert!(matches!(bad, StoreError::Protocol { .. }), "{bad}");
        let short = parse_checked(Value::BulkString(b"1,4".to_vec()), &[5]).unwrap_err();
        assert!(matches!(short, StoreError::Protocol { .. }), "{short}");
    }
}
