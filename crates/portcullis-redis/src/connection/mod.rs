//! Connections: a bb8 pool of multiplexed connections (standalone, or a
//! Sentinel's primary) or of Cluster connections ([`Pool`]); one command
//! on it, with a deadline and honest error mapping, is in `send.rs`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::StoreError;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use redis::sentinel::SentinelClient;
use redis::{ConnectionInfo, RedisError, Value};
use tokio::time::{timeout_at, Instant};

use crate::errors::RedisCause;

mod send;

pub(crate) use send::{eval, is_script_acl_refusal, query};

/// A standalone connection as the pool keeps it: a multiplexed connection
/// (from [`bb8_redis::RedisConnectionManager`] or a Sentinel's current
/// primary), a flag set when a call on it met a dead socket, and the
/// failure epoch it was last known good at. A clone shares the connection
/// and its flags.
#[derive(Clone)]
pub(crate) struct StandaloneConnection {
    connection: MultiplexedConnection,
    broken: Arc<AtomicBool>,
    /// The manager's failure epoch when this connection last proved alive.
    checked: Arc<AtomicU64>,
    /// The manager's failure epoch (shared): bumped by every call that met
    /// a dead socket.
    epoch: Arc<AtomicU64>,
    /// Replace this connection after a timeout (Sentinel: see
    /// `Connection::timed_out`).
    rediscover_on_timeout: bool,
}

/// Where a standalone manager gets its connections.
enum Source {
    /// bb8-redis's manager for one server URL (or an application's
    /// `redis::Client`).
    Server(bb8_redis::RedisConnectionManager),
    /// The primary a set of Sentinels names at the moment of connecting.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

/// Opens standalone connections for bb8: wraps
/// [`bb8_redis::RedisConnectionManager`] (or a Sentinel client) to keep
/// checkouts free of I/O.
///
/// bb8-redis's own manager `PING`s on every checkout to find a dead
/// multiplexed connection (one more round trip per check). This wrapper
/// instead keeps a failure epoch: a call that meets a dead socket marks
/// its connection broken (the pool drops it) and bumps the epoch, and only
/// then does each older connection get one `PING` at its next checkout. So
/// after a server restart the first call on a dead socket fails, the rest
/// find fresh connections, and a healthy server costs no extra round trip.
pub(crate) struct StandaloneManager {
    source: Source,
    connect_timeout: Duration,
    response_timeout: Duration,
    epoch: Arc<AtomicU64>,
    last_error: LastError,
}

/// The error of the last failed connection attempt (cleared by a success),
/// so a call that finds no connection says why instead of only "timed out
/// waiting for a connection from the pool".
#[derive(Clone, Default)]
pub(crate) struct LastError(Arc<std::sync::Mutex<Option<RedisError>>>);

impl LastError {
    fn record<T>(&self, result: &Result<T, RedisError>) {
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *last = result.as_ref().err().cloned();
    }

    fn get(&self) -> Option<RedisError> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// "No connection": the pool found none within the deadline; the source is
/// the last connection attempt's error.
#[derive(Debug)]
pub(crate) struct NoConnection {
    last: RedisCause,
}

impl fmt::Display for NoConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The attempt's error is the `source()`.
        f.write_str("no connection to Redis; nothing was sent (the last attempt to connect failed)")
    }
}

impl std::error::Error for NoConnection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.last)
    }
}

impl StandaloneManager {
    /// A manager for one server.
    pub(crate) fn server(
        info: ConnectionInfo,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, RedisError> {
        Ok(Self::with_source(
            Source::Server(bb8_redis::RedisConnectionManager::new(info)?),
            connect_timeout,
            response_timeout,
        ))
    }

    /// A manager for the primary `client`'s Sentinels name.
    pub(crate) fn sentinel(
        client: SentinelClient,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self::with_source(
            Source::Sentinel(tokio::sync::Mutex::new(client)),
            connect_timeout,
            response_timeout,
        )
    }

    fn with_source(source: Source, connect_timeout: Duration, response_timeout: Duration) -> Self {
        Self {
            source,
            connect_timeout,
            response_timeout,
            epoch: Arc::new(AtomicU64::new(0)),
            last_error: LastError::default(),
        }
    }

    /// The handle on this manager's last connection error.
    pub(crate) fn last_error(&self) -> LastError {
        self.last_error.clone()
    }

    async fn open(&self) -> Result<MultiplexedConnection, RedisError> {
        match &self.source {
            Source::Server(manager) => bb8::ManageConnection::connect(manager).await,
            Source::Sentinel(client) => {
                // Asks the Sentinels for the current primary each time: a
                // connection opened after a failover goes to the new one.
                let client = client.lock().await.async_get_client().await?;
                client.get_multiplexed_async_connection().await
            }
        }
    }
}

impl bb8::ManageConnection for StandaloneManager {
    type Connection = StandaloneConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let opened = match tokio::time::timeout(self.connect_timeout, self.open()).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connecting took longer than {:?}", self.connect_timeout),
            ))),
        };
        self.last_error.record(&opened);
        let mut connection = opened?;
        // The store's own deadline bounds every call; this only keeps
        // redis-rs's default from cutting a longer one short.
        connection.set_response_timeout(self.response_timeout);
        Ok(StandaloneConnection {
            connection,
            broken: Arc::new(AtomicBool::new(false)),
            checked: Arc::new(AtomicU64::new(epoch)),
            epoch: Arc::clone(&self.epoch),
            rediscover_on_timeout: matches!(self.source, Source::Sentinel(_)),
        })
    }

    async fn is_valid(&self, connection: &mut Self::Connection) -> Result<(), Self::Error> {
        if connection.broken.load(Ordering::Acquire) {
            return Err(closed());
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        if connection.checked.load(Ordering::Acquire) >= epoch {
            return Ok(());
        }
        // A call met a dead socket since this connection last proved
        // alive (a restart or failover kills every socket at once): one
        // PING before handing it out again.
        let ping = redis::cmd("PING");
        match tokio::time::timeout(
            self.connect_timeout,
            ping.query_async::<Value>(&mut connection.connection),
        )
        .await
        {
            Ok(Ok(_)) => {
                connection.checked.fetch_max(epoch, Ordering::AcqRel);
                Ok(())
            }
            Ok(Err(error)) => {
                connection.broken.store(true, Ordering::Release);
                Err(error)
            }
            Err(_) => {
                connection.broken.store(true, Ordering::Release);
                Err(closed())
            }
        }
    }

    fn has_broken(&self, connection: &mut Self::Connection) -> bool {
        connection.broken.load(Ordering::Acquire)
    }
}

fn closed() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the connection was closed",
    ))
}

/// Opens Cluster connections for bb8. A `ClusterConnection` is itself
/// multiplexed over one connection per node and reconnects to nodes on its
/// own; the pool spreads load over a few of them and keeps the same
/// checkout path as standalone.
pub(crate) struct ClusterManager {
    client: ClusterClient,
    last_error: LastError,
}

impl ClusterManager {
    pub(crate) fn new(client: ClusterClient) -> Self {
        Self {
            client,
            last_error: LastError::default(),
        }
    }

    /// The handle on this manager's last connection error.
    pub(crate) fn last_error(&self) -> LastError {
        self.last_error.clone()
    }
}

impl bb8::ManageConnection for ClusterManager {
    type Connection = ClusterConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        let opened = self.client.get_async_connection().await;
        self.last_error.record(&opened);
        opened
    }

    async fn is_valid(&self, _connection: &mut Self::Connection) -> Result<(), Self::Error> {
        Ok(())
    }

    fn has_broken(&self, _connection: &mut Self::Connection) -> bool {
        false
    }
}

/// The pool: portcullis's own (standalone or Sentinel, or Cluster), or one
/// the application built on bb8-redis.
#[derive(Clone)]
pub(crate) enum Pool {
    Standalone(bb8::Pool<StandaloneManager>, LastError),
    Cluster(bb8::Pool<ClusterManager>, LastError),
    /// The application's pool ([`RedisStoreBuilder::pool`](crate::RedisStoreBuilder::pool)):
    /// its manager decides how dead connections are found.
    External(bb8::Pool<bb8_redis::RedisConnectionManager>),
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, state) = match self {
            Self::Standalone(pool, _) => ("standalone", pool.state()),
            Self::Cluster(pool, _) => ("cluster", pool.state()),
            Self::External(pool) => ("application's bb8-redis pool", pool.state()),
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
    External(MultiplexedConnection),
}

impl Pool {
    /// Whether the pool's connections are Cluster connections.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(..))
    }

    async fn checkout(&self) -> Result<Connection, StoreError> {
        match self {
            Self::Standalone(pool, last) => {
                let pooled = pool.get().await.map_err(|e| pool_error(e, Some(last)))?;
                Ok(Connection::Standalone(pooled.clone()))
            }
            Self::Cluster(pool, last) => {
                let pooled = pool.get().await.map_err(|e| pool_error(e, Some(last)))?;
                Ok(Connection::Cluster(pooled.clone()))
            }
            Self::External(pool) => {
                let pooled = pool.get().await.map_err(|e| pool_error(e, None))?;
                Ok(Connection::External(pooled.clone()))
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
            Err(_) => Err(match self.last_error() {
                Some(last) => StoreError::unavailable(NoConnection { last: last.into() }),
                None => StoreError::unavailable(format!(
                    "no connection within {timeout:?}; nothing was sent"
                )),
            }),
        }
    }

    fn last_error(&self) -> Option<RedisError> {
        match self {
            Self::Standalone(_, last) | Self::Cluster(_, last) => last.get(),
            Self::External(_) => None,
        }
    }
}

fn pool_error(error: bb8::RunError<RedisError>, last: Option<&LastError>) -> StoreError {
    match error {
        bb8::RunError::User(error) => StoreError::unavailable(RedisCause::from(error)),
        bb8::RunError::TimedOut => match last.and_then(LastError::get) {
            Some(last) => StoreError::unavailable(NoConnection { last: last.into() }),
            None => StoreError::unavailable("timed out waiting for a connection from the pool"),
        },
    }
}
