//! The store, built as the service builds its `RedisStore` (the same
//! builder: URL forms, TLS files, ACL users, Cluster, Sentinel), and a
//! second, plain connection for what the `Store` trait does not expose:
//! a key's type, raw value and expiry, a lease set's live members and a
//! token budget's open reservations. Those raw reads are read-only
//! commands only (`GET`, `ZCARD`, `ZCOUNT`, `ZRANGEBYSCORE`, `TIME`, which
//! the store's ACL user is granted; `PTTL` and `SCAN` when allowed);
//! every call has the `--timeout`.

use std::future::Future;
use std::time::Duration;

use portcullis::redis::{redact_url, BuildError, RedisStore};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, FromRedisValue, IntoConnectionInfo as _, TlsCertificates, TlsMode,
};

use crate::args::StoreArgs;
use crate::failure::Failure;
use crate::report::RawView;

/// A store and a raw connection to the same server.
pub(crate) struct Connected {
    pub(crate) store: RedisStore,
    raw: Raw,
    timeout: Duration,
    /// What to show for the server: URLs with passwords hidden.
    pub(crate) shown: String,
}

enum Raw {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// Builds the store and opens the raw connection.
pub(crate) async fn connect(args: &StoreArgs) -> Result<Connected, Failure> {
    let urls: Vec<&str> = args
        .urls
        .iter()
        .map(|url| url.trim())
        .filter(|url| !url.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(Failure::usage(
            "no Redis given: pass --redis URL (or set PORTCULLIS_REDIS_URL), the URL the service's store uses",
        ));
    }
    if urls.len() > 1 && !args.cluster && args.sentinel.is_none() {
        return Err(Failure::usage(
            "several Redis URLs given: add --cluster if they are nodes of one Redis Cluster, or --sentinel MASTER if they are Sentinels; else give one",
        ));
    }
    let primary_auth = match (&args.primary_auth, &args.sentinel) {
        (Some(_), None) => {
            return Err(Failure::usage(
                "--primary-auth (or PORTCULLIS_REDIS_PRIMARY_AUTH) is for --sentinel; with one server, put the user and password in its URL",
            ));
        }
        (Some(auth), Some(_)) => {
            let Some((user, password)) = auth.split_once(':') else {
                return Err(Failure::usage(
                    "--primary-auth is USER:PASSWORD, or :PASSWORD for the default user",
                ));
            };
            Some((
                (!user.is_empty()).then(|| user.to_owned()),
                password.to_owned(),
            ))
        }
        (None, _) => None,
    };
    let shown = urls
        .iter()
        .map(|url| redact_url(url))
        .collect::<Vec<_>>()
        .join(",");
    let ca = args.tls_ca.as_deref().map(read_pem).transpose()?;
    let client_cert = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some((read_pem(cert)?, read_pem(key)?)),
        _ => None,
    };

    let mut builder = RedisStore::builder()
        .prefix(args.prefix.as_str())
        .hash_subjects(args.hash_subjects)
        .timeout(args.timeout)
        .connect_timeout(args.timeout);
    builder = if args.cluster {
        builder.cluster(urls.iter().copied())
    } else if let Some(master) = &args.sentinel {
        builder.sentinel(master.as_str(), urls.iter().copied())
    } else {
        builder.url(urls.concat())
    };
    if let Some((user, password)) = &primary_auth {
        if let Some(user) = user {
            builder = builder.username(user.as_str());
        }
        builder = builder.password(password.as_str());
    }
    if let Some(ca) = &ca {
        builder = builder.tls_ca(ca.clone());
    }
    if let Some((cert, key)) = &client_cert {
        builder = builder.tls_client_cert(cert.clone(), key.clone());
    }
    let store = builder.build().await.map_err(|error| {
        let failure = Failure::store(&format!("cannot use the store at {shown}"), &error);
        // What the command line got wrong is bad input, not a store
        // that failed.
        if matches!(
            error,
            BuildError::InvalidUrl { .. }
                | BuildError::InvalidPrefix { .. }
                | BuildError::TlsSettingsWithoutTls { .. }
                | BuildError::NoServer
        ) {
            failure.into_usage()
        } else {
            failure
        }
    })?;

    // The store's build installed the TLS provider when it needed one.
    let certs = (ca.is_some() || client_cert.is_some()).then(|| TlsCertificates {
        client_tls: client_cert.map(|(client_cert, client_key)| redis::ClientTlsConfig {
            client_cert,
            client_key,
        }),
        root_cert: ca,
    });
    let raw_error = |error: redis::RedisError| {
        Failure::store(&format!("cannot open a connection to {shown}"), &error)
    };
    let raw = if args.cluster {
        let mut client = ClusterClientBuilder::new(urls.iter().copied());
        if let Some(certs) = certs {
            client = client.certs(certs);
        }
        let client = client.build().map_err(raw_error)?;
        Raw::Cluster(
            within(args.timeout, &shown, client.get_async_connection())
                .await?
                .map_err(raw_error)?,
        )
    } else if let Some(master) = &args.sentinel {
        let mut client = sentinel_client(&urls, master, certs, primary_auth).map_err(raw_error)?;
        Raw::Single(
            within(args.timeout, &shown, client.get_async_connection())
                .await?
                .map_err(raw_error)?,
        )
    } else {
        let url = urls.concat();
        let client = match certs {
            Some(certs) => redis::Client::build_with_tls(url, certs),
            None => redis::Client::open(url),
        }
        .map_err(raw_error)?;
        Raw::Single(
            within(
                args.timeout,
                &shown,
                client.get_multiplexed_async_connection(),
            )
            .await?
            .map_err(raw_error)?,
        )
    };
    Ok(Connected {
        store,
        raw,
        timeout: args.timeout,
        shown,
    })
}

/// A client of the primary that `urls` (Sentinels) name `master`, as the
/// store's builder makes it: TLS when the Sentinels' URLs are `rediss://`
/// (to them and to the primary), the Sentinels' credentials from their
/// URLs, the primary's from `--primary-auth`. (The builder's own client
/// is private to the store, and the `Store` trait has no raw reads.)
fn sentinel_client(
    urls: &[&str],
    master: &str,
    certs: Option<TlsCertificates>,
    primary_auth: Option<(Option<String>, String)>,
) -> redis::RedisResult<SentinelClient> {
    let mut addrs = Vec::with_capacity(urls.len());
    let mut tls = false;
    let mut sentinel_auth = None;
    for url in urls {
        let info = url.into_connection_info()?;
        tls |= matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        let settings = info.redis_settings();
        if sentinel_auth.is_none()
            && let Some(password) = settings.password()
        {
            sentinel_auth = Some((settings.username().map(str::to_owned), password.to_owned()));
        }
        addrs.push(info.addr().clone());
    }
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?;
    if tls {
        builder = builder
            .set_client_to_sentinel_tls_mode(TlsMode::Secure)
            .set_client_to_redis_tls_mode(TlsMode::Secure);
        if let Some(certs) = certs {
            builder = builder
                .set_client_to_sentinel_certificates(certs.clone())
                .set_client_to_redis_certificates(certs);
        }
    }
    if let Some((user, password)) = sentinel_auth {
        if let Some(user) = user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some((user, password)) = primary_auth {
        if let Some(user) = user {
            builder = builder.set_client_to_redis_username(user);
        }
        builder = builder.set_client_to_redis_password(password);
    }
    builder.build()
}

fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|error| {
        Failure::usage(format!(
            "cannot read {}: {error}; give a PEM file",
            path.display()
        ))
    })
}

async fn within<T>(
    timeout: Duration,
    shown: &str,
    future: impl Future<Output = T>,
) -> Result<T, Failure> {
    tokio::time::timeout(timeout, future).await.map_err(|_| {
        Failure::store(
            &format!("{shown} did not answer within {timeout:?}"),
            &std::io::Error::from(std::io::ErrorKind::TimedOut),
        )
    })
}

impl Connected {
    /// Runs one read-only command: the timeout is a failure, the server's
    /// answer (an error included) is the caller's to read.
    async fn try_query<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
    ) -> Result<redis::RedisResult<T>, Failure> {
        let (timeout, shown) = (self.timeout, self.shown.as_str());
        match &mut self.raw {
            Raw::Single(connection) => within(timeout, shown, query_on(connection, cmd)).await,
            Raw::Cluster(connection) => within(timeout, shown, query_on(connection, cmd)).await,
        }
    }

    async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, Failure> {
        self.try_query(cmd)
            .await?
            .map_err(|error| Failure::store(&format!("reading from {}", self.shown), &error))
    }

    /// A key as Redis holds it, read with the commands an ACL user of
    /// the store is granted (`ACL_COMMANDS`: `GET`, `ZCARD`, `TIME`,
    /// `ZCOUNT`; `PTTL` when allowed).
    pub(crate) async fn read_key(&mut self, key: &str) -> Result<RawView, Failure> {
        let get: redis::RedisResult<Option<Vec<u8>>> =
            self.try_query(redis::cmd("GET").arg(key)).await?;
        let (redis_type, value, members) = match get {
            Ok(Some(bytes)) => (
                "string",
                Some(String::from_utf8_lossy(&bytes).into_owned()),
                None,
            ),
            Ok(None) => ("none", None, None),
            Err(error) if error.code() == Some("WRONGTYPE") => {
                let zcard: redis::RedisResult<u64> =
                    self.try_query(redis::cmd("ZCARD").arg(key)).await?;
                match zcard {
                    Ok(members) => ("zset", None, Some(members)),
                    Err(error) if error.code() == Some("WRONGTYPE") => ("other", None, None),
                    Err(error) => return Err(self.read_failure(&error)),
                }
            }
            Err(error) => return Err(self.read_failure(&error)),
        };
        let expires_in_ms = self.expires_in_ms(key).await?;
        Ok(RawView {
            redis_type: redis_type.to_owned(),
            value,
            members,
            expires_in_ms,
        })
    }

    fn read_failure(&self, error: &redis::RedisError) -> Failure {
        Failure::store(&format!("reading from {}", self.shown), error)
    }

    /// The key's time to live, if it has one and the user may ask.
    async fn expires_in_ms(&mut self, key: &str) -> Result<Option<u64>, Failure> {
        match self.try_query::<i64>(redis::cmd("PTTL").arg(key)).await? {
            Ok(pttl) => Ok(u64::try_from(pttl).ok()),
            // An ACL user granted only what the store needs.
            Err(error) if error.code() == Some("NOPERM") => Ok(None),
            Err(error) => Err(self.read_failure(&error)),
        }
    }

    /// The server's clock, in microseconds since the epoch (the clock the
    /// scripts score leases and reservations by).
    async fn now_us(&mut self) -> Result<u64, Failure> {
        let (secs, micros): (u64, u64) = self.query(&redis::cmd("TIME")).await?;
        Ok(secs.saturating_mul(1_000_000).saturating_add(micros))
    }

    /// The leases live now in a lease set (members scored by their expiry
    /// in microseconds, against the server's clock): how many, the first
    /// [`MAX_LISTED`] by expiry (id and microseconds left), and when the
    /// set expires.
    pub(crate) async fn live_leases(&mut self, key: &str) -> Result<LeaseRead, Failure> {
        let now_us = self.now_us().await?;
        let live: u64 = self
            .query(
                redis::cmd("ZCOUNT")
                    .arg(key)
                    .arg(format!("({now_us}"))
                    .arg("+inf"),
            )
            .await?;
        let held = self.live_members(key, now_us).await?;
        Ok(LeaseRead {
            live,
            held,
            expires_in_ms: self.expires_in_ms(key).await?,
        })
    }

    /// The members of a sorted set scored above `now_us`, soonest first,
    /// at most [`MAX_LISTED`], each with the microseconds left.
    async fn live_members(
        &mut self,
        key: &str,
        now_us: u64,
    ) -> Result<Vec<(String, u64)>, Failure> {
        let members: Vec<(String, f64)> = self
            .query(
                redis::cmd("ZRANGEBYSCORE")
                    .arg(key)
                    .arg(format!("({now_us}"))
                    .arg("+inf")
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(MAX_LISTED),
            )
            .await?;
        Ok(members
            .into_iter()
            .map(|(member, score)| {
                // Scores are whole microseconds, exact in a double.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let expires_us = score.max(0.0) as u64;
                (member, expires_us.saturating_sub(now_us))
            })
            .collect())
    }

    /// The open reservations of a token budget: from its open set (kept
    /// when the budget limits streams in flight: `ZRANGEBYSCORE`, then a
    /// `GET` of each record), else by a `SCAN` for the budget's records on
    /// the node of the subject's hash slot (the whole `--timeout` for the
    /// scan). Only records open and live now count.
    pub(crate) async fn open_reservations(
        &mut self,
        set: &str,
    ) -> Result<ReservationRead, Failure> {
        let now_us = self.now_us().await?;
        let indexed = self.live_members(set, now_us).await?;
        let (records, found_by): (Vec<(String, String)>, &'static str) = if indexed.is_empty() {
            match self.scan_records(set).await? {
                Some(keys) => (
                    keys.into_iter()
                        .filter_map(|key| {
                            let id = key.get(set.len() + 1..)?.to_owned();
                            Some((id, key))
                        })
                        .collect(),
                    "scan",
                ),
                None => (Vec::new(), "scan not permitted"),
            }
        } else {
            (
                indexed
                    .into_iter()
                    .map(|(id, _)| {
                        let key = format!("{set}:{id}");
                        (id, key)
                    })
                    .collect(),
                "open set",
            )
        };
        let mut open = Vec::new();
        for (id, key) in records {
            let value: Option<Vec<u8>> = self.query(redis::cmd("GET").arg(&key)).await?;
            if let Some((estimate, expires_us)) = value
                .as_deref()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(open_record)
                .filter(|(_, expires_us)| *expires_us > now_us)
            {
                open.push((id, estimate, expires_us - now_us));
            }
        }
        open.sort_by_key(|(_, _, left_us)| *left_us);
        Ok(ReservationRead { open, found_by })
    }

    /// The keys of a budget's reservation records (`<set>:<id>`), by
    /// `SCAN` on the node holding the subject's slot; `None` when the
    /// user may not `SCAN` (an ACL user granted only `ACL_COMMANDS`).
    async fn scan_records(&mut self, set: &str) -> Result<Option<Vec<String>>, Failure> {
        let pattern = format!("{}:*", glob_escape(set));
        let (timeout, shown) = (self.timeout, self.shown.clone());
        let route = redis::cluster_routing::RoutingInfo::SingleNode(
            redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(
                redis::cluster_routing::Route::with_key(
                    set,
                    redis::cluster_routing::SlotAddr::Master,
                ),
            ),
        );
        let raw = &mut self.raw;
        let scan = async move {
            let mut cursor = 0_u64;
            let mut keys = Vec::new();
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply: redis::RedisResult<(u64, Vec<String>)> = match raw {
                    Raw::Single(connection) => cmd.query_async(connection).await,
                    Raw::Cluster(connection) => connection
                        .route_command(cmd, route.clone())
                        .await
                        .and_then(|value| redis::from_redis_value(value).map_err(Into::into)),
                };
                let (next, batch) = reply?;
                keys.extend(batch.into_iter().filter(|key| {
                    // A record's id is 32 hex digits: not another budget's
                    // open set whose name starts with this one's.
                    key.get(set.len() + 1..).is_some_and(|id| {
                        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
                    })
                }));
                if next == 0 {
                    return Ok::<_, redis::RedisError>(keys);
                }
                cursor = next;
            }
        };
        match tokio::time::timeout(timeout, scan).await {
            Err(_) => Err(Failure::store(
                &format!(
                    "the scan for reservation records on {shown} did not finish within {timeout:?}: pass a longer --timeout (a budget with max_in_flight keeps an open set, read without a scan)"
                ),
                &std::io::Error::from(std::io::ErrorKind::TimedOut),
            )),
            Ok(Err(error)) if error.code() == Some("NOPERM") => Ok(None),
            Ok(Err(error)) => Err(self.read_failure(&error)),
            Ok(Ok(keys)) => Ok(Some(keys)),
        }
    }
}

/// The most leases or reservations listed one by one (all are counted).
pub(crate) const MAX_LISTED: usize = 1_000;

/// A lease set, read.
pub(crate) struct LeaseRead {
    /// Leases live now.
    pub(crate) live: u64,
    /// The first [`MAX_LISTED`] by expiry: id, microseconds left.
    pub(crate) held: Vec<(String, u64)>,
    /// Milliseconds until the set expires.
    pub(crate) expires_in_ms: Option<u64>,
}

/// A budget's open reservations, read.
pub(crate) struct ReservationRead {
    /// Id, tokens held (the estimate), microseconds left; soonest first.
    pub(crate) open: Vec<(String, u64, u64)>,
    /// `open set`, `scan` or `scan not permitted`.
    pub(crate) found_by: &'static str,
}

/// An open reservation's record, `o:<estimate>:<expires_us>` (reserve.lua):
/// its estimate and expiry; `None` for a settled or unreadable record.
fn open_record(value: &str) -> Option<(u64, u64)> {
    let rest = value.strip_prefix("o:")?;
    let (estimate, expires) = rest.split_once(':')?;
    Some((estimate.parse().ok()?, expires.parse().ok()?))
}

/// `text` matched literally by a `SCAN` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

async fn query_on<C: ConnectionLike, T: FromRedisValue>(
    connection: &mut C,
    cmd: &Cmd,
) -> redis::RedisResult<T> {
    cmd.query_async(connection).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_records_and_patterns() {
        assert_eq!(
            open_record("o:700:1700000000000000"),
            Some((700, 1_700_000_000_000_000))
        );
        assert_eq!(open_record("s:700:300:0:1700000000000000"), None);
        assert_eq!(open_record("o:700"), None);
        assert_eq!(open_record("o:-1:5"), None);
        assert_eq!(
            glob_escape("p:{a*b?[c]}:rsv:t"),
            "p:{a\\*b\\?\\[c\\]}:rsv:t"
        );
    }
}
