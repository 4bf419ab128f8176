//! The [`LeaseStore`] impl of [`RedisStore`]: each acquire, renew and
//! release is one atomic call of `lua/lease.lua` (the library's
//! `<library>_lease` function, or its script on the EVALSHA path) on the
//! subject's lease set `<prefix>:{<subject>}:<policy>`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::{Cmd, Value};
use tollgate_core::{ConcurrencyPolicy, Lease, LeaseDecision, LeaseId, LeaseStore, StoreError};

use crate::connection;
use crate::functions::{self, CallPath};
use crate::scripts::{self, LuaScript};
use crate::store::{ints, protocol, Inner};
use crate::RedisStore;

/// The future of [`RedisStore`]'s [`LeaseStore::acquire`].
pub type AcquireFuture =
    Pin<Box<dyn Future<Output = Result<LeaseDecision, StoreError>> + Send + 'static>>;

/// The lease script (EVALSHA path), composed once per process.
fn lease_script() -> &'static LuaScript {
    static SCRIPT: OnceLock<LuaScript> = OnceLock::new();
    SCRIPT.get_or_init(scripts::lease)
}

impl RedisStore {
    /// The lease call: `<op> <now> <max> <ttl_us> <id>` on the subject's
    /// lease key; its reply as four integers, or `None` for `NOROOM` (an
    /// acquire at maxmemory that would create the key).
    fn lease_call(
        &self,
        op: &'static str,
        subject: &str,
        policy: &ConcurrencyPolicy,
        id: LeaseId,
    ) -> impl Future<Output = Result<Option<[i64; 4]>, StoreError>> + Send + 'static {
        let key = self.key_for(subject, policy.name());
        let mut args = Cmd::new();
        args.arg(op);
        self.push_now(&mut args);
        args.arg(policy.limit())
            .arg(policy.lease_ttl_micros())
            .arg(id.to_string());
        let inner = Arc::clone(&self.inner);
        async move {
            let value = match inner.scripts.path().get() {
                CallPath::Evalsha => run(&inner, lease_script(), &key, &args).await?,
                _ => {
                    let function = inner.scripts.library().lease().clone();
                    match run(&inner, &function, &key, &args).await {
                        // Redis refused FCALL or FUNCTION LOAD: nothing ran.
                        Err(error) if functions::functions_refused(&error) => {
                            inner.scripts.path().fall_back();
                            run(&inner, lease_script(), &key, &args).await?
                        }
                        other => other?,
                    }
                }
            };
            match value {
                Value::Array(items) => ints::<4>(&items).map(Some),
                Value::SimpleString(status) if status == "NOROOM" => Ok(None),
                other => Err(protocol(format!(
                    "the lease script answered {other:?}, not four integers"
                ))),
            }
        }
    }
}

fn append(cmd: &mut Cmd, args: &Cmd) {
    for arg in args.args_iter() {
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
}

/// One call of `script` (a function: `FCALL`; a script: `EVALSHA`); one
/// refused with `OOM` (nothing was written but pruning) runs once more as
/// its allow-oom twin.
async fn run(
    inner: &Inner,
    script: &LuaScript,
    key: &str,
    args: &Cmd,
) -> Result<Value, StoreError> {
    match call(inner, script, key, args).await {
        Err(error) if is_oom(&error) => match script.allow_oom() {
            Some(twin) => call(inner, twin, key, args).await,
            None => Err(error),
        },
        other => other,
    }
}

async fn call(
    inner: &Inner,
    script: &LuaScript,
    key: &str,
    args: &Cmd,
) -> Result<Value, StoreError> {
    let mut cmd = redis::cmd(if script.is_function() {
        "FCALL"
    } else {
        "EVALSHA"
    });
    cmd.arg(script.sha()).arg(1).arg(key);
    append(&mut cmd, args);
    connection::eval(&inner.pool, inner.timeout, script, &cmd, key).await
}

/// Whether Redis refused a call for lack of memory (`OOM`).
fn is_oom(error: &StoreError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(redis) = error.downcast_ref::<redis::RedisError>() {
            if redis.code() == Some("OOM") {
                return true;
            }
        }
        source = error.source();
    }
    matches!(error, StoreError::Protocol { detail } if detail.contains("OOM command not allowed"))
}

/// How long a subject Redis has no memory for is told to wait.
const OUT_OF_MEMORY_RETRY: Duration = Duration::from_secs(1);

fn no_room() -> StoreError {
    protocol("the lease script answered NOROOM to a renewal or release".to_owned())
}

fn non_negative(n: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| protocol(format!("the lease script answered {what} = {n}")))
}

impl LeaseStore for RedisStore {
    type AcquireFuture = AcquireFuture;

    fn acquire(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        id: LeaseId,
    ) -> Self::AcquireFuture {
        let max = policy.limit();
        let call = self.lease_call("a", subject, policy, id);
        Box::pin(async move {
            let Some([granted, in_flight, expiry, now]) = call.await? else {
                // At maxmemory, for a subject Redis holds no lease of.
                return Err(StoreError::OutOfMemory {
                    retry_after: OUT_OF_MEMORY_RETRY,
                });
            };
            let in_flight = non_negative(in_flight, "in_flight")?;
            let expiry = non_negative(expiry, "expiry")?;
            let now = non_negative(now, "now")?;
            Ok(if granted == 1 {
                LeaseDecision::granted(Lease::new(id, expiry), in_flight, max)
            } else {
                LeaseDecision::denied(in_flight, max, expiry.saturating_sub(now))
            })
        })
    }

    fn renew(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send + 'static {
        let call = self.lease_call("r", subject, policy, lease);
        async move {
            let [live, _, expiry, _] = call.await?.ok_or_else(no_room)?;
            Ok(if live == 1 {
                Some(non_negative(expiry, "expiry")?)
            } else {
                None
            })
        }
    }

    fn release(
        &self,
        subject: &str,
        policy: &ConcurrencyPolicy,
        lease: LeaseId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'static {
        let call = self.lease_call("d", subject, policy, lease);
        async move {
            let [released, ..] = call.await?.ok_or_else(no_room)?;
            Ok(released == 1)
        }
    }
}
