//! The Redis servers `test` and `cargo xtask redis` start (standalone,
//! Cluster, TLS + ACL, TLS Cluster, Sentinel, TLS Sentinel), and
//! `cargo xtask redis` itself.

use std::io;
use std::time::Duration;

use crate::args::RedisOptions;
use crate::redis::{self, Cluster, Standalone, Tools};
use crate::secure::{Secure, TlsCluster};
use crate::sentinel::SentinelSet;
use crate::{Error, Result};

/// The servers `test` and `redis` start; dropping them stops them.
#[derive(Debug)]
pub(crate) struct Servers {
    /// The standalone server.
    standalone: Option<Standalone>,
    /// The Cluster.
    cluster: Option<Cluster>,
    /// The TLS Cluster (dropped before `secure`: it reads its certificates).
    tls_cluster: Option<TlsCluster>,
    /// The TLS servers with their ACL user.
    secure: Option<Secure>,
    /// The Sentinel-managed primary.
    sentinel: Option<SentinelSet>,
    /// The same over TLS (dropped before `secure`: it reads its
    /// certificates).
    tls_sentinel: Option<SentinelSet>,
}

impl Servers {
    /// Starts a standalone server and a Cluster.
    pub(crate) fn start(tools: &Tools, masters: usize, replicas_per_master: usize) -> Result<Self> {
        let standalone = Standalone::start(tools)?;
        eprintln!("    standalone server: {}", standalone.url());
        let cluster = Cluster::start(tools, masters, replicas_per_master)?;
        eprintln!("    Cluster masters:   {}", cluster.urls().join(" "));
        if replicas_per_master > 0 {
            eprintln!("    Cluster nodes:     {}", cluster.node_urls().join(" "));
        }
        let mut servers = Self {
            standalone: Some(standalone),
            cluster: Some(cluster),
            tls_cluster: None,
            secure: None,
            sentinel: None,
            tls_sentinel: None,
        };
        let secure = Secure::start(tools)?;
        eprintln!(
            "    TLS + ACL servers: started (PORTCULLIS_REDIS_TLS_URL, PORTCULLIS_REDIS_MTLS_URL)"
        );
        let tls_cluster = TlsCluster::start(tools, &secure)?;
        eprintln!("    TLS Cluster:       3 masters (PORTCULLIS_REDIS_TLS_CLUSTER_URLS)");
        servers.tls_cluster = Some(tls_cluster);
        let tls_sentinel = SentinelSet::start_tls(tools, secure.certs())?;
        eprintln!(
            "    TLS Sentinel set:  primary + replica + 3 Sentinels (PORTCULLIS_REDIS_TLS_SENTINEL_URLS)"
        );
        servers.tls_sentinel = Some(tls_sentinel);
        servers.secure = Some(secure);
        let sentinel = SentinelSet::start(tools)?;
        eprintln!("    Sentinel set:      primary + replica + 3 Sentinels");
        servers.sentinel = Some(sentinel);
        Ok(servers)
    }

    /// `PORTCULLIS_REDIS_URL` and `PORTCULLIS_REDIS_CLUSTER_URLS`.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(standalone) = &self.standalone {
            env.extend(standalone.env());
        }
        if let Some(cluster) = &self.cluster {
            env.extend(cluster.env());
        }
        if let Some(secure) = &self.secure {
            env.extend(secure.env());
            if let Some(tls_cluster) = &self.tls_cluster {
                env.extend(tls_cluster.env(secure));
            }
        }
        if let Some(sentinel) = &self.sentinel {
            env.extend(sentinel.env());
        }
        if let Some(sentinel) = &self.tls_sentinel {
            env.extend(sentinel.tls_env());
        }
        env
    }

    /// Stops every server (the same as dropping, said out loud).
    pub(crate) fn stop(self) {
        drop(self);
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if self.standalone.is_some() || self.cluster.is_some() {
            eprintln!("xtask: stopping the Redis servers");
        }
        drop(self.sentinel.take());
        drop(self.tls_sentinel.take());
        drop(self.tls_cluster.take());
        drop(self.secure.take());
        drop(self.standalone.take());
        drop(self.cluster.take());
    }
}

/// `cargo xtask redis`: start servers, print exports, wait.
pub(crate) fn serve_redis(options: RedisOptions) -> Result<()> {
    let tools = Tools::discover()?;
    eprintln!(
        "xtask: starting {} ({})",
        tools.server.display(),
        tools.server_version()
    );
    let servers = Servers::start(&tools, options.masters, options.replicas_per_master)?;
    let mut env = servers.env();
    env.extend(tools.env());
    redis::write_exports(&mut io::stdout().lock(), &env)
        .map_err(|e| Error::new(format!("could not write to stdout: {e}")))?;
    if options.watch_stdin {
        eprintln!(
            "xtask: Redis is running; paste the export lines above into your shell. \
             Stop with Ctrl-C or Ctrl-D (end of stdin)."
        );
        // Discard input until EOF; a read error also ends the wait.
        let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
    } else {
        eprintln!("xtask: Redis is running; stop with Ctrl-C or by killing this process.");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    servers.stop();
    eprintln!("xtask: stopped");
    Ok(())
}
