//! The fast path of a `RedisStore` check: one GCRA policy with a
//! whole-microsecond emission interval, called through the library's
//! `<name>_gcra` function, which answers one integer instead of five
//! (ALGORITHMS.md, "The Redis fast path"). The decision is derived here,
//! with the core's own arithmetic, from the state's lead over now.

use std::fmt::Write as _;
use std::sync::Arc;

use portcullis_core::algorithms::{self, GcraState, State};
use portcullis_core::{Algorithm, Decision, Policy, StoreError};
use redis::Value;

use crate::scripts::LuaScript;
use crate::store::{self, ClockMode, Inner, RedisStore};

impl RedisStore {
    /// The check of `policy` through the fast GCRA function `script`
    /// (chosen by [`Library::fast_gcra`](crate::scripts::Library::fast_gcra)).
    pub(crate) fn fast_gcra_future(
        &self,
        script: LuaScript,
        subject: &str,
        policy: &Policy,
        cost: u64,
    ) -> store::CheckFuture {
        let subject = self.subject(subject);
        let key = self.key(&subject, policy.name());
        let mut argument = String::with_capacity(48);
        let _ = write!(
            argument,
            "{}:{}:{}:{cost}",
            policy.limit(),
            policy.period_micros(),
            policy.capacity()
        );
        let now = match &self.inner.clock {
            ClockMode::Redis => None,
            ClockMode::Client(clock) => Some(clock.now_micros()),
        };
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(script.sha())
            .arg(1)
            .arg(key.as_str())
            .arg(argument.as_str());
        if let Some(now) = now {
            cmd.arg(now);
        }
        let policy = policy.clone();
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let value = match store::run(&inner, &script, &cmd, &key).await {
                // Redis refused FCALL or FUNCTION LOAD, so nothing ran:
                // EVALSHA from now on, this check first.
                Err(error) if inner.scripts.path().refused(&error) => {
                    evalsha(&inner, &key, &argument, now, cost).await?
                }
                other => other?,
            };
            match value {
                Value::Int(reply) => verdict(&policy, reply, cost),
                // A state the function handed to the general check.
                other => store::parse_verdict(other, &[policy.capacity()]),
            }
        })
    }
}

/// The general check's `EVALSHA` for a fast check the server refused as a
/// function.
#[cold]
async fn evalsha(
    inner: &Inner,
    key: &str,
    argument: &str,
    now: Option<u64>,
    cost: u64,
) -> Result<Value, StoreError> {
    let script = inner.scripts.get([Algorithm::Gcra].into_iter())?;
    // `<limit>:<period_us>:<capacity>`: the argument without its cost.
    let policy = argument
        .rsplit_once(':')
        .map_or(argument, |(policy, _)| policy);
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.sha()).arg(1).arg(key);
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(cost).arg(policy);
    store::run(inner, &script, &cmd, key).await
}

/// The verdict for the fast function's reply (or one reply of the
/// coalesced GCRA function, which answers the same for each check).
pub(crate) fn verdict(
    policy: &Policy,
    reply: i64,
    cost: u64,
) -> Result<portcullis_core::Verdict, StoreError> {
    fast_decision(policy, reply, cost).map(|d| std::iter::once(d).collect())
}

/// The decision for the fast function's reply: the state's lead over now
/// before the call, `ahead` when admitted and `-1 - ahead` when denied.
fn fast_decision(policy: &Policy, reply: i64, cost: u64) -> Result<Decision, StoreError> {
    let (admitted, ahead) = if reply >= 0 {
        (true, reply.unsigned_abs())
    } else {
        // -1 - ahead; reply + 1 cannot overflow for a negative reply.
        (false, (reply + 1).unsigned_abs())
    };
    // The same step the script took, seen from now = 0: only the lead
    // matters to GCRA.
    let state = State::Gcra(GcraState {
        tat_us: ahead,
        tat_rem: 0,
    });
    let step = algorithms::check(policy, Some(&state), 0, cost);
    let decision = step.decision;
    // The function hands a state it would clamp (a repair, the only write
    // a denial makes) to the general check, so such a lead is never its
    // answer.
    let repaired = !decision.is_allowed() && step.new_state.is_some();
    if repaired {
        return Err(store::protocol(format!(
            "the fast GCRA function answered a lead of {ahead} µs, beyond what the policy allows; \
             is the library from another portcullis-redis version?"
        )));
    }
    if decision.is_allowed() != admitted {
        return Err(store::protocol(format!(
            "the fast GCRA function answered {reply}, which {} for this policy; \
             is the library from another portcullis-redis version?",
            if admitted { "denies" } else { "admits" }
        )));
    }
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn policy() -> Policy {
        Policy::per_second(100)
            .burst(10)
            .name("api")
            .build()
            .unwrap()
    }

    #[test]
    fn replies_decode_to_the_core_decision() {
        // 100/s burst 10: an interval of 10 000 µs, a capacity of 100 000 µs.
        let admitted = fast_decision(&policy(), 30_000, 1).unwrap();
        assert!(admitted.is_allowed());
        assert_eq!(admitted.remaining(), 6);
        assert_eq!(admitted.reset_after(), Duration::from_micros(40_000));

        let denied = fast_decision(&policy(), -1 - 95_000, 1).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.retry_after(), Some(Duration::from_micros(5_000)));
        assert_eq!(denied.reset_after(), Duration::from_micros(95_000));
    }

    #[test]
    fn a_reply_that_disagrees_is_a_protocol_error() {
        assert!(matches!(
            fast_decision(&policy(), 100_000, 1),
            Err(StoreError::Protocol { .. })
        ));
        assert!(matches!(
            fast_decision(&policy(), -1, 1),
            Err(StoreError::Protocol { .. })
        ));
        assert!(fast_decision(&policy(), i64::MIN, 1).is_err());
        assert!(fast_decision(&policy(), i64::MAX, 1).is_err());
    }
}
