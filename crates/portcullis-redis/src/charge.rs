//! `RedisStore`'s post-charge ([`Store::charge`](portcullis_core::Store::charge)):
//! the call of charge.lua, as the library's charge function (`FCALL`) or
//! a composed script (`EVALSHA`), with the same fallback as a check.

use std::sync::Arc;

use portcullis_core::{validate_charge, Algorithm, Policy, StoreError};
use smallvec::SmallVec;

use crate::functions::CallPath;
use crate::scripts;
use crate::store::{evalsha_from_fcall, parse_verdict, run, CheckFuture, RedisStore};

impl RedisStore {
    pub(crate) fn charge_future(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<CheckFuture, StoreError> {
        validate_charge(policies)?;
        let algorithms: SmallVec<[Algorithm; 2]> = policies.iter().map(Policy::algorithm).collect();
        let script = match self.inner.scripts.path().choose() {
            CallPath::Evalsha => self.inner.scripts.get_charge(algorithms.iter().copied())?,
            _ => self.inner.scripts.library().charge_function().clone(),
        };
        let subject = self.subject(subject);
        let mut cmd = redis::cmd(if script.is_function() {
            "FCALL"
        } else {
            "EVALSHA"
        });
        cmd.arg(script.sha()).arg(policies.len());
        let mut first_key = String::new();
        for (i, policy) in policies.iter().enumerate() {
            let key = self.key(&subject, policy.name());
            if i == 0 {
                first_key.clone_from(&key);
            }
            cmd.arg(key);
        }
        if script.is_function() {
            let plan = scripts::Library::plan(algorithms.iter().copied())?;
            cmd.arg(plan.as_slice());
        }
        self.push_now(&mut cmd);
        cmd.arg(cost);
        for policy in policies {
            cmd.arg(format!(
                "{}:{}:{}",
                policy.limit(),
                policy.period_micros(),
                policy.capacity()
            ));
        }
        let capacities: SmallVec<[u64; 2]> = policies.iter().map(Policy::capacity).collect();
        let inner = Arc::clone(&self.inner);
        Ok(Box::pin(async move {
            let value = match run(&inner, &script, &cmd, &first_key).await {
                // Redis refused FCALL or FUNCTION LOAD, so nothing ran:
                // EVALSHA from now on, this charge first.
                Err(error) if script.is_function() && inner.scripts.path().refused(&error) => {
                    let script = inner.scripts.get_charge(algorithms.iter().copied())?;
                    let evalsha = evalsha_from_fcall(&script, &cmd, algorithms.len());
                    run(&inner, &script, &evalsha, &first_key).await?
                }
                other => other?,
            };
            parse_verdict(value, &capacities)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_gcra_and_the_token_bucket_have_a_charge_script() {
        let script = scripts::compose_charge(&[Algorithm::Gcra, Algorithm::TokenBucket]).unwrap();
        assert_eq!(script.sha().len(), 40);
        let err = scripts::compose_charge(&[Algorithm::FixedWindow]).unwrap_err();
        assert!(matches!(err, StoreError::Unsupported { .. }), "{err}");
    }
}
