//! Concurrency leases (not the local budget's grants): the
//! [`LeaseStore`] impl of [`RedisStore`]. Each acquire, renew and release
//! is one atomic call of `lua/lease.lua` (the library's `<library>_lease`
//! function, or its script on the EVALSHA path) on the subject's lease set
//! `<prefix>:{<subject>}:lease:<policy>` (see [`RedisStore::lease_key_for`]).

use std::future::Future;
use std::sync::{Arc, OnceLock};

use portcullis_core::{ConcurrencyPolicy, Lease, LeaseDecision, LeaseId, LeaseStore, StoreError};
use redis::{Cmd, Value};

use super::RedisStore;
use crate::call::push_time;
use crate::call::reply::{ints, protocol};
use crate::scripts::{self, LuaScript};

/// The future of [`RedisStore`]'s [`LeaseStore::acquire`]: the core's
/// boxed acquire future.
pub(crate) type AcquireFuture = portcullis_core::BoxAcquireFuture;

/// The lease script (EVALSHA path), composed once per process.
fn lease_script() -> &'static LuaScript {
    static SCRIPT: OnceLock<LuaScript> = OnceLock::new();
    SCRIPT.get_or_init(scripts::lease)
}

impl RedisStore {
    /// The Redis key of `subject`'s leases under the concurrency policy
    /// `policy_name`: `<prefix>:{<subject>}:lease:<policy_name>`. Policy
    /// names hold no `:`, so no rate policy's key (`<prefix>:{<subject>}:<name>`)
    /// is ever a lease key, whatever the two policies are called.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// // With lazy_connect, this runs without a server.
    /// let store = portcullis::redis::RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// assert_eq!(store.lease_key_for("tenant-7", "exports"), "portcullis:{tenant-7}:lease:exports");
    /// assert_ne!(store.lease_key_for("tenant-7", "api"), store.key_for("tenant-7", "api"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn lease_key_for(&self, subject: &str, policy_name: &str) -> String {
        let mut name = String::with_capacity(6 + policy_name.len());
        name.push_str("lease:");
        name.push_str(policy_name);
        self.key_for(subject, &name)
    }

    /// The lease call: `<op> <now> <max> <ttl_us> <id>` on the subject's
    /// lease key; its reply as four integers. At maxmemory an acquire
    /// that would create the key is refused with `OutOfMemory`
    /// ([`Caller::run_either`](crate::call::Caller::run_either): the allow-oom twin answers `NOROOM`).
    fn lease_call(
        &self,
        op: &'static str,
        subject: &str,
        policy: &ConcurrencyPolicy,
        id: LeaseId,
    ) -> impl Future<Output = Result<[i64; 4], StoreError>> + Send + 'static + use<> {
        let key = self.lease_key_for(subject, policy.name());
        let mut args = Cmd::new();
        args.arg(1).arg(&key).arg(op);
        push_time(&mut args, self.inner.caller.now());
        args.arg(policy.limit())
            .arg(policy.lease_ttl_micros())
            .arg(id.to_string());
        let caller = Arc::clone(&self.inner.caller);
        async move {
            let value = caller
                .run_either(
                    caller.scripts.library().lease(),
                    lease_script(),
                    &key,
                    &args,
                )
                .await?;
            match value {
                Value::Array(items) => ints::<4>(&items),
                other => Err(protocol(format!(
                    "the lease script answered {other:?}, not four integers"
                ))),
            }
        }
    }
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
            let [granted, in_flight, expiry, now] = call.await?;
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
            let [live, _, expiry, _] = call.await?;
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
            let [released, ..] = call.await?;
            Ok(released == 1)
        }
    }
}
