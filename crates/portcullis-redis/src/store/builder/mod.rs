//! `RedisStoreBuilder`: where the store connects (URL, Cluster, Sentinel, an
//! application's client or pool), credentials and TLS, and the check at
//! `build()` that the server is reachable and lets portcullis do its work.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;

use super::{Inner, RedisStore};
use crate::budget::{Budget, LocalBudget};
use crate::call::Caller;
use crate::clock::ClockMode;
use crate::coalesce::{Coalescer, Lane};
use crate::errors::BuildError;
use crate::keys::{Keys, MAX_PREFIX_LEN};
use crate::redact::redact_url;
use crate::scripts::ScriptCache;
use crate::tls::TlsFiles;

mod clock;
mod connect;
mod verify;

pub use clock::DEFAULT_CLIENT_CLOCK_TOLERANCE;

/// Default per-call timeout: [`RedisStoreBuilder::timeout`]. Chosen from
/// measurements on a 2-core box (`latency` in portcullis's tests crate): with
/// four busy threads and 1024 checks in flight the slowest check took
/// 164 ms (3 030 of 338 690 over 100 ms, the old default, none over 250 ms).
/// Not API (the value is documented on the setter); public, hidden, for
/// the workspace's reliability tests.
#[doc(hidden)]
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Default time to open a connection: [`RedisStoreBuilder::connect_timeout`].
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default number of pooled connections: [`RedisStoreBuilder::pool_size`].
pub(crate) const DEFAULT_POOL_SIZE: u32 = 4;
/// Default key prefix: [`RedisStoreBuilder::prefix`].
pub(crate) const DEFAULT_PREFIX: &str = "portcullis";

/// The application's bb8-redis pool, as [`RedisStoreBuilder::pool`] takes it.
pub type RedisPool = bb8::Pool<bb8_redis::RedisConnectionManager>;

#[derive(Clone)]
enum Target {
    Standalone(String),
    Cluster(Vec<String>),
    Sentinel { master: String, urls: Vec<String> },
    Client(Box<redis::Client>),
    ClusterClient(Box<ClusterClient>),
    Pool(RedisPool),
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standalone(url) => f.debug_tuple("Standalone").field(&redact_url(url)).finish(),
            Self::Cluster(urls) => f
                .debug_tuple("Cluster")
                .field(&urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>())
                .finish(),
            Self::Sentinel { master, urls } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field(
                    "urls",
                    &urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
                )
                .finish(),
            Self::Client(client) => f
                .debug_tuple("Client")
                .field(&client.get_connection_info().addr().to_string())
                .finish(),
            Self::ClusterClient(_) => f.write_str("ClusterClient"),
            Self::Pool(pool) => f.debug_tuple("Pool").field(&pool.state()).finish(),
        }
    }
}

/// Builder for a [`RedisStore`]; start with [`RedisStore::builder`].
///
/// `build()` connects once and checks that the server lets portcullis work
/// (credentials, ACL permissions); see [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use portcullis::redis::RedisStore;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = RedisStore::builder()
///     .url("redis://127.0.0.1:6379")
///     .username("app") // an ACL user (or put it in the URL)
///     .password("s3cret") // never printed by Debug
///     .prefix("myapp-limits")
///     .pool_size(4)
///     .timeout(Duration::from_millis(50))
///     .hash_subjects(true) // subjects are API tokens: never store them
///     .lazy_connect(true) // this example runs without a server
///     .build()
///     .await?;
/// assert_eq!(store.prefix(), "myapp-limits");
/// assert!(!format!("{store:?}").contains("s3cret"));
/// # Ok::<(), portcullis::redis::BuildError>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
#[must_use = "a RedisStoreBuilder does nothing until .build() is awaited"]
pub struct RedisStoreBuilder {
    target: Option<Target>,
    pool_size: u32,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    clock: ClockMode,
    client_clock_tolerance: Duration,
    hash_subjects: bool,
    username: Option<String>,
    password: Option<String>,
    tls: TlsFiles,
    lazy: bool,
    coalesce: bool,
    budget: Option<LocalBudget>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("target", &self.target)
            .field("pool_size", &self.pool_size)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("clock", &self.clock)
            .field("client_clock_tolerance", &self.client_clock_tolerance)
            .field("hash_subjects", &self.hash_subjects)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls_ca", &self.tls.ca.as_ref().map(|_| "<set>"))
            .field(
                "tls_client_cert",
                &self.tls.client.as_ref().map(|_| "<set>"),
            )
            .field("lazy_connect", &self.lazy)
            .field("coalesce", &self.coalesce)
            .field("local_budget", &self.budget)
            .finish()
    }
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            target: None,
            pool_size: DEFAULT_POOL_SIZE,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            clock: ClockMode::Redis,
            client_clock_tolerance: DEFAULT_CLIENT_CLOCK_TOLERANCE,
            hash_subjects: false,
            username: None,
            password: None,
            tls: TlsFiles::default(),
            lazy: false,
            coalesce: true,
            budget: None,
        }
    }
}

impl RedisStoreBuilder {
    /// A standalone server (or a proxy such as Envoy or twemproxy that
    /// forwards `EVALSHA`): `redis://[[user]:password@]host[:port][/db]`,
    /// `rediss://…` for TLS (feature `tls`), or
    /// `redis+unix:///path/to/socket`. `redis://:password@host` is a
    /// password-only server (`requirepass`), `redis://user:password@host`
    /// an ACL user. Replaces any earlier target.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Some(Target::Standalone(url.into()));
        self
    }

    /// A Redis Cluster, given the URLs of some of its nodes (the rest are
    /// discovered); `rediss://` for TLS. Replaces any earlier target.
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Some(Target::Cluster(urls.into_iter().map(Into::into).collect()));
        self
    }

    /// A primary managed by Redis Sentinel: the master's name (as in
    /// `sentinel monitor <name> …`) and the URLs of some Sentinels
    /// (`redis://host:26379`, `redis://:password@host:26379` when the
    /// Sentinels need a password, `rediss://` when they and the data nodes
    /// speak TLS). Every new connection asks the Sentinels for the current
    /// primary, so the store follows a failover without a restart: the
    /// old primary's connections break (Sentinel kills them, or it answers
    /// `READONLY`) and are replaced. The primary's credentials are
    /// [`username`](Self::username) and [`password`](Self::password).
    /// Replaces any earlier target.
    pub fn sentinel<I, S>(mut self, master_name: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Some(Target::Sentinel {
            master: master_name.into(),
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// A `redis::Client` the application configured itself (TLS, a custom
    /// DNS name, …). Its connection settings are used by portcullis's pool
    /// (bb8-redis underneath). Replaces any earlier target.
    pub fn client(mut self, client: redis::Client) -> Self {
        self.target = Some(Target::Client(Box::new(client)));
        self
    }

    /// A `redis::cluster::ClusterClient` the application configured itself.
    /// Build it with `.retries(0)`: portcullis resends only what a node proves
    /// it did not run, and the client's own retries could charge a check
    /// twice. Replaces any earlier target.
    pub fn cluster_client(mut self, client: ClusterClient) -> Self {
        self.target = Some(Target::ClusterClient(Box::new(client)));
        self
    }

    /// A bb8-redis pool the application already has (for example shared
    /// with its own Redis calls). Its manager decides how dead connections
    /// are found: bb8-redis's `PING`s on checkout when `test_on_check_out`
    /// is on (bb8's default), one more round trip per check; portcullis's own
    /// pool avoids that. [`pool_size`](Self::pool_size),
    /// [`connect_timeout`](Self::connect_timeout), credentials and TLS
    /// settings do not apply. Replaces any earlier target.
    pub fn pool(mut self, pool: RedisPool) -> Self {
        self.target = Some(Target::Pool(pool));
        self
    }

    /// The ACL user to authenticate as (default: the one in the URL, else
    /// `default`). Overrides the URL's.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The password (of [`username`](Self::username), or of `default` on a
    /// password-only server). Overrides the URL's. Never printed: `Debug`
    /// shows `<redacted>`, and URLs in errors and logs have their password
    /// replaced by `***`.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// A CA certificate (PEM) to trust for `rediss://` instead of the
    /// system's roots: for a private CA (self-hosted Redis, some managed
    /// services). Needs the `tls` feature.
    pub fn tls_ca(mut self, ca_pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(ca_pem.into());
        self
    }

    /// A client certificate chain and its private key (both PEM) for mutual
    /// TLS (`tls-auth-clients yes`). Needs the `tls` feature. Never printed.
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Build without connecting (default `false`). Normally
    /// [`build`](Self::build) connects once and checks credentials and
    /// permissions; with `true` it only validates the settings, connections
    /// open in the background and problems show as [`StoreError`]s on the
    /// first calls. For tests and for apps that must start while Redis is
    /// down.
    ///
    /// [`StoreError`]: portcullis_core::StoreError
    pub fn lazy_connect(mut self, lazy: bool) -> Self {
        self.lazy = lazy;
        self
    }

    /// How many connections the pool keeps open. Default: 4. Connections
    /// are multiplexed: every call pipelines on a shared connection, so a
    /// few are enough: with the default 4, `cargo xtask bench redis` measured about 59,000 checks per
    /// second from 50 tasks on a 2-core machine.
    pub fn pool_size(mut self, pool_size: u32) -> Self {
        self.pool_size = pool_size;
        self
    }

    /// The first part of every key (default `portcullis`): keys are
    /// `<prefix>:{<subject>}:<policy>`. 1 to [`MAX_PREFIX_LEN`] printable
    /// ASCII characters without `{`, `}` or spaces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The most one call may take, pool checkout and any `NOSCRIPT` reload
    /// included (default 250 ms: long enough that a loaded machine does not
    /// time out healthy calls and fail open, short enough that a stuck
    /// server is noticed; the tower layer's circuit breaker then stops
    /// waiting on it; measured on a 2-core box with four busy threads and
    /// 1024 checks in flight, the slowest check took 164 ms). A call that
    /// times out returns
    /// [`StoreError::Timeout`](portcullis_core::StoreError::Timeout) and is
    /// not retried.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The most opening one connection may take, TLS handshake and
    /// authentication included. A call never waits longer than
    /// [`timeout`](Self::timeout) for it. Default: 1 second.
    pub fn connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// Where the time comes from (default [`ClockMode::Redis`]). A
    /// [`ClockMode::Client`] clock is compared with Redis's `TIME` at
    /// [`build`](Self::build), which refuses it beyond
    /// [`client_clock_tolerance`](Self::client_clock_tolerance).
    pub fn clock(mut self, clock: ClockMode) -> Self {
        self.clock = clock;
        self
    }

    /// How far a [`ClockMode::Client`] clock may be from Redis's `TIME`
    /// when [`build`](Self::build) compares them (default: one second, which
    /// hosts kept by NTP never come near); beyond it `build()` returns
    /// [`BuildError::ClientClockSkew`]. Only the skew beyond the
    /// round trip of the `TIME` call counts. The check runs once, at
    /// `build()`, and not with [`lazy_connect(true)`](Self::lazy_connect).
    ///
    /// A clock behind Redis's writes keys whose expiry has already passed,
    /// so the limiter forgets every hit and admits everything; one ahead
    /// keeps keys alive longer than their time. A test clock
    /// ([`ManualClock`](portcullis_core::ManualClock)) deliberately far
    /// from the wall clock (so that keys outlive a test that moves it)
    /// takes `Duration::MAX` here.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use portcullis::{Clock, ManualClock, SystemClock};
    /// use portcullis::redis::{ClockMode, RedisStore};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// // A test clock one day ahead of Redis's, on purpose.
    /// let clock = ManualClock::new(SystemClock.now_micros() + 86_400_000_000);
    /// let store = RedisStore::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .clock(ClockMode::Client(Arc::new(clock)))
    ///     .client_clock_tolerance(Duration::MAX)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn client_clock_tolerance(mut self, tolerance: Duration) -> Self {
        self.client_clock_tolerance = tolerance;
        self
    }

    /// Hash every subject before it reaches Redis (default `false`): turn
    /// this on when subjects are secrets such as API tokens. Subjects that
    /// are long or have characters outside `A-Z a-z 0-9 . _ - : / @ + = ,`
    /// are always hashed (see [`encode_subject`](portcullis_core::subject::encode_subject)).
    pub fn hash_subjects(mut self, hash_subjects: bool) -> Self {
        self.hash_subjects = hash_subjects;
        self
    }

    /// Coalesce concurrent checks of one subject (default `true`): checks of
    /// the same subject and policies that arrive while a call for them is
    /// in flight wait for it to end, then go to Redis together as one call
    /// that decides them one after another in arrival order, exactly as if
    /// each had been sent alone at that instant. A check that finds no call
    /// in flight is sent at once: nothing waits for a batch to fill. A busy
    /// subject then costs Redis one call per round trip instead of one per
    /// request. On a standalone server or behind Sentinel, checks of
    /// different subjects batch as well: the store keeps at most two calls
    /// of checks in flight, and checks that find both busy go together as
    /// one call, each decided as if sent alone (on a Cluster, whose calls
    /// hold one slot's keys, they go alone). Charges are coalesced and
    /// batched across subjects on both call paths (on `EVALSHA`, as
    /// scripts); peeks go alone. Turn it off to send every check as its own
    /// call.
    ///
    /// A waiting check is either sent in its batch and answered with that
    /// batch's answer, or never sent: if the calls ahead of it take longer
    /// than `2 ×` [`timeout`](Self::timeout) each (the call in flight when
    /// it arrived, and one per 128 checks queued before it), it withdraws
    /// and fails with [`StoreError::Unavailable`](portcullis_core::StoreError::Unavailable),
    /// uncharged. So a check told it failed was not charged, unless its
    /// error says it may have been (its own batch's call timed out).
    ///
    /// ```no_run
    /// use portcullis::redis::RedisStore;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .coalesce(false) // one call per check
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn coalesce(mut self, coalesce: bool) -> Self {
        self.coalesce = coalesce;
        self
    }

    /// Admit busy subjects from grants of permits taken from Redis (off by
    /// default): approximate, with the bound [`LocalBudget`] states. A hot
    /// subject then costs Redis a fraction of a call per request; quiet
    /// subjects stay exact.
    pub fn local_budget(mut self, budget: LocalBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Validates the configuration, connects, and checks the server.
    ///
    /// Unless [`lazy_connect(true)`](Self::lazy_connect), `build()` opens
    /// the pool's connections (TLS handshake and `AUTH` included), loads
    /// the check script and runs one peek (a check of cost 0, which writes
    /// nothing) on the key `<prefix>:{portcullis-build-check}:build-check`.
    /// So a wrong password, a missing ACL permission or an unreachable
    /// server is a [`BuildError`] here, naming what to fix, not a pool
    /// timeout on the first request. It also reads `maxmemory` and
    /// `maxmemory-policy` where `CONFIG GET` is allowed, and logs a warning
    /// (tracing) when a full Redis would refuse writes (`noeviction` with
    /// `maxmemory` set); see the [guide](crate::guide#failure-semantics).
    ///
    /// Must run inside a Tokio runtime (it spawns the pool's tasks).
    ///
    /// # Errors
    ///
    /// [`BuildError`] for a missing or invalid URL, prefix, pool size or
    /// timeout, TLS asked without the `tls` feature, bad certificates, and
    /// (unless lazy) an unreachable server, refused credentials, a missing
    /// permission, an unknown Sentinel master, or a client clock too far
    /// from Redis's ([`client_clock_tolerance`](Self::client_clock_tolerance)).
    pub async fn build(self) -> Result<RedisStore, BuildError> {
        validate_prefix(&self.prefix)?;
        if self.pool_size == 0 {
            return Err(BuildError::ZeroPoolSize);
        }
        if self.timeout.is_zero() {
            return Err(BuildError::ZeroTimeout { field: "timeout" });
        }
        if self.connect_timeout.is_zero() {
            return Err(BuildError::ZeroTimeout {
                field: "connect_timeout",
            });
        }
        if self.budget.as_ref().is_some_and(|b| b.period().is_zero()) {
            return Err(BuildError::ZeroTimeout {
                field: "local_budget's grant_period",
            });
        }
        #[cfg(feature = "tls")]
        {
            // redis-rs builds rustls configs with the process default
            // provider; install ring's unless the application chose one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let target = self.target.clone().ok_or(BuildError::NoServer)?;
        let (pool, description, user) = self.open_pool(target).await?;
        let cluster = pool.is_cluster();
        let scripts = ScriptCache::new();
        scripts.path().set_cluster(cluster);
        let store = RedisStore {
            inner: Arc::new(Inner {
                caller: Arc::new(Caller {
                    pool,
                    timeout: self.timeout,
                    clock: self.clock,
                    keys: Keys::new(self.prefix.into(), self.hash_subjects),
                    scripts,
                }),
                coalescer: self.coalesce.then(|| Arc::new(Coalescer::new())),
                lane: (self.coalesce && !cluster).then(|| Arc::new(Lane::default())),
                budget: self.budget.map(|budget| Arc::new(Budget::new(budget))),
            }),
        };
        if !self.lazy {
            verify::at_build(&store, &description, &user, self.connect_timeout).await?;
            let timeout = self.timeout.saturating_add(self.connect_timeout);
            clock::check(&store, self.client_clock_tolerance, timeout).await?;
        }
        Ok(store)
    }
}

pub(crate) fn validate_prefix(prefix: &str) -> Result<(), BuildError> {
    let valid = !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX_LEN
        && prefix
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
    if valid {
        Ok(())
    } else {
        Err(BuildError::InvalidPrefix {
            prefix: prefix.chars().take(80).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_validated() {
        assert!(validate_prefix("portcullis").is_ok());
        assert!(validate_prefix("a:b-c").is_ok());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("has{brace").is_err());
        assert!(validate_prefix("has space").is_err());
        assert!(validate_prefix(&"x".repeat(65)).is_err());
    }

    #[cfg(not(feature = "tls"))]
    #[tokio::test]
    async fn tls_without_the_feature_says_which_feature_to_enable() {
        let error = RedisStore::builder()
            .url("rediss://app:s3cret@127.0.0.1:6380")
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(error, BuildError::TlsNotEnabled { .. }),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains("`tls` feature"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        let error = RedisStore::builder()
            .cluster(["rediss://127.0.0.1:7000"])
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(error, BuildError::TlsNotEnabled { .. }),
            "{error:?}"
        );
    }

    #[cfg(all(feature = "tls", not(feature = "tls-insecure")))]
    #[tokio::test]
    async fn insecure_without_its_feature_is_refused() {
        let error = RedisStore::builder()
            .url("rediss://127.0.0.1:6380#insecure")
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(error, BuildError::InsecureTlsNotEnabled { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("tls-insecure"), "{error}");
    }

    #[test]
    fn debug_never_prints_secrets() {
        let builder = RedisStoreBuilder::default()
            .url("redis://app:url-secret@127.0.0.1")
            .password("setter-secret")
            .tls_client_cert("CERT", "KEY-secret");
        let debug = format!("{builder:?}");
        for secret in ["url-secret", "setter-secret", "KEY-secret"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        assert!(debug.contains("<redacted>"), "{debug}");
    }
}
