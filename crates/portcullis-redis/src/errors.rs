//! The crate's errors and what a Redis user needs: `BuildError` (why a
//! `RedisStore` could not be built, each message saying what to change),
//! `RedisCause` (redis-rs's error as a `source()`, printed once), and the
//! ACL rules (`ACL_COMMANDS`, `ACL_CLUSTER_COMMANDS`).

use std::error::Error;
use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use portcullis_core::StoreError;
use redis::RedisError;

use crate::keys::MAX_PREFIX_LEN;

/// The ACL rules a Redis user needs for portcullis, for
/// `ACL SETUSER <user> on ><password> ~<prefix>:* <ACL_COMMANDS>`: the
/// commands the store sends (`EVALSHA`, `SCRIPT LOAD`, `DEL` for resets,
/// `HMGET` for the rate limiter's configuration, `PING`) and the ones its
/// scripts call. `CONFIG GET` is optional (see the
/// [guide](crate::guide#failure-semantics)).
pub const ACL_COMMANDS: &str = "+ping +evalsha +script|load +time +get +set +exists +del +hmget +hset +pexpire +pexpireat +zadd +zcount +zrangebyscore +zremrangebyrank +zremrangebyscore +zrevrange +zcard +zscore +zrem";

/// What an ACL user needs besides [`ACL_COMMANDS`] on a Redis Cluster: the
/// Cluster client reads the slot map (`CLUSTER SLOTS`) and follows
/// migrations (`ASKING`).
pub const ACL_CLUSTER_COMMANDS: &str = "+cluster|slots +asking";

/// The commands portcullis's scripts call (the tail of [`ACL_COMMANDS`]).
pub(crate) const SCRIPT_COMMANDS: &str = "+time +get +set +exists +del +hmget +hset +pexpire +pexpireat +zadd +zcount +zrangebyscore +zremrangebyrank +zremrangebyscore +zrevrange +zcard +zscore +zrem";

/// redis-rs's error as the cause of a portcullis error: the `source()` of a
/// [`BuildError`], and of a [`StoreError`] from a
/// [`RedisStore`](crate::RedisStore), wherever redis-rs's error is the
/// cause. It dereferences to the [`RedisError`] (its `kind()`, `code()`, …).
///
/// Why not the `RedisError` itself: one that wraps another error (an I/O
/// error, a server's reply) prints that error's text as its own *and*
/// returns it as its `source()`, so a `source()` walk (anyhow's `{:#}`,
/// eyre, `tracing`'s `error.sources`) would print "Connection refused (os
/// error 111)" twice. `RedisCause` prints the text once and continues the
/// chain below the repeated error.
///
/// ```
/// use std::error::Error;
/// use portcullis::redis::{BuildError, RedisCause, RedisStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let error = RedisStore::builder().url("redis://127.0.0.1:1").build().await.unwrap_err();
/// assert!(matches!(error, BuildError::Connect { .. }));
/// let cause = error.source().and_then(|e| e.downcast_ref::<RedisCause>()).unwrap();
/// assert!(cause.is_io_error()); // through Deref to redis-rs's error
/// let mut printed = vec![error.to_string()];
/// let mut next = error.source();
/// while let Some(cause) = next {
///     printed.push(cause.to_string());
///     next = cause.source();
/// }
/// assert_eq!(printed.join(": ").matches("refused").count(), 1, "{printed:?}");
/// # });
/// ```
#[derive(Clone)]
pub struct RedisCause(RedisError);

impl RedisCause {
    /// redis-rs's error.
    #[must_use]
    pub fn redis_error(&self) -> &RedisError {
        &self.0
    }

    /// redis-rs's error, by value.
    #[must_use]
    pub fn into_redis_error(self) -> RedisError {
        self.0
    }
}

impl From<RedisError> for RedisCause {
    fn from(error: RedisError) -> Self {
        Self(error)
    }
}

impl Deref for RedisCause {
    type Target = RedisError;

    fn deref(&self) -> &RedisError {
        &self.0
    }
}

impl fmt::Debug for RedisCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisCause").field(&self.0).finish()
    }
}

impl fmt::Display for RedisCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Error for RedisCause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        let inner = self.0.source()?;
        // redis-rs prints a wrapped error's text as its own: skip that
        // error, keep what lies below it. (Compared by text, so an error
        // that adds to its cause's text keeps its cause.)
        if inner.to_string() == self.0.to_string() {
            inner.source()
        } else {
            Some(inner)
        }
    }
}

/// redis-rs's error in `error`, itself or wrapped in a [`RedisCause`].
pub(crate) fn redis_error<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a RedisError> {
    error
        .downcast_ref::<RedisCause>()
        .map(RedisCause::redis_error)
        .or_else(|| error.downcast_ref::<RedisError>())
}

/// Why a [`RedisStore`](crate::RedisStore) could not be built. Each
/// message says what to change; errors from Redis keep the redis-rs error
/// as [`source()`](std::error::Error::source) (a [`RedisCause`]), not in
/// the message: print the chain (anyhow's `{:#}`, or a loop over
/// `source()`) to see it; each cause appears in it once.
///
/// ```
/// use portcullis::redis::{BuildError, RedisStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let error = RedisStore::builder().build().await.unwrap_err();
/// assert!(matches!(error, BuildError::NoServer));
///
/// let error = RedisStore::builder()
///     .url("redis://127.0.0.1")
///     .prefix("has{brace")
///     .build()
///     .await
///     .unwrap_err();
/// assert!(error.to_string().contains("prefix"));
/// # });
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// No target was given ([`url`](crate::RedisStoreBuilder::url),
    /// [`cluster`](crate::RedisStoreBuilder::cluster),
    /// [`sentinel`](crate::RedisStoreBuilder::sentinel), …), or its list of
    /// URLs was empty.
    NoServer,
    /// A URL could not be parsed.
    InvalidUrl {
        /// The URL (or the comma-separated URLs), password replaced by `***`.
        url: String,
        /// The parser's error.
        source: RedisCause,
    },
    /// The key prefix was empty, too long, or had braces, spaces or control
    /// characters.
    InvalidPrefix {
        /// The prefix given (at most 80 characters of it).
        prefix: String,
    },
    /// The pool size was 0.
    ZeroPoolSize,
    /// A timeout was zero.
    ZeroTimeout {
        /// `timeout` or `connect_timeout`.
        field: &'static str,
    },
    /// A `rediss://` URL (or TLS settings) without the `tls` feature.
    TlsNotEnabled {
        /// The URL, password replaced by `***`.
        url: String,
    },
    /// A `rediss://…#insecure` URL without the `tls-insecure` feature.
    InsecureTlsNotEnabled {
        /// The URL, password replaced by `***`.
        url: String,
    },
    /// [`tls_ca`](crate::RedisStoreBuilder::tls_ca) or
    /// [`tls_client_cert`](crate::RedisStoreBuilder::tls_client_cert) was
    /// given for a URL that is not `rediss://`.
    TlsSettingsWithoutTls {
        /// The URL, password replaced by `***`.
        url: String,
    },
    /// The TLS certificates or key could not be used.
    Tls {
        /// redis-rs's error.
        source: RedisCause,
    },
    /// A configuration the store cannot use.
    Unsupported {
        /// What and what to do instead.
        detail: String,
    },
    /// The server could not be reached (refused, timed out, TLS handshake
    /// failed) at `build()`.
    Connect {
        /// Where (URLs with passwords replaced by `***`).
        target: String,
        /// redis-rs's error.
        source: RedisCause,
    },
    /// The server refused the credentials (`WRONGPASS`, `NOAUTH`).
    Auth {
        /// The user name tried (`default` when none was given).
        user: String,
        /// redis-rs's error.
        source: RedisCause,
    },
    /// The ACL user may not run a command or touch a key portcullis needs
    /// (`NOPERM`).
    Permission {
        /// The user name.
        user: String,
        /// The ACL rule to grant, such as `+evalsha` or `~portcullis:*`.
        permission: String,
        /// The key prefix (for the full grant in the message).
        prefix: String,
        /// redis-rs's error.
        source: RedisCause,
    },
    /// No Sentinel knows a master of this name.
    UnknownSentinelMaster {
        /// The name given to [`sentinel`](crate::RedisStoreBuilder::sentinel).
        master: String,
        /// redis-rs's error.
        source: RedisCause,
    },
    /// The [`ClockMode::Client`](crate::ClockMode::Client) clock is further
    /// from Redis's `TIME` than
    /// [`client_clock_tolerance`](crate::RedisStoreBuilder::client_clock_tolerance).
    #[non_exhaustive]
    ClientClockSkew {
        /// How far the client clock is from Redis's (beyond the round trip
        /// of the `TIME` call).
        skew: Duration,
        /// Whether the client clock is ahead of Redis's (else behind).
        ahead: bool,
        /// The tolerance it exceeds.
        tolerance: Duration,
    },
    /// The connection worked but the test check at `build()` failed.
    Check {
        /// The store's error (its own `source()` holds redis-rs's).
        source: StoreError,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoServer => f.write_str("no Redis server given: call .url(\"redis://host:6379\"), .cluster([...]), .sentinel(name, [...]), .client(..) or .pool(..) on the builder"),
            Self::InvalidUrl { url, .. } => write!(f, "invalid Redis URL {url:?}: use redis://[[user]:password@]host[:port][/db], rediss://… for TLS, or redis+unix:///path"),
            Self::InvalidPrefix { prefix } => write!(f, "invalid key prefix {prefix:?}: use 1 to {MAX_PREFIX_LEN} printable ASCII characters without braces or spaces"),
            Self::ZeroPoolSize => f.write_str("pool size is 0: give at least 1 connection"),
            Self::ZeroTimeout { field } => write!(f, "{field} is zero: give a positive duration"),
            Self::TlsNotEnabled { url } => write!(f, "{url} needs TLS, which this build of portcullis-redis does not have: enable the `tls` feature (portcullis = {{ features = [\"redis\", \"tls\"] }} or portcullis-redis = {{ features = [\"tls\"] }})"),
            Self::InsecureTlsNotEnabled { url } => write!(f, "{url} asks for TLS without certificate checks (#insecure), which needs the `tls-insecure` feature; it is for tests only: in production remove #insecure and give the server's CA with .tls_ca(..)"),
            Self::TlsSettingsWithoutTls { url } => write!(f, "TLS certificates were given but {url} is not a TLS URL: use rediss://"),
            Self::Tls { .. } => f.write_str("the TLS certificates could not be used: give PEM data (-----BEGIN CERTIFICATE----- / PRIVATE KEY-----) to .tls_ca(..) and .tls_client_cert(..)"),
            Self::Unsupported { detail } => write!(f, "unsupported Redis configuration: {detail}"),
            Self::Connect { target, .. } => write!(f, "could not connect to Redis at {target}: check that the server runs and is reachable, and for rediss:// that its certificate is signed by a trusted CA (.tls_ca(..)) and matches the host name; or build with .lazy_connect(true) to start without Redis"),
            Self::Auth { user, .. } => write!(f, "Redis refused the credentials of user {user:?}: check the user name and password (in the URL as user:password@, or .username(..) / .password(..)); for a password-only server use redis://:password@host"),
            Self::Permission { user, permission, prefix, .. } => write!(f, "the Redis user {user:?} lacks the ACL permission {permission}: grant it with `ACL SETUSER {user} {permission}`; everything portcullis needs is `ACL SETUSER {user} ~{prefix}:* {ACL_COMMANDS}`"),
            Self::UnknownSentinelMaster { master, .. } => write!(f, "no Sentinel knows a master named {master:?}: use the name of a `sentinel monitor <name> …` line (SENTINEL MASTERS lists them)"),
            Self::ClientClockSkew { skew, ahead, tolerance } => {
                let (direction, effect) = if *ahead {
                    ("ahead of", "keys would outlive their time")
                } else {
                    ("behind", "keys would be written already expired and every check admitted")
                };
                write!(f, "the client clock (ClockMode::Client) is {skew:?} {direction} Redis's TIME, more than the tolerance of {tolerance:?}: {effect}. Synchronise this host's clock (NTP), or use ClockMode::Redis (the default); a test clock far from the wall clock on purpose takes .client_clock_tolerance(Duration::MAX)")
            }
            Self::Check { .. } => f.write_str("Redis answered, but a test check at build() failed (the cause says why and what to do)"),
        }
    }
}

impl Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidUrl { source, .. }
            | Self::Tls { source }
            | Self::Connect { source, .. }
            | Self::Auth { source, .. }
            | Self::Permission { source, .. }
            | Self::UnknownSentinelMaster { source, .. } => Some(source),
            Self::Check { source } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    use portcullis_core::{Policy, Store};

    use crate::redisson::RateLimiterError;
    use crate::{RedisStore, ThrottleCallError};

    /// Nothing listens there: connecting is refused at once.
    const CLOSED: &str = "redis://127.0.0.1:1";

    /// The `Display` texts of `error` and of each `source()` below it, to
    /// the end of the chain.
    fn chain(error: &(dyn Error + 'static)) -> Vec<String> {
        let mut texts = vec![error.to_string()];
        let mut cause = error.source();
        while let Some(error) = cause {
            texts.push(error.to_string());
            cause = error.source();
        }
        texts
    }

    /// Each cause's text appears exactly once in the whole chain, as a
    /// `source()` walker (anyhow's `{:#}`) prints it.
    fn assert_printed_once(error: &(dyn Error + 'static)) {
        let texts = chain(error);
        assert!(texts.len() > 1, "no source: {texts:?}");
        let printed = texts.join(": ");
        for cause in &texts[1..] {
            assert_eq!(
                printed.matches(cause.as_str()).count(),
                1,
                "{cause:?} in {printed:?}"
            );
        }
    }

    /// A check's error against a Redis that refuses connections.
    async fn unavailable() -> StoreError {
        let store = RedisStore::builder()
            .url(CLOSED)
            .lazy_connect(true)
            .build()
            .await
            .unwrap();
        let policy = Policy::per_second(1).build().unwrap();
        store.check("s", &[policy], 1).await.unwrap_err()
    }

    #[tokio::test]
    async fn every_cause_prints_once_through_a_source_walker() {
        let connect = RedisStore::builder().url(CLOSED).build().await.unwrap_err();
        assert!(matches!(connect, BuildError::Connect { .. }), "{connect:?}");
        assert_printed_once(&connect);

        let url = RedisStore::builder()
            .url("redis://127.0.0.1:notaport")
            .build()
            .await
            .unwrap_err();
        assert!(matches!(url, BuildError::InvalidUrl { .. }), "{url:?}");
        assert_printed_once(&url);

        let store = unavailable().await;
        assert!(matches!(store, StoreError::Unavailable { .. }), "{store:?}");
        assert!(
            chain(&store).len() >= 3,
            "the store error, the pool's, redis-rs's: {:?}",
            chain(&store)
        );
        assert_printed_once(&store);
        assert_printed_once(&BuildError::Check {
            source: unavailable().await,
        });
        assert_printed_once(&RateLimiterError::Store(unavailable().await));
        assert_printed_once(&ThrottleCallError::Store(unavailable().await));
        let invalid_rate = Policy::per_second(0).build().unwrap_err();
        assert!(chain(&RateLimiterError::InvalidRate(invalid_rate)).len() == 2);
    }

    /// A password that a URL parser would end early (`#`, `?`, `/`, `@`,
    /// `:`) makes the URL invalid, and then nothing of it may show: not in
    /// the error's `Display`, its `Debug`, nor anywhere down its `source()`
    /// chain, for a server, a Cluster and Sentinels alike.
    #[tokio::test]
    async fn an_invalid_url_never_shows_its_password() {
        const PASSWORD_TAIL: &str = "9xy";
        for url in [
            "redis://app:Ab#9xy@host",
            "redis://app:Ab?9xy@host:6379",
            "redis://app:Ab/9xy@host:6379/0",
            "redis://app:Ab@9xy@host:notaport",
            "redis://app:Ab:9xy@host:notaport",
            "redis://:#?/@:9xy@host:notaport",
        ] {
            let builders = [
                RedisStore::builder().url(url),
                RedisStore::builder().cluster(["redis://127.0.0.1:7000", url]),
                RedisStore::builder().sentinel("main", [url]),
            ];
            for builder in builders {
                let error = builder.lazy_connect(true).build().await.unwrap_err();
                assert!(
                    matches!(error, BuildError::InvalidUrl { .. }),
                    "{url}: {error:?}"
                );
                let mut printed = vec![error.to_string(), format!("{error:?}")];
                let mut cause = error.source();
                while let Some(error) = cause {
                    printed.push(error.to_string());
                    printed.push(format!("{error:?}"));
                    cause = error.source();
                }
                for text in printed {
                    assert!(!text.contains(PASSWORD_TAIL), "{url}: {text}");
                }
            }
        }
    }

    #[test]
    fn acl_commands_end_with_the_script_commands() {
        assert!(ACL_COMMANDS.ends_with(SCRIPT_COMMANDS), "{ACL_COMMANDS}");
    }

    /// Every command a Lua source calls is in the documented grant, so a
    /// user given `ACL_COMMANDS` can run every script.
    #[test]
    fn every_command_the_scripts_call_is_granted() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lua");
        let granted: Vec<&str> = SCRIPT_COMMANDS.split(' ').collect();
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let source = std::fs::read_to_string(&path).unwrap();
            let calls = source
                .split("redis.call(")
                .skip(1)
                .chain(source.split("redis.pcall(").skip(1));
            for call in calls {
                let quoted = call.trim_start().trim_start_matches(['\'', '"']);
                let command: String = quoted
                    .chars()
                    .take_while(char::is_ascii_alphabetic)
                    .collect();
                if command.is_empty() {
                    continue; // redis.call(unpack(..)) and the like
                }
                seen += 1;
                let rule = format!("+{}", command.to_ascii_lowercase());
                assert!(
                    granted.contains(&rule.as_str()),
                    "{} calls {command}: add {rule} to SCRIPT_COMMANDS and ACL_COMMANDS",
                    path.display()
                );
            }
        }
        assert!(
            seen > 10,
            "found only {seen} redis.call in {}",
            dir.display()
        );
    }
}
