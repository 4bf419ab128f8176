//! The configuration in force ([`LiveConfig`], swapped atomically, read
//! without a lock) and the file it comes from ([`ConfigFile`]: read,
//! reloaded when it changes; an invalid new file is refused and the
//! configuration in force stays).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

use crate::{Config, ConfigError};

/// The configuration the services read on every request: swapped
/// atomically by [`LiveConfig::replace`] (or a [`ConfigFile`]'s reload), so
/// a request sees one configuration from start to end. Clones share it.
///
/// ```
/// use portcullis_envoy::{Config, LiveConfig};
///
/// let live = LiveConfig::new(Config::default());
/// assert!(!live.load().has_domain("edge"));
/// live.replace(Config::parse("x.toml", "[[domains]]\nname = \"edge\"\n")?);
/// assert!(live.load().has_domain("edge"));
/// # Ok::<(), portcullis_envoy::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LiveConfig {
    current: Arc<ArcSwap<Config>>,
}

impl LiveConfig {
    /// A live configuration holding `config`.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(config)),
        }
    }

    /// The configuration in force.
    #[must_use]
    pub fn load(&self) -> Arc<Config> {
        self.current.load_full()
    }

    /// Puts `config` in force for every request that starts from now on.
    pub fn replace(&self, config: Config) {
        self.current.store(Arc::new(config));
    }
}

/// A configuration file, read at [`open`](ConfigFile::open) and reloaded
/// by [`reload`](ConfigFile::reload) (or [`watch`](ConfigFile::watch)):
/// a changed, valid file is put in force at once; an invalid one is
/// refused with its error and the configuration in force stays.
///
/// ```
/// use portcullis_envoy::ConfigFile;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("envoy.toml");
/// std::fs::write(&path, "[[domains]]\nname = \"edge\"\n")?;
/// let file = ConfigFile::open(&path)?;
/// let live = file.live();
/// std::fs::write(&path, "[[domains]]\nname = \"api\"\n")?;
/// assert!(file.reload()?);
/// assert!(live.load().has_domain("api"));
/// std::fs::write(&path, "[[domains]]\nnam = \"oops\"\n")?;
/// assert!(file.reload().is_err());
/// assert!(live.load().has_domain("api"));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ConfigFile {
    path: PathBuf,
    live: LiveConfig,
    /// The SHA-256 of the text in force.
    hash: Mutex<[u8; 32]>,
    /// The last refusal logged (its message), until a reload succeeds.
    refusal: Mutex<Option<String>>,
}

impl ConfigFile {
    /// Reads and parses the file at `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Io`] when it cannot be read, [`ConfigError::Invalid`]
    /// when it is not a valid configuration.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref().to_path_buf();
        let text = read(&path)?;
        let config = Config::parse(&path, &text)?;
        Ok(Self {
            live: LiveConfig::new(config),
            hash: Mutex::new(hash(&text)),
            refusal: Mutex::new(None),
            path,
        })
    }

    /// The live configuration this file updates.
    #[must_use]
    pub fn live(&self) -> LiveConfig {
        self.live.clone()
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file again: `Ok(true)` when a changed configuration was
    /// put in force, `Ok(false)` when the text is unchanged.
    ///
    /// # Errors
    ///
    /// As [`ConfigFile::open`]; the configuration in force stays.
    pub fn reload(&self) -> Result<bool, ConfigError> {
        let text = read(&self.path)?;
        let new_hash = hash(&text);
        let mut in_force = self.hash.lock().unwrap_or_else(PoisonError::into_inner);
        if *in_force == new_hash {
            return Ok(false);
        }
        let config = Config::parse(&self.path, &text)?;
        self.live.replace(config);
        *in_force = new_hash;
        Ok(true)
    }

    /// Reloads the file every `interval` on a tokio task (which ends when
    /// the returned handle is aborted or the runtime stops), logging each
    /// change put in force at `info` and each refused text once at
    /// `error` (target `portcullis_envoy::config`). Call it inside a tokio
    /// runtime.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let file = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                file.reload_and_log();
            }
        })
    }

    /// [`ConfigFile::reload`], logged as [`ConfigFile::watch`] says.
    pub fn reload_and_log(&self) {
        match self.reload() {
            Ok(true) => {
                *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = None;
                tracing::info!(
                    target: "portcullis_envoy::config",
                    path = %self.path.display(),
                    domains = ?self.live.load().domains(),
                    "rate-limit configuration reloaded"
                );
            }
            Ok(false) => {}
            Err(error) => {
                let text = error.to_string();
                let mut last = self.refusal.lock().unwrap_or_else(PoisonError::into_inner);
                // Once per distinct cause, not once per attempt.
                if last.as_deref() != Some(text.as_str()) {
                    tracing::error!(
                        target: "portcullis_envoy::config",
                        "{text}; the configuration in force stays"
                    );
                    *last = Some(text);
                }
            }
        }
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn hash(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}
