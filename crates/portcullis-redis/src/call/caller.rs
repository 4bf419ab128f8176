//! [`Caller`]: what every call of a store needs (the pool, the timeout,
//! the clock, the key names, the scripts and the call path), and how a
//! call runs: a function or a script ([`Caller::run_either`]), once more as
//! the allow-oom twin after an `OOM` refusal, learning a Cluster node's
//! call path first when asked. [`Call`](super::Call) builds what it runs.

use std::time::Duration;

use portcullis_core::StoreError;
use redis::{Cmd, Value};

use crate::clock::ClockMode;
use crate::connection::{self, Pool};
use crate::functions::{self, CallPath};
use crate::keys::Keys;
use crate::scripts::{LuaScript, ScriptCache};

use super::reply;

/// What every call of a store needs: the pool, the timeout, the clock, the
/// key names and the scripts (with the call path).
#[derive(Debug)]
pub(crate) struct Caller {
    pub(crate) pool: Pool,
    pub(crate) timeout: Duration,
    pub(crate) clock: ClockMode,
    pub(crate) keys: Keys,
    pub(crate) scripts: ScriptCache,
}

impl Caller {
    /// The time a call passes: `None` for Redis `TIME`, else the client
    /// clock's now, in microseconds.
    pub(crate) fn now(&self) -> Option<u64> {
        self.clock.call_time()
    }

    /// A command that is not a script (`PING`, `DEL`, `CONFIG GET`).
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        connection::query(&self.pool, self.timeout, cmd).await
    }

    /// Runs a check; one refused with `OOM` runs once more as its allow-oom
    /// twin.
    pub(crate) async fn run(
        &self,
        script: &LuaScript,
        cmd: &Cmd,
        first_key: &str,
    ) -> Result<Value, StoreError> {
        // The rare paths are boxed, so that their futures do not size
        // every call's (the check's future is moved into its box whole).
        if let Some(slot) = self.scripts.path().to_learn() {
            Box::pin(self.learn_node(slot)).await;
        }
        match connection::eval(&self.pool, self.timeout, script, cmd, first_key).await {
            Ok(value) => {
                if script.is_function() {
                    self.scripts.path().loaded(first_key);
                }
                Ok(value)
            }
            // Refused at its first write (a script) or before running (a
            // function), so nothing was charged: once more, allowed to
            // update held subjects only.
            Err(error) if is_oom(&error) => {
                Box::pin(self.check_out_of_memory(script, cmd, first_key, error)).await
            }
            Err(error) => Err(error),
        }
    }

    /// A call of the library's `function` with `args` (its key count, keys
    /// and arguments, after the name), or of `script` by `EVALSHA` on that
    /// path, or once more as `script` when Redis refused the function
    /// (nothing ran); each through [`run`](Self::run), so a call refused
    /// with `OOM` runs once more as its allow-oom twin. Leases, token
    /// reservations and the local budget's grants call this way.
    pub(crate) async fn run_either(
        &self,
        function: &LuaScript,
        script: &LuaScript,
        first_key: &str,
        args: &Cmd,
    ) -> Result<Value, StoreError> {
        if self.scripts.path().choose(first_key) == CallPath::Evalsha {
            return self.run_with(script, first_key, args).await;
        }
        match self.run_with(function, first_key, args).await {
            Err(error) if self.scripts.path().refused(&error, first_key) => {
                self.run_with(script, first_key, args).await
            }
            other => other,
        }
    }

    /// [`run`](Self::run) of `script` with `args` after its name.
    async fn run_with(
        &self,
        script: &LuaScript,
        first_key: &str,
        args: &Cmd,
    ) -> Result<Value, StoreError> {
        let mut cmd = script.call_cmd();
        crate::scripts::append_args(&mut cmd, args.args_iter());
        self.run(script, &cmd, first_key).await
    }

    /// Learns which slots the Cluster node serving `slot` serves (`CLUSTER
    /// SLOTS`), after that node had no memory to load the library: its
    /// other slots then wait with it, rather than each trying to load the
    /// library. Once per deferral; a failure leaves the one slot deferred.
    #[cold]
    async fn learn_node(&self, slot: u16) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let range = match self.query(&cmd).await {
            Ok(Value::Array(ranges)) => ranges.iter().find_map(|range| match range {
                Value::Array(fields) => match (fields.first(), fields.get(1)) {
                    (Some(Value::Int(first)), Some(Value::Int(last))) => {
                        let first = u16::try_from(*first).ok()?;
                        let last = u16::try_from(*last).ok()?;
                        (first..=last).contains(&slot).then_some((first, last))
                    }
                    _ => None,
                },
                _ => None,
            }),
            _ => None,
        };
        let (first, last) = range.unwrap_or((slot, slot));
        self.scripts.path().learned(slot, first, last);
    }

    /// A check Redis refused with `OOM` (nothing was written), run once
    /// more as the script's allow-oom twin: a subject Redis holds is
    /// checked and charged exactly; one it would have to create is refused
    /// with [`StoreError::OutOfMemory`] (denied by the tower layer, like a
    /// new subject of a full `MemoryStore`). Redis before 7 cannot run the
    /// twin (its `#!lua` line is a syntax error there) and the check fails
    /// with that error.
    #[cold]
    async fn check_out_of_memory(
        &self,
        script: &LuaScript,
        cmd: &Cmd,
        first_key: &str,
        refused: StoreError,
    ) -> Result<Value, StoreError> {
        let Some(twin) = script.allow_oom() else {
            return Err(refused);
        };
        let mut retry = twin.call_cmd();
        crate::scripts::append_args(&mut retry, cmd.args_iter().skip(2));
        tracing::debug!("Redis is out of memory: checking again, for held subjects only");
        match connection::eval(&self.pool, self.timeout, twin, &retry, first_key).await {
            Ok(Value::SimpleString(status)) if status == "NOROOM" => Err(reply::out_of_memory()),
            Ok(value) => Ok(value),
            // Redis before 7 cannot compile the twin (it reads the `#!lua`
            // line as Lua): nothing can be written while it is full, so
            // every subject is refused for lack of memory, never let
            // through undecided.
            Err(error) if twin_refused(&error) => Err(reply::out_of_memory()),
            Err(error) => Err(error),
        }
    }
}

/// Whether Redis refused a check for lack of memory (`OOM`, at `maxmemory`
/// with `noeviction`).
fn is_oom(error: &StoreError) -> bool {
    if functions::is_library_not_loaded(error) {
        // The library could not be loaded: its caller runs the call as a
        // script, which Redis loads even when full.
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(redis) = crate::errors::redis_error(error) {
            // Redis before 7 answers a script whose write it refused with
            // `ERR Error running script ...: OOM command not allowed ...`.
            if redis.code() == Some("OOM") || redis.to_string().contains("OOM command not allowed")
            {
                return true;
            }
        }
        source = error.source();
    }
    matches!(error, StoreError::Protocol { detail } if detail.contains("OOM command not allowed"))
}

/// Whether the server refused to compile an allow-oom twin: Redis before 7
/// has no `#!lua` flags line ("Error compiling script ... near '#'").
fn twin_refused(error: &StoreError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(redis) = crate::errors::redis_error(error) {
            return redis.to_string().contains("Error compiling script");
        }
        source = error.source();
    }
    false
}
