//! Token reservations: the [`ReservationStore`] impl of [`RedisStore`].
//! A reserve, a settle and a renew are each one atomic call of
//! `lua/reserve.lua` (the library's `reserve` function by `FCALL`, or the
//! script by `EVALSHA` where Redis refuses Functions; at maxmemory the
//! allow-oom twin settles and renews, and refuses a new reservation) on the
//! reservation's record `<prefix>:{<subject>}:rsv:<budget>:<id>`, the
//! budget's open set `<prefix>:{<subject>}:rsv:<budget>` and the states
//! of the budget's policies, all in the subject's hash slot.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use portcullis_core::{
    validate_reserve, validate_settle, Refusal, ReservationId, ReservationStore, Reserved,
    SettleOutcome, Settlement, StoreError, TokenBudget,
};
use redis::{Cmd, Value};

use super::RedisStore;
use crate::call::push_time;
use crate::call::reply::{parse_verdict, protocol};
use crate::scripts::{self, Library, LuaScript};

/// The reservation script, composed once per process.
fn reserve_script() -> &'static LuaScript {
    static SCRIPT: OnceLock<LuaScript> = OnceLock::new();
    SCRIPT.get_or_init(scripts::reserve)
}

/// One reservation call: the keys and arguments reserve.lua reads (after
/// `FCALL <function>` or `EVALSHA <sha>`).
struct ReservationCall {
    args: Cmd,
    first_key: String,
    capacities: Vec<u64>,
}

impl RedisStore {
    /// The Redis key of the open reservations of `subject` under the
    /// budget `budget_name`: `<prefix>:{<subject>}:rsv:<budget_name>`
    /// (each reservation's record is that key, `:` and its id). Policy
    /// names hold no `:`, so no policy's key is ever one of these.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// // With lazy_connect, this runs without a server.
    /// let store = portcullis::redis::RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// assert_eq!(store.reservation_key_for("key-7", "tokens"), "portcullis:{key-7}:rsv:tokens");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn reservation_key_for(&self, subject: &str, budget_name: &str) -> String {
        self.key_for(subject, &format!("rsv:{budget_name}"))
    }

    /// The call of `op` for `policies` (the budget's, or its token
    /// policies for a settle or a renew) with the operation's two numbers.
    fn reservation_call(
        &self,
        op: &'static str,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
        numbers: (u64, u64),
    ) -> Result<ReservationCall, StoreError> {
        let policies = if op == "r" {
            budget.policies()
        } else {
            budget.token_policies()
        };
        let subject = self.subject(subject);
        let set = self.key(&subject, &format!("rsv:{}", budget.name()));
        let record = format!("{set}:{id}");
        let letters = Library::letters(policies.iter().map(|p| p.algorithm()))?;
        let mut cmd = Cmd::new();
        cmd.arg(2 + policies.len());
        cmd.arg(&record).arg(&set);
        for policy in policies {
            cmd.arg(self.key(&subject, policy.name()));
        }
        cmd.arg(op).arg(letters.as_slice());
        push_time(&mut cmd, self.inner.caller.now());
        cmd.arg(budget.token_policies().len())
            .arg(numbers.0)
            .arg(numbers.1)
            .arg(budget.reservation_ttl_micros())
            .arg(id.to_string());
        for policy in policies {
            cmd.arg(&**policy.shape_argument());
        }
        Ok(ReservationCall {
            args: cmd,
            first_key: record,
            capacities: policies.iter().map(|p| p.capacity()).collect(),
        })
    }

    /// Runs a call; its reply's head (`N` integers) and its decisions.
    fn run_reservation<const N: usize>(
        &self,
        call: Result<ReservationCall, StoreError>,
    ) -> impl Future<Output = Result<([i64; N], portcullis_core::Verdict), StoreError>>
           + Send
           + 'static
           + use<N> {
        let caller = Arc::clone(&self.inner.caller);
        async move {
            let call = call?;
            let value = caller
                .run_either(
                    caller.scripts.library().reserve(),
                    reserve_script(),
                    &call.first_key,
                    &call.args,
                )
                .await?;
            let Value::Array(mut items) = value else {
                return Err(protocol(format!(
                    "the reservation script answered {value:?}, not an array"
                )));
            };
            if items.len() < N {
                return Err(protocol(format!(
                    "the reservation script answered {} items",
                    items.len()
                )));
            }
            let rest = items.split_off(N);
            let head = crate::call::reply::ints::<N>(&items)?;
            let verdict = parse_verdict(Value::Array(rest), &call.capacities)?;
            Ok((head, verdict))
        }
    }
}

fn non_negative(n: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| protocol(format!("the reservation script answered {what} = {n}")))
}

impl ReservationStore for RedisStore {
    fn reserve(
        &self,
        subject: &str,
        budget: &TokenBudget,
        estimate: u64,
        id: ReservationId,
    ) -> impl Future<Output = Result<Reserved, StoreError>> + Send + 'static {
        let max = budget.max_in_flight();
        let call = validate_reserve(budget, estimate).and_then(|estimate| {
            self.reservation_call("r", subject, budget, id, (estimate, max.unwrap_or(0)))
        });
        let run = self.run_reservation::<3>(call);
        async move {
            let ([status, in_flight, retry], verdict) = run.await?;
            let in_flight = non_negative(in_flight, "in_flight")?;
            match status {
                1 | 2 => Ok(Reserved::admitted(verdict, in_flight, status == 2)),
                0 => Ok(Reserved::refused_by_policy(verdict, in_flight)),
                3 => {
                    let retry = Duration::from_micros(non_negative(retry, "retry_after")?);
                    let refusal = Refusal::InFlight {
                        max: max.unwrap_or(0),
                    };
                    Ok(Reserved::refused(verdict, refusal, in_flight, Some(retry)))
                }
                other => Err(protocol(format!(
                    "the reservation script answered status {other}"
                ))),
            }
        }
    }

    fn settle(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
        used: u64,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send + 'static {
        let call = validate_settle(budget, used).and_then(|used| {
            self.reservation_call("s", subject, budget, id, (used, budget.max_overage()))
        });
        let run = self.run_reservation::<4>(call);
        async move {
            let ([status, estimate, used, overage], verdict) = run.await?;
            let outcome = match status {
                1 => SettleOutcome::Settled,
                2 => SettleOutcome::Replayed,
                0 => SettleOutcome::Unknown,
                other => {
                    return Err(protocol(format!(
                        "the reservation script answered status {other}"
                    )))
                }
            };
            Ok(Settlement::new(
                outcome,
                non_negative(estimate, "estimate")?,
                non_negative(used, "used")?,
                non_negative(overage, "overage")?,
                verdict,
            ))
        }
    }

    fn renew(
        &self,
        subject: &str,
        budget: &TokenBudget,
        id: ReservationId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static {
        let call = self.reservation_call("n", subject, budget, id, (0, 0));
        let run = self.run_reservation::<1>(call);
        async move {
            let ([status], _) = run.await?;
            match status {
                1 => Ok(true),
                0 => Ok(false),
                other => Err(protocol(format!(
                    "the reservation script answered status {other} to a renew"
                ))),
            }
        }
    }
}
