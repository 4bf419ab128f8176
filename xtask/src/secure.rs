//! The production-like servers `cargo xtask test` starts besides the plain
//! ones: TLS redis-servers (client certificates optional, and required)
//! whose users need a password and one of which is an ACL user allowed only
//! what portcullis needs ([`Secure`]), and a TLS Cluster ([`TlsCluster`]).
//! Certificates are generated at each run with rcgen ([`Certs`]); no key is
//! ever committed. The Sentinel sets are in `sentinel.rs`.

use std::fs;
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::redis::{display, info_field, pick_port, slot_ranges, xtask_dir, Server, Tools};
use crate::resp::{Connection, Reply};
use crate::{Error, Result};

/// The ACL user of the TLS servers.
pub(crate) const ACL_USER: &str = "portcullis";
/// What the ACL user may do: the key prefixes of the tests (`pc-test…`)
/// and of the examples (`portcullis:`), and only the commands of
/// `portcullis_redis::ACL_COMMANDS`.
const ACL_RULES: &[&str] = &[
    "~pc-test*",
    "~portcullis:*",
    "+ping",
    "+evalsha",
    "+script|load",
    "+del",
    "+hmget",
    "+time",
    "+get",
    "+set",
    "+exists",
    "+hset",
    "+pexpire",
    "+pexpireat",
    "+zadd",
    "+zcount",
    "+zrangebyscore",
    "+zremrangebyrank",
    "+zremrangebyscore",
    "+zrevrange",
    "+zcard",
    "+zscore",
    "+zrem",
];
/// What [`ACL_USER`] may do besides [`ACL_RULES`] on a Cluster node:
/// `portcullis_redis::ACL_CLUSTER_COMMANDS`.
const CLUSTER_ACL_RULES: [&str; 2] = ["+cluster|slots", "+asking"];
/// Timeout of the control connections.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a Cluster or a Sentinel set may take to form.
pub(crate) const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// A random-enough token for passwords and directory names.
fn token(salt: &str) -> String {
    let random = std::collections::hash_map::RandomState::new();
    format!(
        "{:016x}{:016x}",
        random.hash_one((salt, std::process::id())),
        random.hash_one((std::process::id(), salt))
    )
}

/// A CA, a server certificate (for `localhost` and 127.0.0.1) and a client
/// certificate, as PEM files in a directory of their own, removed on drop.
#[derive(Debug)]
pub(crate) struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// Generates the certificates into `target/xtask/tls-<random>/`.
    ///
    /// # Errors
    ///
    /// When rcgen fails or the files cannot be written.
    pub(crate) fn generate() -> Result<Self> {
        let dir = xtask_dir().join(format!("tls-{}", &token("tls")[..12]));
        fs::create_dir_all(&dir)
            .map_err(|e| Error::new(format!("could not create {}: {e}", dir.display())))?;
        let certs = Self { dir };
        let failed =
            |e: rcgen::Error| Error::new(format!("could not generate test certificates: {e}"));

        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "portcullis test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(failed)?;
        let ca = ca_params.self_signed(&ca_key).map_err(failed)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(names).map_err(failed)?;
            params.distinguished_name.push(DnType::CommonName, cn);
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().map_err(failed)?;
            let cert = params.signed_by(&key, &issuer).map_err(failed)?;
            Ok::<_, Error>((cert.pem(), key.serialize_pem()))
        };
        let (server_pem, server_key) = leaf(
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_pem, client_key) = leaf(
            Vec::new(),
            "portcullis test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        for (name, text) in [
            ("ca.pem", ca.pem()),
            ("server.pem", server_pem),
            ("server.key", server_key),
            ("client.pem", client_pem),
            ("client.key", client_key),
        ] {
            let path = certs.dir.join(name);
            fs::write(&path, text)
                .map_err(|e| Error::new(format!("could not write {}: {e}", path.display())))?;
        }
        Ok(certs)
    }

    /// The path of one of the files (`ca.pem`, `server.pem`, …).
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One TLS redis-server: its plain port (for xtask's control connection
/// and for comparisons over TCP) and its TLS port.
#[derive(Debug)]
pub(crate) struct TlsServer {
    pub(crate) server: Server,
    pub(crate) tls_port: u16,
}

/// The TLS servers, their certificates and passwords.
#[derive(Debug)]
pub(crate) struct Secure {
    /// Client certificates optional (`tls-auth-clients optional`).
    tls: TlsServer,
    /// Client certificates required (`tls-auth-clients yes`).
    mtls: TlsServer,
    /// The ACL user's password.
    password: String,
    /// The `default` user's password (password-only URLs).
    admin_password: String,
    /// Dropped last: the servers read them.
    certs: Certs,
}

impl Secure {
    /// The certificates the servers use.
    pub(crate) fn certs(&self) -> &Certs {
        &self.certs
    }

    /// Generates certificates, starts both TLS servers and sets their users
    /// up: [`ACL_USER`] with only [`ACL_RULES`], and a password on
    /// `default`.
    ///
    /// # Errors
    ///
    /// When a server does not start (a redis-server built without TLS
    /// says so in its log) or the ACL setup is refused.
    pub(crate) fn start(tools: &Tools) -> Result<Self> {
        let certs = Certs::generate()?;
        let password = token("acl");
        let admin_password = token("admin");
        let tls = start_tls(tools, &certs, "optional")?;
        let mtls = start_tls(tools, &certs, "yes")?;
        for server in [&tls, &mtls] {
            set_up_users(&server.server, &password, &admin_password)?;
        }
        Ok(Self {
            tls,
            mtls,
            password,
            admin_password,
            certs,
        })
    }

    /// The `PORTCULLIS_REDIS_TLS_*` and `PORTCULLIS_REDIS_ACL_*` variables.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let user = format!("{ACL_USER}:{}", self.password);
        vec![
            (
                "PORTCULLIS_REDIS_TLS_URL",
                format!("rediss://{user}@127.0.0.1:{}", self.tls.tls_port),
            ),
            (
                "PORTCULLIS_REDIS_MTLS_URL",
                format!("rediss://{user}@127.0.0.1:{}", self.mtls.tls_port),
            ),
            (
                "PORTCULLIS_REDIS_TLS_CA",
                display(&self.certs.path("ca.pem")),
            ),
            (
                "PORTCULLIS_REDIS_TLS_CLIENT_CERT",
                display(&self.certs.path("client.pem")),
            ),
            (
                "PORTCULLIS_REDIS_TLS_CLIENT_KEY",
                display(&self.certs.path("client.key")),
            ),
            (
                "PORTCULLIS_REDIS_ACL_URL",
                format!("redis://{user}@127.0.0.1:{}", self.tls.server.port),
            ),
            (
                "PORTCULLIS_REDIS_ACL_ADMIN_URL",
                format!(
                    "redis://:{}@127.0.0.1:{}",
                    self.admin_password, self.tls.server.port
                ),
            ),
        ]
    }
}

/// Starts a redis-server with a plain port and a TLS port.
fn start_tls(tools: &Tools, certs: &Certs, auth_clients: &str) -> Result<TlsServer> {
    start_tls_with(tools, certs, auth_clients, &[])
}

/// [`start_tls`] with more arguments.
pub(crate) fn start_tls_with(
    tools: &Tools,
    certs: &Certs,
    auth_clients: &str,
    extra: &[&str],
) -> Result<TlsServer> {
    let tls_port = pick_port()?;
    let port_text = tls_port.to_string();
    let files = [
        display(&certs.path("server.pem")),
        display(&certs.path("server.key")),
        display(&certs.path("ca.pem")),
    ];
    let mut args = vec![
        "--tls-port",
        &port_text,
        "--tls-cert-file",
        &files[0],
        "--tls-key-file",
        &files[1],
        "--tls-ca-cert-file",
        &files[2],
        "--tls-auth-clients",
        auth_clients,
    ];
    args.extend(extra);
    let server = Server::start(tools, &args).map_err(|e| {
        Error::new(format!(
            "the TLS redis-server did not start: {e}\n(Debian's redis-server has TLS built in: \
             `ldd {} | grep ssl` should list libssl; `redis-server --version` says which build)",
            tools.server.display()
        ))
    })?;
    Ok(TlsServer { server, tls_port })
}

/// Creates [`ACL_USER`] and gives `default` a password (last: the control
/// connection is already authenticated).
fn set_up_users(server: &Server, password: &str, admin_password: &str) -> Result<()> {
    set_up_users_with(server, password, admin_password, &[])
}

/// [`set_up_users`] with more rules for [`ACL_USER`]; a Cluster node also
/// gets `<ACL_USER>-no-cluster`, with only [`ACL_RULES`].
fn set_up_users_with(
    server: &Server,
    password: &str,
    admin_password: &str,
    extra_rules: &[&str],
) -> Result<()> {
    let mut conn = server.connect()?;
    let setuser = |name: &str, extra: &[&str]| {
        let mut args = vec![
            "ACL".to_owned(),
            "SETUSER".to_owned(),
            name.to_owned(),
            "reset".to_owned(),
            "on".to_owned(),
            format!(">{password}"),
        ];
        args.extend(ACL_RULES.iter().chain(extra).map(|rule| (*rule).to_owned()));
        args
    };
    expect_ok(&mut conn, &setuser(ACL_USER, extra_rules), server.port)?;
    if !extra_rules.is_empty() {
        let name = format!("{ACL_USER}-no-cluster");
        expect_ok(&mut conn, &setuser(&name, &[]), server.port)?;
    }
    expect_ok(
        &mut conn,
        &[
            "ACL".to_owned(),
            "SETUSER".to_owned(),
            "default".to_owned(),
            "resetpass".to_owned(),
            format!(">{admin_password}"),
        ],
        server.port,
    )
}

fn expect_ok(conn: &mut Connection, args: &[String], port: u16) -> Result<()> {
    match conn.command(args) {
        Ok(Reply::Status(_)) => Ok(()),
        Ok(reply) => Err(Error::new(format!(
            "`{} {} {}` on 127.0.0.1:{port} replied {reply}",
            args[0], args[1], args[2]
        ))),
        Err(e) => Err(Error::new(format!(
            "`{} {}` on 127.0.0.1:{port} failed: {e}",
            args[0], args[1]
        ))),
    }
}

/// A Redis Cluster of three masters speaking TLS to clients and on the
/// cluster bus (`tls-cluster yes`), sharing [`Secure`]'s certificates and
/// ACL users. Plain ports stay open for xtask's control connections.
#[derive(Debug)]
pub(crate) struct TlsCluster {
    nodes: Vec<TlsServer>,
}

impl TlsCluster {
    /// Starts the nodes, meets them over their TLS bus, assigns the slots,
    /// waits for `cluster_state:ok` and sets the users up.
    ///
    /// # Errors
    ///
    /// When a node does not start or the Cluster does not form in 30 s.
    pub(crate) fn start(tools: &Tools, secure: &Secure) -> Result<Self> {
        let files = [
            display(&secure.certs.path("client.pem")),
            display(&secure.certs.path("client.key")),
        ];
        let extra = [
            "--tls-cluster",
            "yes",
            // The bus checks the connecting node's certificate: present the
            // client one (the server one is for server authentication only).
            "--tls-client-cert-file",
            &files[0],
            "--tls-client-key-file",
            &files[1],
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        let mut nodes = Vec::with_capacity(3);
        for _ in 0..3 {
            nodes.push(start_tls_with(tools, &secure.certs, "optional", &extra)?);
        }
        let command = |port: u16, args: &[String]| -> Result<()> {
            let mut conn = Connection::open(port, IO_TIMEOUT)
                .map_err(|e| Error::new(format!("could not connect to 127.0.0.1:{port}: {e}")))?;
            expect_ok(&mut conn, args, port)
        };
        let strings =
            |args: &[&str]| -> Vec<String> { args.iter().map(|s| (*s).to_owned()).collect() };
        for node in &nodes[1..] {
            // With tls-cluster the bus port is the TLS port + 10000.
            command(
                nodes[0].server.port,
                &strings(&["CLUSTER", "MEET", "127.0.0.1", &node.tls_port.to_string()]),
            )?;
        }
        for (node, (first, last)) in nodes.iter().zip(slot_ranges(3)) {
            // ADDSLOTS with every slot, not ADDSLOTSRANGE: Redis 6.2 has
            // only the former.
            let mut addslots = strings(&["CLUSTER", "ADDSLOTS"]);
            addslots.extend((first..=last).map(|slot| slot.to_string()));
            command(node.server.port, &addslots)?;
        }
        let deadline = Instant::now() + FORM_TIMEOUT;
        for node in &nodes {
            loop {
                let info = Connection::open(node.server.port, IO_TIMEOUT)
                    .and_then(|mut conn| conn.text(&["CLUSTER", "INFO"]))
                    .unwrap_or_default();
                if info_field(&info, "cluster_state") == Some("ok")
                    && info_field(&info, "cluster_known_nodes") == Some("3")
                {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(Error::new(format!(
                        "the TLS Cluster did not form within {} s: 127.0.0.1:{} says\n{info}\n\
                         its log ends with:\n{}",
                        FORM_TIMEOUT.as_secs(),
                        node.server.port,
                        node.server.log_tail()
                    )));
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
        for node in &nodes {
            set_up_users_with(
                &node.server,
                &secure.password,
                &secure.admin_password,
                &CLUSTER_ACL_RULES,
            )?;
        }
        Ok(Self { nodes })
    }

    /// `PORTCULLIS_REDIS_TLS_CLUSTER_URLS`: the masters' TLS URLs with the
    /// `default` user's password (`rediss://:<password>@127.0.0.1:<port>`).
    pub(crate) fn env(&self, secure: &Secure) -> Vec<(&'static str, String)> {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|node| {
                format!(
                    "rediss://:{}@127.0.0.1:{}",
                    secure.admin_password, node.tls_port
                )
            })
            .collect();
        vec![("PORTCULLIS_REDIS_TLS_CLUSTER_URLS", urls.join(","))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_are_generated_and_removed() {
        let certs = Certs::generate().unwrap();
        let dir = certs.dir.clone();
        for (name, marker) in [
            ("ca.pem", "BEGIN CERTIFICATE"),
            ("server.pem", "BEGIN CERTIFICATE"),
            ("client.pem", "BEGIN CERTIFICATE"),
            ("server.key", "PRIVATE KEY"),
            ("client.key", "PRIVATE KEY"),
        ] {
            let text = fs::read_to_string(certs.path(name)).unwrap();
            assert!(text.contains(marker), "{name}: {text}");
        }
        drop(certs);
        assert!(!dir.exists(), "{} should be removed", dir.display());
    }

    #[test]
    fn tls_servers_serve_tls_and_the_acl_user_is_limited() {
        let tools = Tools::discover().unwrap();
        let secure = Secure::start(&tools).unwrap();
        let env = secure.env();
        let get = |name: &str| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.clone())
                .unwrap()
        };
        assert!(get("PORTCULLIS_REDIS_TLS_URL").starts_with("rediss://portcullis:"));
        assert!(get("PORTCULLIS_REDIS_ACL_ADMIN_URL").starts_with("redis://:"));
        // Unauthenticated on the plain port: refused.
        let mut conn = Connection::open(secure.tls.server.port, IO_TIMEOUT).unwrap();
        let reply = conn.command(&["GET", "pc-test-x"]).unwrap();
        assert!(
            matches!(&reply, Reply::Error(e) if e.starts_with("NOAUTH")),
            "{reply}"
        );
        // The ACL user may GET its keys but not run CONFIG.
        let auth = conn.command(&["AUTH", ACL_USER, &secure.password]).unwrap();
        assert_eq!(auth, Reply::Status("OK".to_owned()));
        assert!(matches!(
            conn.command(&["GET", "pc-test-x"]).unwrap(),
            Reply::Bulk(None)
        ));
        let config = conn.command(&["CONFIG", "GET", "maxmemory"]).unwrap();
        assert!(
            matches!(&config, Reply::Error(e) if e.starts_with("NOPERM")),
            "{config}"
        );
    }
}
