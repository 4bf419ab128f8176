//! The [`Store`] impl of [`RedisStore`] and the route of a check: the
//! local budget (`budget/`) when it takes the check, else a call in flight
//! for the same subject and policies to join (`coalesce/`), else one call
//! ([`Call`]). The policy set's facts are derived once per check, here,
//! and every path reads them: which function serves it
//! ([`Library::serving`], first: the local budget and coalescing ask it)
//! and the policy arguments ([`PolicySet`], only on the paths that send
//! them: a grant call, a coalesced batch's lead, a call alone).

use std::future::Future;
use std::sync::Arc;

use portcullis_core::{
    validate_charge, validate_check, CheckOptions, Checked, Policy, Store, StoreError, Verdict,
};

use super::RedisStore;
use crate::budget::{self, Budget, Take};
use crate::call::{Call, Kind, OptionArgs, PolicySet, Target};
use crate::coalesce::{self, Entry, Join, Lead};
use crate::keys::KeyBytes;
use crate::scripts::{Library, Serving};

/// The future of [`RedisStore::check`]: the core's boxed check future.
type CheckFuture = portcullis_core::BoxCheckFuture;

/// The future of a check with options.
type CheckWithFuture = std::pin::Pin<Box<dyn Future<Output = Result<Checked, StoreError>> + Send>>;

impl Store for RedisStore {
    type CheckFuture = CheckFuture;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        match self.check_future(subject, policies, cost) {
            Ok(future) => future,
            Err(error) => Box::pin(std::future::ready(Err(error))),
        }
    }

    /// Answers at once only from a [`LocalBudget`](crate::LocalBudget):
    /// permits of a live grant, or a denial Redis gave that still holds.
    /// Everything else goes to Redis through [`Store::check`].
    fn check_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        self.inner.budget.as_ref()?;
        let encoded = self.subject(subject);
        let serving = Library::serving(policies, cost);
        let (budget, key) = self.budget_for(serving, &encoded, policies, cost)?;
        let now = self.inner.caller.clock.budget_time();
        budget.local(&key, &policies[0], cost, now).map(Ok)
    }

    /// One atomic script call for every policy (charge.lua; `FCALL` of the
    /// library's charge function, or `EVALSHA` on that path). See
    /// [`Store::charge`].
    fn charge(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send + 'static {
        let future = self.charge_future(subject, policies, cost);
        async move { future?.await }
    }

    /// One atomic script call: the idempotency record, the class
    /// reserves and every policy (options.lua; `FCALL` of the library's
    /// `ext` function, or `EVALSHA` on that path). See [`Store::check_with`].
    ///
    /// The idempotency record is `<prefix>:{<subject>}:#<sha256 hex>`
    /// (beside the subject's state keys, in their hash slot; the hash
    /// covers the policy names, the cost, the idempotency key and the
    /// request's fingerprint, none of which reaches Redis), read and
    /// written in the same call as the check, with a `PXAT` expiry at the
    /// end of its window. Only an admitted check writes one, holding its
    /// free replays (options.lua).
    fn check_with(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &CheckOptions,
    ) -> impl Future<Output = Result<Checked, StoreError>> + Send + 'static {
        let future = self.check_with_future(subject, policies, cost, options);
        async move { future?.await }
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let subject = self.subject(subject);
        let keys: Vec<String> = policies
            .iter()
            .map(|policy| self.key(&subject, policy.name()))
            .collect();
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&keys);
        let inner = Arc::clone(&self.inner);
        async move {
            if keys.is_empty() {
                return Ok(());
            }
            let deleted = inner.caller.query(&cmd).await;
            // This instance's local answers for the subject end with the
            // reset (budget/), whatever the reply: a `DEL` whose reply was
            // lost may still have run.
            if let Some(budget) = &inner.budget {
                for key in &keys {
                    budget.forget(key.as_bytes());
                }
            }
            deleted?;
            Ok(())
        }
    }
}

impl RedisStore {
    /// What the calls of a check of `policies` for `encoded` address,
    /// served as `serving`.
    fn target(&self, encoded: &str, policies: &[Policy], serving: Serving) -> Arc<Target> {
        let mut target = Target::new(PolicySet::new(policies, serving), policies);
        for policy in policies {
            target.push_key(&self.inner.caller.keys.parts(encoded, policy.name()));
        }
        Arc::new(target)
    }

    fn check_future(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<CheckFuture, StoreError> {
        validate_check(policies, cost)?;
        // Encoded once (a hashed subject's SHA-256 is computed once); it is
        // the keys' hash tag, so its slot is theirs.
        let encoded = self.subject(subject);
        let serving = Library::serving(policies, cost);
        if let Some(future) = self.budget_answer(serving, &encoded, policies, cost) {
            return Ok(future);
        }
        let path = self.inner.caller.scripts.path().choose(&encoded);
        let target = self.target(&encoded, policies, serving);
        // Charges join a call in flight for the same subject and policies
        // (coalesce/; as a function, or as a script on the `EVALSHA` path);
        // peeks go alone.
        if let (Some(coalescer), true) = (&self.inner.coalescer, cost > 0) {
            match coalescer.join(&target, cost) {
                Join::Wait(answer) => {
                    return Ok(Box::pin(coalesce::wait(answer, self.inner.caller.timeout)));
                }
                Join::Lead(hash) => {
                    let mut lead = Lead::new(
                        Arc::clone(&self.inner.caller),
                        Arc::clone(coalescer),
                        Arc::clone(&target),
                        hash,
                    );
                    let caller = Arc::clone(&self.inner.caller);
                    let lane = self.inner.lane.clone();
                    // The call goes now, or waits for a free call and goes
                    // in a batch across subjects (coalesce/lane.rs; as a
                    // function, or as a script on the `EVALSHA` path); taken
                    // here, so the order of arrival is the order of checks.
                    let route =
                        Call::new(&caller, path, Kind::Check, target, cost).map(|call| match &self
                            .inner
                            .lane
                        {
                            Some(lane) => lane.enter(&caller, call),
                            None => Entry::Alone(call),
                        });
                    return Ok(Box::pin(async move {
                        let verdict = match route {
                            Ok(Entry::Alone(call)) => {
                                let verdict = call.verdict(&caller).await;
                                if let (Err(error), Some(lane)) = (&verdict, &lane) {
                                    lane.failed(error);
                                }
                                verdict
                            }
                            Ok(Entry::Go(mut in_flight, call)) => {
                                let verdict = call.verdict(&caller).await;
                                if let Err(error) = &verdict {
                                    in_flight.failed(error);
                                }
                                // Frees its place: what queued meanwhile goes
                                // (or fails as this call did, unsent).
                                drop(in_flight);
                                verdict
                            }
                            Ok(Entry::Wait(waiting)) => {
                                coalesce::wait(waiting, caller.timeout).await
                            }
                            Err(error) => Err(error),
                        };
                        if let Err(error) = &verdict {
                            lead.failed(error);
                        }
                        // The checks that waited meanwhile go now (or fail
                        // as this call did, unsent).
                        drop(lead);
                        verdict
                    }));
                }
            }
        }
        let call = Call::new(&self.inner.caller, path, Kind::Check, target, cost)?;
        let caller = Arc::clone(&self.inner.caller);
        Ok(Box::pin(async move { call.verdict(&caller).await }))
    }

    /// The local budget and the state key of a check it takes: one GCRA
    /// policy of the fast path (whole microseconds), a charge, on either
    /// call path (the grant is the library's function or the same code as
    /// a script). `encoded` is the subject as keys hold it.
    fn budget_for(
        &self,
        serving: Serving,
        encoded: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<(&Arc<Budget>, KeyBytes)> {
        let budget = self.inner.budget.as_ref()?;
        let [policy] = policies else {
            return None;
        };
        let takes = cost > 0 && budget.takes(policy) && serving == Serving::WholeGcra;
        // The key's bytes on the stack: most checks only look it up (a
        // grant builds its `String`).
        takes.then(|| {
            (
                budget,
                self.inner.caller.keys.key_bytes(encoded, policy.name()),
            )
        })
    }

    /// The check's answer from the local budget (admitted from a grant, or
    /// a grant call), when the store has one and the check takes it.
    fn budget_answer(
        &self,
        serving: Serving,
        encoded: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<CheckFuture> {
        let (budget, key) = self.budget_for(serving, encoded, policies, cost)?;
        let policy = &policies[0];
        match budget.take(&key, policy, cost, self.inner.caller.clock.budget_time()) {
            Take::Local(verdict) => Some(Box::pin(std::future::ready(Ok(verdict)))),
            Take::Grant(ask) => Some(Box::pin(budget::grant(
                Arc::clone(&self.inner.caller),
                Arc::clone(budget),
                self.key(encoded, policy.name()),
                policy.clone(),
                PolicySet::new(policies, serving),
                cost,
                ask,
            ))),
            Take::Exact => None,
        }
    }

    /// A post-charge: one call of charge.lua.
    fn charge_future(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<CheckFuture, StoreError> {
        validate_charge(policies)?;
        let encoded = self.subject(subject);
        let path = self.inner.caller.scripts.path().choose(&encoded);
        let target = self.target(&encoded, policies, Serving::General);
        let call = Call::new(&self.inner.caller, path, Kind::Charge, target, cost)?;
        let caller = Arc::clone(&self.inner.caller);
        Ok(Box::pin(async move { call.verdict(&caller).await }))
    }

    /// A check with options: one call of options.lua.
    fn check_with_future(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &CheckOptions,
    ) -> Result<CheckWithFuture, StoreError> {
        let plan = options.plan(policies, cost)?;
        let encoded = self.subject(subject);
        let path = self.inner.caller.scripts.path().choose(&encoded);
        let args = OptionArgs {
            record_key: plan.record().map(|record| self.key(&encoded, record.id())),
            window_us: plan
                .record()
                .map_or(0, portcullis_core::Record::window_micros),
            free_replays: plan
                .record()
                .map_or(0, portcullis_core::Record::free_replays),
            reserves: plan.reserves().iter().copied().collect(),
        };
        let target = self.target(&encoded, policies, Serving::General);
        let call = Call::new(&self.inner.caller, path, Kind::Options(args), target, cost)?;
        let caller = Arc::clone(&self.inner.caller);
        Ok(Box::pin(async move { call.checked(&caller).await }))
    }
}
