//! Connections: a bb8 pool of multiplexed connections (standalone) or of
//! Cluster connections, and one call with a deadline and honest error
//! mapping.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError,
    ServerErrorKind, Value,
};
use tokio::time::{timeout_at, Instant};
use tollgate_core::StoreError;

use crate::scripts::LuaScript;

/// How many times a call refused with an error that proves it did not run
/// (`NOSCRIPT`, `MOVED`, `ASK`, `TRYAGAIN`) is sent again, within the same
/// deadline.
const NOT_RUN_RETRIES: usize = 6;

/// A standalone connection as the pool keeps it: a multiplexed connection
/// and a flag its driver task sets when the socket closes, so the pool
/// replaces dead connections without a round trip. A clone shares the
/// connection and its flag.
#[derive(Clone)]
pub(crate) struct StandaloneConnection {
    connection: MultiplexedConnection,
    closed: Arc<AtomicBool>,
}

/// Opens standalone connections for bb8.
///
/// Not `bb8_redis::RedisConnectionManager`: that manager can only find a
/// dead multiplexed connection with a `PING` per checkout (one more round
/// trip per check) and otherwise keeps handing it out after a server
/// restart. This one spawns the connection's driver itself and marks the
/// connection broken the moment the driver ends.
pub(crate) struct StandaloneManager {
    info: ConnectionInfo,
    connect_timeout: Duration,
}

impl StandaloneManager {
    pub(crate) fn new(info: ConnectionInfo, connect_timeout: Duration) -> Self {
        Self {
            info,
            connect_timeout,
        }
    }

    async fn open(&self) -> Result<StandaloneConnection, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None);
        let closed = Arc::new(AtomicBool::new(false));
        let connection = match self.info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                let (connection, driver) = MultiplexedConnection::new_with_config(
                    self.info.redis_settings(),
                    stream,
                    config,
                )
                .await?;
                spawn_driver(driver, Arc::clone(&closed));
                connection
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await?;
                let (connection, driver) = MultiplexedConnection::new_with_config(
                    self.info.redis_settings(),
                    stream,
                    config,
                )
                .await?;
                spawn_driver(driver, Arc::clone(&closed));
                connection
            }
            other => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "unsupported address",
                    format!(
                        "{other}: tollgate-redis connects over TCP (redis://) or Unix sockets (redis+unix://)"
                    ),
                )))
            }
        };
        Ok(StandaloneConnection { connection, closed })
    }
}

fn spawn_driver(
    driver: impl std::future::Future<Output = ()> + Send + 'static,
    closed: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        driver.await;
        closed.store(true, Ordering::Release);
    });
}

impl bb8::ManageConnection for StandaloneManager {
    type Connection = StandaloneConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        match tokio::time::timeout(self.connect_timeout, self.open()).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connecting took longer than {:?}", self.connect_timeout),
            ))),
        }
    }

    async fn is_valid(&self, connection: &mut Self::Connection) -> Result<(), Self::Error> {
        if connection.closed.load(Ordering::Acquire) {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the connection was closed",
            )))
        } else {
            Ok(())
        }
    }

    fn has_broken(&self, connection: &mut Self::Connection) -> bool {
        connection.closed.load(Ordering::Acquire)
    }
}

/// Opens Cluster connections for bb8. A `ClusterConnection` is itself
/// multiplexed over one connection per node and reconnects to nodes on its
/// own; the pool spreads load over a few of them and keeps the same
/// checkout path as standalone.
pub(crate) struct ClusterManager {
    client: ClusterClient,
}

impl ClusterManager {
    pub(crate) fn new(client: ClusterClient) -> Self {
        Self { client }
    }
}

impl bb8::ManageConnection for ClusterManager {
    type Connection = ClusterConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        self.client.get_async_connection().await
    }

    async fn is_valid(&self, _connection: &mut Self::Connection) -> Result<(), Self::Error> {
        Ok(())
    }

    fn has_broken(&self, _connection: &mut Self::Connection) -> bool {
        false
    }
}

/// The pool, standalone or Cluster.
#[derive(Clone)]
pub(crate) enum Pool {
    Standalone(bb8::Pool<StandaloneManager>),
    Cluster(bb8::Pool<ClusterManager>),
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, state) = match self {
            Self::Standalone(pool) => ("standalone", pool.state()),
            Self::Cluster(pool) => ("cluster", pool.state()),
        };
        f.debug_struct("Pool")
            .field("kind", &kind)
            .field("connections", &state.connections)
            .field("idle", &state.idle_connections)
            .finish()
    }
}

/// A connection taken from the pool. The pooled connection goes back at
/// once: connections are multiplexed, so many calls share one.
pub(crate) enum Connection {
    Standalone(StandaloneConnection),
    Cluster(ClusterConnection),
}

impl Pool {
    async fn checkout(&self) -> Result<Connection, StoreError> {
        match self {
            Self::Standalone(pool) => {
                let pooled = pool.get().await.map_err(pool_error)?;
                Ok(Connection::Standalone(pooled.clone()))
            }
            Self::Cluster(pool) => {
                let pooled = pool.get().await.map_err(pool_error)?;
                Ok(Connection::Cluster(pooled.clone()))
            }
        }
    }

    /// Checks a connection out before `deadline` (`timeout` from the start
    /// of the call).
    async fn checkout_by(
        &self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Connection, StoreError> {
        match timeout_at(deadline, self.checkout()).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::unavailable(format!(
                "no connection within {timeout:?}; nothing was sent"
            ))),
        }
    }
}

fn pool_error(error: bb8::RunError<RedisError>) -> StoreError {
    match error {
        bb8::RunError::User(error) => StoreError::unavailable(error),
        bb8::RunError::TimedOut => {
            StoreError::unavailable("timed out waiting for a connection from the pool")
        }
    }
}

impl Connection {
    async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Self::Standalone(standalone) => cmd.query_async(&mut standalone.connection).await,
            Self::Cluster(connection) => cmd.query_async(connection).await,
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

    /// Marks a standalone connection broken after an I/O error so the pool
    /// replaces it.
    fn mark_broken(&self) {
        if let Self::Standalone(standalone) = self {
            standalone.closed.store(true, Ordering::Release);
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
                None => Failure::Fail(StoreError::unavailable(error)),
            }
        }
        // Refused before running: nothing was charged.
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::NoPerm
            | ServerErrorKind::CrossSlot,
        )
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig => Failure::Fail(StoreError::unavailable(error)),
        // BUSY (another script runs too long) and OOM (refused at the first
        // write, so nothing was written) are refusals too.
        ErrorKind::Extension if matches!(error.code(), Some("BUSY" | "OOM" | "NOREPLICAS")) => {
            Failure::Fail(StoreError::unavailable(error))
        }
        ErrorKind::Io if error.is_timeout() => {
            Failure::Fail(StoreError::Timeout { after: timeout })
        }
        ErrorKind::Io if error.is_connection_refusal() => {
            connection.mark_broken();
            Failure::Fail(StoreError::unavailable(error))
        }
        ErrorKind::Io => {
            connection.mark_broken();
            Failure::Fail(StoreError::outcome_unknown(error))
        }
        _ => Failure::Fail(StoreError::Protocol {
            detail: error.to_string(),
        }),
    }
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
            Some(to) => timeout_at(deadline, connection.query_at(evalsha, to)).await,
            None => timeout_at(deadline, connection.query(evalsha)).await,
        };
        let error = match sent {
            Err(_) => return Err(StoreError::Timeout { after: timeout }),
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
            return Err(StoreError::unavailable(error));
        }
        match why {
            NotRun::NoScript => {
                tracing::debug!(
                    name = script.sha(),
                    "NOSCRIPT or no such function: loading it"
                );
                match timeout_at(
                    deadline,
                    connection.load(script, first_key, redirected.as_ref()),
                )
                .await
                {
                    // The check itself has not run yet: nothing was charged.
                    Err(_) => {
                        return Err(StoreError::unavailable(format!(
                            "loading the script took longer than {timeout:?}; the check was not run"
                        )))
                    }
                    Ok(Err(error)) => {
                        if error.is_io_error() {
                            connection.mark_broken();
                        }
                        return Err(StoreError::unavailable(error));
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
                    return Err(StoreError::unavailable(error));
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
        Err(_) => Err(StoreError::Timeout { after: timeout }),
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => match classify(error, &connection, timeout) {
            Failure::Fail(error) => Err(error),
            Failure::NotRun { error, .. } => Err(StoreError::unavailable(error)),
        },
    }
}
