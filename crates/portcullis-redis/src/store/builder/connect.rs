//! How `RedisStoreBuilder::build` reaches its target: the bb8 pool for a
//! standalone server, a Cluster or a Sentinel-managed primary, with the
//! URL's credentials, the builder's username and password, and TLS.

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError};

use super::verify;
use super::{RedisStoreBuilder, Target};
use crate::connection::{ClusterManager, Pool, StandaloneManager};
use crate::errors::BuildError;
use crate::redact::redact_url;
use crate::tls::TlsFiles;

impl RedisStoreBuilder {
    /// Builds the pool for `target`; also returns a description of the
    /// target for errors (passwords redacted) and the user name.
    pub(super) async fn open_pool(
        &self,
        target: Target,
    ) -> Result<(Pool, String, String), BuildError> {
        match target {
            Target::Standalone(url) => {
                let info = self.parse(&url)?;
                self.open_standalone(info, redact_url(&url), &url).await
            }
            Target::Client(client) => {
                let info = client.get_connection_info().clone();
                let description = info.addr().to_string();
                self.open_standalone(info, description.clone(), &description)
                    .await
            }
            Target::Sentinel { master, urls } => self.open_sentinel(master, &urls).await,
            Target::Cluster(urls) => self.open_cluster(&urls).await,
            Target::ClusterClient(client) => {
                let description = "the application's ClusterClient".to_owned();
                let user = self.user_or_default();
                let pool = self.cluster_pool(*client, &description, &user).await?;
                Ok((pool, description, user))
            }
            Target::Pool(pool) => Ok((
                Pool::External(pool),
                "the application's bb8-redis pool".to_owned(),
                self.user_or_default(),
            )),
        }
    }

    /// The builder's user name, or Redis's `default`.
    fn user_or_default(&self) -> String {
        self.username
            .clone()
            .unwrap_or_else(|| "default".to_owned())
    }

    /// A pool of one standalone server (`url`, for errors: the URL or the
    /// client's address; `description`, the same with passwords redacted).
    async fn open_standalone(
        &self,
        info: ConnectionInfo,
        description: String,
        url: &str,
    ) -> Result<(Pool, String, String), BuildError> {
        let info = self.with_tls(self.with_auth(info), url)?;
        let user = user_of(&info);
        let manager = StandaloneManager::server(info, self.connect_timeout, self.timeout)
            .map_err(|source| invalid_url(redact_url(url), source))?;
        let pool = self.standalone_pool(manager, url, &user).await?;
        Ok((pool, description, user))
    }

    /// A pool of the primary that the Sentinels at `urls` name `master`.
    async fn open_sentinel(
        &self,
        master: String,
        urls: &[String],
    ) -> Result<(Pool, String, String), BuildError> {
        let (client, user) = self.sentinel_client(&master, urls)?;
        let description = format!(
            "the primary {master:?} of the Sentinels {}",
            redact_urls(urls)
        );
        let manager = StandaloneManager::sentinel(client, self.connect_timeout, self.timeout);
        let last = manager.last_error();
        if self.lazy {
            let pool = self.pool_builder().build_unchecked(manager);
            return Ok((Pool::Standalone(pool, last), description, user));
        }
        let pool = match self.pool_builder().build(manager).await {
            Ok(pool) => pool,
            Err(source) if source.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel => {
                return Err(BuildError::UnknownSentinelMaster {
                    master,
                    source: source.into(),
                })
            }
            Err(source) => {
                return Err(verify::connect_error(
                    &description,
                    &user,
                    &self.prefix,
                    source,
                ))
            }
        };
        Ok((Pool::Standalone(pool, last), description, user))
    }

    /// A pool of Cluster connections seeded by `urls`.
    async fn open_cluster(&self, urls: &[String]) -> Result<(Pool, String, String), BuildError> {
        if urls.is_empty() {
            return Err(BuildError::NoServer);
        }
        let mut infos = Vec::with_capacity(urls.len());
        for url in urls {
            infos.push(self.with_auth(self.parse(url)?));
        }
        let user = user_of(&infos[0]);
        let description = redact_urls(urls);
        let builder = ClusterClientBuilder::new(infos)
            // Never resend a command that may have run: the store itself
            // resends only what the server proves did not run (NOSCRIPT,
            // MOVED, TRYAGAIN).
            .retries(0)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.timeout);
        let builder = if self.tls.is_set() {
            with_cluster_certs(builder, &self.tls, &description)?
        } else {
            builder
        };
        let client = builder
            .build()
            .map_err(|source| invalid_url(description.clone(), source))?;
        let pool = self.cluster_pool(client, &description, &user).await?;
        Ok((pool, description, user))
    }

    fn pool_builder<M: bb8::ManageConnection>(&self) -> bb8::Builder<M> {
        bb8::Pool::builder()
            .max_size(self.pool_size)
            .min_idle(self.pool_size)
            // A dead connection is found without I/O (see
            // StandaloneManager), so testing on checkout is free.
            .test_on_check_out(true)
            .retry_connection(false)
            .connection_timeout(self.timeout)
    }

    async fn standalone_pool(
        &self,
        manager: StandaloneManager,
        description: &str,
        user: &str,
    ) -> Result<Pool, BuildError> {
        let builder = self.pool_builder();
        let last = manager.last_error();
        if self.lazy {
            return Ok(Pool::Standalone(builder.build_unchecked(manager), last));
        }
        builder
            .build(manager)
            .await
            .map(|pool| Pool::Standalone(pool, last))
            .map_err(|source| {
                verify::connect_error(&redact_url(description), user, &self.prefix, source)
            })
    }

    async fn cluster_pool(
        &self,
        client: ClusterClient,
        description: &str,
        user: &str,
    ) -> Result<Pool, BuildError> {
        let builder = self.pool_builder();
        let manager = ClusterManager::new(client);
        let last = manager.last_error();
        if self.lazy {
            return Ok(Pool::Cluster(builder.build_unchecked(manager), last));
        }
        builder
            .build(manager)
            .await
            .map(|pool| Pool::Cluster(pool, last))
            .map_err(|source| verify::connect_error(description, user, &self.prefix, source))
    }

    /// Parses `url`, refusing TLS the build cannot do.
    fn parse(&self, url: &str) -> Result<ConnectionInfo, BuildError> {
        let scheme = url.split("://").next().unwrap_or_default();
        if matches!(scheme, "rediss" | "valkeys") && !cfg!(feature = "tls") {
            return Err(BuildError::TlsNotEnabled {
                url: redact_url(url),
            });
        }
        let info = url
            .into_connection_info()
            .map_err(|source| invalid_url(redact_url(url), source))?;
        if let ConnectionAddr::TcpTls { insecure: true, .. } = info.addr()
            && !cfg!(feature = "tls-insecure")
        {
            return Err(BuildError::InsecureTlsNotEnabled {
                url: redact_url(url),
            });
        }
        Ok(info)
    }

    fn with_auth(&self, info: ConnectionInfo) -> ConnectionInfo {
        let mut settings = info.redis_settings().clone();
        if let Some(username) = &self.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        info.set_redis_settings(settings)
    }

    /// Applies [`tls_ca`](Self::tls_ca) / [`tls_client_cert`](Self::tls_client_cert).
    fn with_tls(&self, info: ConnectionInfo, url: &str) -> Result<ConnectionInfo, BuildError> {
        if !self.tls.is_set() {
            return Ok(info);
        }
        if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
            return Err(BuildError::TlsSettingsWithoutTls {
                url: redact_url(url),
            });
        }
        #[cfg(feature = "tls")]
        {
            redis::Client::build_with_tls(info, self.tls.certificates())
                .map(|client| client.get_connection_info().clone())
                .map_err(|source| BuildError::Tls {
                    source: source.into(),
                })
        }
        #[cfg(not(feature = "tls"))]
        {
            Err(BuildError::TlsNotEnabled {
                url: redact_url(url),
            })
        }
    }

    fn sentinel_client(
        &self,
        master: &str,
        urls: &[String],
    ) -> Result<(redis::sentinel::SentinelClient, String), BuildError> {
        if urls.is_empty() {
            return Err(BuildError::NoServer);
        }
        let mut addrs = Vec::with_capacity(urls.len());
        let mut tls = None;
        let mut sentinel_auth = None;
        for url in urls {
            let info = self.parse(url)?;
            match info.addr() {
                ConnectionAddr::TcpTls { insecure, .. } => {
                    tls = Some(if *insecure {
                        redis::TlsMode::Insecure
                    } else {
                        redis::TlsMode::Secure
                    });
                }
                ConnectionAddr::Tcp(..) => {}
                other => {
                    return Err(BuildError::Unsupported {
                        detail: format!(
                            "Sentinel at {other}: give Sentinels as redis://host:port or rediss://host:port"
                        ),
                    })
                }
            }
            let settings = info.redis_settings();
            if settings.password().is_some() && sentinel_auth.is_none() {
                sentinel_auth = Some((
                    settings.username().map(str::to_owned),
                    settings.password().map(str::to_owned),
                ));
            }
            addrs.push(info.addr().clone());
        }
        if self.tls.is_set() && tls.is_none() {
            return Err(BuildError::TlsSettingsWithoutTls {
                url: redact_urls(urls),
            });
        }
        let invalid = |source| invalid_url(redact_urls(urls), source);
        let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
            .map_err(invalid)?;
        if let Some(mode) = tls {
            builder = builder
                .set_client_to_sentinel_tls_mode(mode)
                .set_client_to_redis_tls_mode(mode);
            #[cfg(feature = "tls")]
            if self.tls.is_set() {
                builder = builder
                    .set_client_to_sentinel_certificates(self.tls.certificates())
                    .set_client_to_redis_certificates(self.tls.certificates());
            }
        }
        if let Some((username, password)) = sentinel_auth {
            if let Some(username) = username {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = password {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        if let Some(username) = &self.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password);
        }
        let client = builder.build().map_err(invalid)?;
        let user = self
            .username
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        Ok((client, user))
    }
}

#[cfg(feature = "tls")]
#[allow(clippy::unnecessary_wraps)] // the same signature as without the feature
fn with_cluster_certs(
    builder: ClusterClientBuilder,
    tls: &TlsFiles,
    _description: &str,
) -> Result<ClusterClientBuilder, BuildError> {
    Ok(builder.certs(tls.certificates()))
}

#[cfg(not(feature = "tls"))]
#[allow(clippy::needless_pass_by_value)] // the same signature as with the feature
fn with_cluster_certs(
    _builder: ClusterClientBuilder,
    _tls: &TlsFiles,
    description: &str,
) -> Result<ClusterClientBuilder, BuildError> {
    Err(BuildError::TlsNotEnabled {
        url: description.to_owned(),
    })
}

/// `redacted`: the URL(s) as [`redact_url`] prints them.
fn invalid_url(redacted: String, source: RedisError) -> BuildError {
    BuildError::InvalidUrl {
        url: redacted,
        source: source.into(),
    }
}

/// `urls` each redacted, then joined: redacting the joined list would read
/// it as one URL (its user-info up to the last `@` of all of them).
fn redact_urls(urls: &[String]) -> String {
    urls.iter()
        .map(|url| redact_url(url))
        .collect::<Vec<_>>()
        .join(",")
}

fn user_of(info: &ConnectionInfo) -> String {
    info.redis_settings()
        .username()
        .unwrap_or("default")
        .to_owned()
}
