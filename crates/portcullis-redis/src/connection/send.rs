//! One command on the pool: [`eval`] (a script or function, with the
//! `NOSCRIPT` / "Function not found" reload, redirects and one deadline)
//! and [`query`], and how a redis-rs error maps to a [`StoreError`].

use std::time::Duration;

use portcullis_core::StoreError;
use std::sync::atomic::Ordering;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::{timeout_at, Instant};

use super::{Connection, Pool};
use crate::errors::RedisCause;
use crate::scripts::LuaScript;

/// How many times a call refused with an error that proves it did not run
/// (`NOSCRIPT`, `MOVED`, `ASK`, `TRYAGAIN`) is sent again, within the same
/// deadline.
const NOT_RUN_RETRIES: usize = 6;

impl Connection {
    /// Sends `cmd` and reads its reply (a server error as `Err`). On a
    /// multiplexed connection through its inherent `send_packed_command`,
    /// whose future is part of the caller's: `Cmd::query_async` goes
    /// through the `ConnectionLike` trait, which boxes the request's
    /// future (one allocation per command, of about 1 KiB).
    async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Self::Standalone(standalone) => standalone
                .connection
                .send_packed_command(cmd)
                .await
                .and_then(Value::extract_error),
            Self::Cluster(connection) => cmd.query_async(connection).await,
            Self::External(connection) => connection
                .send_packed_command(cmd)
                .await
                .and_then(Value::extract_error),
        }
    }

    /// Sends `cmd` to the Cluster node named by a redirection, after
    /// `ASKING` for `ASK` (one pipeline, so nothing comes between them on
    /// the multiplexed connection).
    async fn query_at(&mut self, cmd: &Cmd, to: &Redirect) -> Result<Value, RedisError> {
        let Self::Cluster(connection) = self else {
            // Standalone servers never redirect; nothing to follow.
            return self.query(cmd).await;
        };
        let route = to.route();
        if !to.asking {
            // route_command hands server errors back as values.
            return connection
                .route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                .await
                .and_then(Value::extract_error);
        }
        let mut pipeline = redis::pipe();
        pipeline.cmd("ASKING").ignore();
        pipeline.add_command(cmd.clone());
        let mut values = connection.route_pipeline(pipeline, 1, 1, route).await?;
        match values.pop() {
            Some(value) if values.is_empty() => value.extract_error(),
            _ => Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "ASKING pipeline",
                format!("expected one reply, got {}", values.len() + 1),
            ))),
        }
    }

    /// Loads `script` (`SCRIPT LOAD`, or `FUNCTION LOAD REPLACE` of the
    /// library holding a function). On a Cluster, on the node that answered `NOSCRIPT`:
    /// the redirection's target if any, else the master serving `key`'s
    /// slot (a fan-out to every master would fail whenever any other master
    /// is down).
    async fn load(
        &mut self,
        script: &LuaScript,
        key: &str,
        to: Option<&Redirect>,
    ) -> Result<Value, RedisError> {
        let load = script.load_cmd();
        match self {
            Self::Standalone(standalone) => load.query_async(&mut standalone.connection).await,
            Self::External(connection) => load.query_async(connection).await,
            Self::Cluster(connection) => {
                let route = match to {
                    Some(to) => to.route(),
                    None => SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
                        Slot::for_key(key),
                        SlotAddr::Master,
                    )),
                };
                connection
                    .route_command(load, RoutingInfo::SingleNode(route))
                    .await
                    .and_then(Value::extract_error)
            }
        }
    }

    /// After a call timed out: a Sentinel-managed connection is replaced
    /// (the next one asks the Sentinels where the primary is), since a
    /// primary that stopped answering may be the one a failover is
    /// replacing (with writes paused, or partitioned away). Other
    /// connections stay: a slow server is not a dead one.
    fn timed_out(&self) {
        if let Self::Standalone(standalone) = self
            && standalone.rediscover_on_timeout
        {
            self.mark_broken();
        }
    }

    /// Marks a standalone connection broken after an I/O error (or a
    /// `READONLY` from a demoted primary) so the pool replaces it, and
    /// bumps the failure epoch so the other pooled connections are checked
    /// once before their next use.
    fn mark_broken(&self) {
        if let Self::Standalone(standalone) = self
            && !standalone.broken.swap(true, Ordering::AcqRel)
        {
            standalone.epoch.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Why the server did not run a command (so sending it again is safe).
enum NotRun {
    /// `NOSCRIPT`: load the script, then send it again.
    NoScript,
    /// `TRYAGAIN` (a multi-key command during a slot migration): send it
    /// again after a moment.
    Later,
    /// `MOVED` or `ASK`: send it to the node named (after `ASKING` for
    /// `ASK`: the slot is migrating and the keys are already there). The
    /// Cluster connection refreshes its slot map after `MOVED` on its own.
    Redirect(Redirect),
}

/// Where to send a command again.
#[derive(Debug, Clone)]
struct Redirect {
    host: String,
    port: u16,
    asking: bool,
}

/// What one attempt's error means.
enum Failure {
    /// The server proves it did not run the command.
    NotRun { why: NotRun, error: RedisError },
    /// Give up with this error.
    Fail(StoreError),
}

impl Redirect {
    /// The route to the node named.
    fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::ByAddress {
            host: self.host.clone(),
            port: self.port,
        }
    }
}

/// The node of a `MOVED` or `ASK` error.
fn redirect(error: &RedisError, asking: bool) -> Option<Redirect> {
    let (address, _slot) = error.redirect_node()?;
    let (host, port) = address.rsplit_once(':')?;
    Some(Redirect {
        host: host.to_owned(),
        port: port.parse().ok()?,
        asking,
    })
}

/// Classifies an error returned by a command that was handed to the
/// connection.
fn classify(error: RedisError, connection: &Connection, timeout: Duration) -> Failure {
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::NoScript) => Failure::NotRun {
            why: NotRun::NoScript,
            error,
        },
        ErrorKind::Server(ServerErrorKind::TryAgain) => Failure::NotRun {
            why: NotRun::Later,
            error,
        },
        ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask))
            if matches!(connection, Connection::Cluster(_)) =>
        {
            match redirect(&error, kind == ServerErrorKind::Ask) {
                Some(to) => Failure::NotRun {
                    why: NotRun::Redirect(to),
                    error,
                },
                None => Failure::Fail(StoreError::unavailable(RedisCause::from(error))),
            }
        }
        // A primary demoted by a failover (Sentinel): refused before
        // running; the connection goes, and the next one asks the
        // Sentinels where the primary is now.
        ErrorKind::Server(ServerErrorKind::ReadOnly) => {
            connection.mark_broken();
            Failure::Fail(StoreError::unavailable(RedisCause::from(error)))
        }
        // Refused before running: nothing was charged.
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::NoPerm
            | ServerErrorKind::CrossSlot,
        )
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig => {
            Failure::Fail(StoreError::unavailable(RedisCause::from(error)))
        }
        // Not logged in (`NOAUTH`, after a server's password changed) or an
        // ACL refusal, also of a command a script calls (the scripts call
        // `TIME` and read before they write, so a refused script wrote
        // nothing): refused before anything was charged.
        _ if matches!(error.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
            || is_script_acl_refusal(&error) =>
        {
            Failure::Fail(StoreError::unavailable(RedisCause::from(error)))
        }
        // BUSY (another script runs too long) and OOM (refused at the first
        // write, so nothing was written) are refusals too.
        ErrorKind::Extension if matches!(error.code(), Some("BUSY" | "OOM" | "NOREPLICAS")) => {
            Failure::Fail(StoreError::unavailable(RedisCause::from(error)))
        }
        ErrorKind::Io if error.is_timeout() => {
            connection.timed_out();
            Failure::Fail(StoreError::Timeout { after: timeout })
        }
        ErrorKind::Io if error.is_connection_refusal() => {
            connection.mark_broken();
            Failure::Fail(StoreError::unavailable(RedisCause::from(error)))
        }
        ErrorKind::Io => {
            connection.mark_broken();
            Failure::Fail(StoreError::outcome_unknown(RedisCause::from(error)))
        }
        _ => Failure::Fail(StoreError::rejected(RedisCause::from(error))),
    }
}

/// Whether the server refused a command a script called because of the
/// user's ACL ("The user executing the script can't run this command").
pub(crate) fn is_script_acl_refusal(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.contains("can't run this command"))
}

/// Whether a server answered `FCALL` with "Function not found".
fn function_missing(error: &RedisError) -> bool {
    error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// Runs `evalsha` (an `EVALSHA` of `script` whose first key is
/// `first_key`, or an `FCALL` of a function), and after `NOSCRIPT` (or
/// "Function not found") a `SCRIPT LOAD` (`FUNCTION LOAD REPLACE`) and the
/// call again. Nothing that may have run is sent twice. Everything, pool
/// checkout included, shares one deadline of `timeout`.
pub(crate) async fn eval(
    pool: &Pool,
    timeout: Duration,
    script: &LuaScript,
    evalsha: &Cmd,
    first_key: &str,
) -> Result<Value, StoreError> {
    let deadline = Instant::now() + timeout;
    let mut connection = pool.checkout_by(deadline, timeout).await?;
    let mut attempts = 0;
    let mut redirected: Option<Redirect> = None;
    loop {
        let sent = match &redirected {
            // Boxed: a redirection is rare, and its future (a Cluster
            // route) would otherwise size every call's future.
            Some(to) => timeout_at(deadline, Box::pin(connection.query_at(evalsha, to))).await,
            None => timeout_at(deadline, connection.query(evalsha)).await,
        };
        let error = match sent {
            Err(_) => {
                connection.timed_out();
                return Err(StoreError::Timeout { after: timeout });
            }
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => error,
        };
        let (why, error) = if script.is_function() && function_missing(&error) {
            // `FCALL` of a function the node does not have (FUNCTION
            // FLUSH, a restart, a failover, a new node): nothing ran.
            (NotRun::NoScript, error)
        } else {
            match classify(error, &connection, timeout) {
                Failure::Fail(error) => return Err(error),
                Failure::NotRun { why, error } => (why, error),
            }
        };
        attempts += 1;
        if attempts > NOT_RUN_RETRIES {
            return Err(StoreError::unavailable(RedisCause::from(error)));
        }
        match why {
            NotRun::NoScript => {
                tracing::debug!(
                    name = script.sha(),
                    "NOSCRIPT or no such function: loading it"
                );
                // Boxed, as a redirection is: loading is rare.
                match timeout_at(
                    deadline,
                    Box::pin(connection.load(script, first_key, redirected.as_ref())),
                )
                .await
                {
                    // The check itself has not run yet: nothing was charged.
                    Err(_) => {
                        return Err(StoreError::unavailable(format!(
                            "loading the script took longer than {timeout:?}; the check was not run"
                        )))
                    }
                    // A node at maxmemory with noeviction refuses `FUNCTION
                    // LOAD` (scripts still load): the caller runs the call
                    // as a script instead.
                    Ok(Err(error)) if script.is_function() && error.code() == Some("OOM") => {
                        return Err(StoreError::unavailable(crate::functions::LibraryNotLoaded(
                            error.into(),
                        )));
                    }
                    Ok(Err(error)) => {
                        if error.is_io_error() {
                            connection.mark_broken();
                        }
                        return Err(StoreError::unavailable(RedisCause::from(error)));
                    }
                    Ok(Ok(_)) => {}
                }
            }
            NotRun::Redirect(to) => {
                tracing::debug!(?to, "following a Cluster redirection");
                redirected = Some(to);
            }
            NotRun::Later => {
                redirected = None;
                let pause = Duration::from_millis(5 * attempts as u64);
                if Instant::now() + pause >= deadline {
                    return Err(StoreError::unavailable(RedisCause::from(error)));
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Runs a plain command under the deadline (no retries). Used for `DEL`,
/// `PING` and the rate limiter's configuration.
pub(crate) async fn query(pool: &Pool, timeout: Duration, cmd: &Cmd) -> Result<Value, StoreError> {
    let deadline = Instant::now() + timeout;
    let mut connection = pool.checkout_by(deadline, timeout).await?;
    match timeout_at(deadline, connection.query(cmd)).await {
        Err(_) => {
            connection.timed_out();
            Err(StoreError::Timeout { after: timeout })
        }
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => match classify(error, &connection, timeout) {
            Failure::Fail(error) => Err(error),
            Failure::NotRun { error, .. } => Err(StoreError::unavailable(RedisCause::from(error))),
        },
    }
}
