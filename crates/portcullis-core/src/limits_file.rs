//! Limits from a TOML file (feature `config`), with reload: parsing with
//! errors that point into the file, reloads that keep overrides set at run
//! time, and a refused reload logged once per distinct cause.

mod parse;

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::{LimitSet, Limits};
use parse::parse;

type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Limits read from a TOML file: the default policies, named tiers and
/// per-subject overrides, held by a live [`Limits`] handle that
/// [`reload`](LimitsFile::reload) (or a [`watch`](LimitsFile::watch)er)
/// updates when the file changes. An invalid new file is refused and the
/// limits in force stay. Each reload is logged (`tracing`, target
/// `portcullis::limits`) and, with feature `metrics`, counted in
/// `portcullis_limits_reloads_total` (label `outcome`: `applied`,
/// `unchanged`, `refused`), with the gauges `portcullis_limits_version`
/// (the handle's version) and `portcullis_limits_config_hash` (the first 32
/// bits of the file's SHA-256, [`hash`](LimitsFile::hash)).
///
/// The format: policies by name, then which of them the defaults, each
/// tier and each override get. A policy has a `limit`, a `period` (a whole
/// number and a unit: `us`, `ms`, `s`, `m`, `h` or `d`), and optionally an
/// `algorithm` (`gcra`, the default, `token_bucket`, `leaky_meter`,
/// `leaky_queue`, `fixed_window`, `sliding_window`, `sliding_log`) and a
/// `burst`. An override gives a subject (a key as the layer's extractor
/// produces it) a `tier` or `policies` of its own.
///
/// **Overrides of hashed keys.** A layer keyed by a credential
/// ([`ApiKey`](https://docs.rs/portcullis-tower/latest/portcullis_tower/struct.ApiKey.html),
/// `BearerToken`) keys on its SHA-256, never on the secret: write such an
/// override as `"#"` and the 64 hex digits of the SHA-256 of the key
/// (upper or lower case), which keeps the secret itself out of the file.
/// Compute it with `printf '%s' "$API_KEY" | sha256sum` (no trailing
/// newline), or [`subject::hash_subject`](crate::subject::hash_subject). A
/// subject starting with `#` that is not such a hash is refused, rather
/// than matching nobody.
///
/// ```
/// use portcullis::LimitsFile;
/// use portcullis::subject::hash_subject;
///
/// let set = LimitsFile::parse("limits.toml", r##"
/// default = ["free"]
/// [policies]
/// free = { limit = 100, period = "1m" }
/// vip = { limit = 5000, period = "1m" }
/// [overrides]
/// ## printf '%s' 'k-live-7f3a' | sha256sum
/// "#e2289561ad41e8d29444a1372d6f40455240e594ce090c8d41ae94835c7b4046" = { policies = ["vip"] }
/// "##).unwrap();
/// // What an `ApiKey` layer keys a request with `x-api-key: k-live-7f3a` on:
/// let key = hash_subject(b"k-live-7f3a");
/// assert_eq!(set.select(&key, None).policies()[0].name(), "vip");
///
/// let err = LimitsFile::parse("limits.toml", "default = [\"free\"]\n[policies]\nfree = { limit = 1, period = \"1m\" }\n[overrides]\n\"#e2289561\" = { tier = \"x\" }\n").unwrap_err();
/// assert!(err.to_string().contains("sha256sum"), "{err}");
/// ```
///
/// ```
/// use portcullis::{LimitsFile, PolicySource};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let path = std::env::temp_dir().join(format!("portcullis-doc-{}.toml", std::process::id()));
/// std::fs::write(&path, r#"
/// default = ["free-minute", "free-day"]
///
/// [policies]
/// free-minute = { limit = 100, period = "1m" }
/// free-day = { limit = 5000, period = "1d", algorithm = "fixed_window" }
/// pro-minute = { limit = 1000, period = "1m", burst = 200 }
/// acme-minute = { limit = 20000, period = "1m" }
///
/// [tiers]
/// pro = ["pro-minute"]
///
/// [overrides]
/// "customer:globex" = { tier = "pro" }
/// "customer:acme" = { policies = ["acme-minute"] }
/// "#)?;
///
/// let file = LimitsFile::open(&path)?;
/// let limits = file.limits(); // give this to every layer
/// let set = limits.load();
/// assert_eq!(set.select("customer:acme", None).policies()[0].limit(), 20_000);
/// assert_eq!(set.select("customer:globex", None).source(), PolicySource::Override);
///
/// // A broken edit is refused with the line and the field; the limits stay.
/// std::fs::write(&path, "default = [\"free-minute\"]\n[policies]\nfree-minute = { limit = 100, period = \"1 minute\" }\n")?;
/// let err = file.reload().unwrap_err();
/// assert!(err.to_string().contains(":3:"), "{err}");
/// assert!(err.to_string().contains("policies.free-minute.period"), "{err}");
/// assert_eq!(limits.version(), 1);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LimitsFile {
    inner: Arc<FileInner>,
}

struct FileInner {
    path: PathBuf,
    limits: Limits,
    /// What the last reload left; also serialises reloads.
    state: Mutex<FileState>,
}

struct FileState {
    /// The hash of the file whose limits are in force.
    hash: String,
    /// That file's limits, as the file gives them (without the overrides
    /// set at run time since): what a reload compares the set in force to.
    from_file: Arc<LimitSet>,
    /// The cause of the last refused reload, with its sources, while the
    /// file stays refused: logged once, not at every poll.
    refused: Option<String>,
}

impl fmt::Debug for LimitsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitsFile")
            .field("path", &self.inner.path)
            .field("hash", &self.hash())
            .field("version", &self.inner.limits.version())
            .finish()
    }
}

/// What a [`LimitsFile::reload`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reload {
    /// The file has not changed since its limits were loaded.
    Unchanged {
        /// Its hash ([`LimitsFile::hash`]).
        hash: String,
    },
    /// The file changed and its limits are now in force.
    Applied {
        /// The [`Limits`] version they have.
        version: u64,
        /// The new file's hash.
        hash: String,
    },
}

impl LimitsFile {
    /// A duration as limits files write it: a whole number and a unit,
    /// `us` (or `µs`), `ms`, `s`, `m` (or `min`), `h` or `d`; `None` for
    /// anything else, or past `u64` microseconds. The Envoy service's
    /// configuration reads periods the same way.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::LimitsFile;
    ///
    /// assert_eq!(LimitsFile::parse_duration("90s"), Some(Duration::from_secs(90)));
    /// assert_eq!(LimitsFile::parse_duration("1d"), Some(Duration::from_secs(86_400)));
    /// assert_eq!(LimitsFile::parse_duration("1.5h"), None);
    /// ```
    #[must_use]
    pub fn parse_duration(text: &str) -> Option<Duration> {
        parse::parse_duration(text)
    }

    /// Reads and validates the file, and makes a [`Limits`] handle holding
    /// its limits.
    ///
    /// # Errors
    ///
    /// A [`LimitsFileError`] naming the file, and for a bad file the line
    /// and the field and what is allowed there.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LimitsFileError> {
        let path = path.as_ref().to_path_buf();
        let (set, hash) = read(&path)?;
        let from_file = Arc::new(set.clone());
        let limits = Limits::new(set);
        observe_applied(&limits, &hash);
        Ok(Self {
            inner: Arc::new(FileInner {
                path,
                limits,
                state: Mutex::new(FileState {
                    hash,
                    from_file,
                    refused: None,
                }),
            }),
        })
    }

    /// Parses limits from TOML text; `name` (a file name) only appears in
    /// errors.
    ///
    /// ```
    /// use portcullis::LimitsFile;
    ///
    /// let err = LimitsFile::parse("limits.toml", "default = [\"x\"]\n[policies.x]\nlimt = 5\n").unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "limits.toml:3:1: policies.x.limt: unknown field `limt`, expected one of `limit`, `period`, `algorithm`, `burst`"
    /// );
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LimitsFile::open`].
    pub fn parse(name: impl AsRef<Path>, text: &str) -> Result<LimitSet, LimitsFileError> {
        parse(name.as_ref(), text)
    }

    /// The live handle: give clones of it to every layer.
    #[must_use]
    pub fn limits(&self) -> Limits {
        self.inner.limits.clone()
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The SHA-256 of the file whose limits are in force, as 16 hex digits
    /// (its first 64 bits): what to compare between instances.
    #[must_use]
    pub fn hash(&self) -> String {
        self.lock_state().hash.clone()
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, FileState> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads the file again; if it changed and is valid, swaps its limits
    /// in. The outcome is logged and counted (see the type's docs).
    ///
    /// **Overrides set at run time are kept.** An override added, changed
    /// or removed with [`Limits::update`] since the file was loaded stays
    /// so across reloads (it is newer than the file, and it lives in this
    /// process only: put lasting ones in the file); to hand a subject back
    /// to the file, set its override to what the file says. The defaults
    /// and tiers are the file's: run-time changes to them are replaced,
    /// with a warning. A reload is refused if a kept override names a tier
    /// the new file no longer defines.
    ///
    /// **A refused reload** is logged at `error` with its cause and the
    /// cause's sources (file:line:column, field and reason; the OS error
    /// when the file cannot be read) once, not at every poll: again only
    /// when the cause changes, and at `info` when the file is valid again.
    ///
    /// ```
    /// use portcullis::{LimitsFile, Policy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let path = std::env::temp_dir().join(format!("portcullis-reload-doc-{}.toml", std::process::id()));
    /// std::fs::write(&path, "default = [\"free\"]\n[policies]\nfree = { limit = 10, period = \"1m\" }\n")?;
    /// let file = LimitsFile::open(&path)?;
    /// let limits = file.limits();
    /// // A customer upgraded at run time (say, by a billing webhook).
    /// limits.update(|set| set.override_policies("acme", [Policy::per_minute(500).name("acme").build().unwrap()]))?;
    /// std::fs::write(&path, "default = [\"free\"]\n[policies]\nfree = { limit = 20, period = \"1m\" }\n")?;
    /// file.reload()?;
    /// assert_eq!(limits.load().defaults()[0].limit(), 20); // the file's change
    /// assert!(limits.load().override_for("acme").is_some()); // kept
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The file cannot be read or is invalid: the limits in force stay.
    pub fn reload(&self) -> Result<Reload, LimitsFileError> {
        let mut state = self.lock_state();
        let outcome = (|| {
            let text = read_text(&self.inner.path)?;
            let hash = hash_of(&text);
            if hash == state.hash {
                return Ok(Reload::Unchanged { hash });
            }
            let set = parse(&self.inner.path, &text)?;
            let from_file = Arc::new(set.clone());
            let version = self.inner.limits.replace_with(|current| {
                keep_runtime_overrides(&self.inner.path, &state.from_file, current, set)
            })?;
            state.hash.clone_from(&hash);
            state.from_file = from_file;
            Ok(Reload::Applied { version, hash })
        })();
        let path = self.inner.path.display();
        match &outcome {
            Ok(Reload::Applied { version, hash }) => {
                if state.refused.take().is_some() {
                    tracing::info!(target: "portcullis::limits", path = %path, "limits file valid again");
                }
                tracing::info!(target: "portcullis::limits", path = %path, version, hash, "limits reloaded");
                count_reload("applied");
                observe_applied(&self.inner.limits, hash);
            }
            Ok(Reload::Unchanged { hash }) => {
                if state.refused.take().is_some() {
                    tracing::info!(target: "portcullis::limits", path = %path, hash, "limits file valid again, as the limits in force");
                }
                count_reload("unchanged");
            }
            Err(error) => {
                let cause = with_sources(error);
                if state.refused.as_deref() == Some(cause.as_str()) {
                    tracing::debug!(target: "portcullis::limits", error = %cause, "limits file still refused");
                } else {
                    tracing::error!(target: "portcullis::limits", error = %cause, hash = %state.hash, "limits file refused; the limits in force stay (logged again when the cause changes)");
                    state.refused = Some(cause);
                }
                count_reload("refused");
            }
        }
        outcome
    }

    /// Re-reads the file every `interval` on a thread of its own (a read
    /// and a hash of a small file: cheap), applying it when it changed,
    /// until the returned [`Watcher`] is dropped. With an interval of one
    /// second, every instance enforces a change within about a second.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let path = std::env::temp_dir().join(format!("portcullis-watch-doc-{}.toml", std::process::id()));
    /// # std::fs::write(&path, "default = [\"api\"]\n[policies]\napi = { limit = 10, period = \"1s\" }\n")?;
    /// use std::time::Duration;
    /// use portcullis::LimitsFile;
    ///
    /// let file = LimitsFile::open(&path)?;
    /// let watcher = file.watch(Duration::from_secs(1));
    /// // ... serve; the limits follow the file ...
    /// drop(watcher); // stops watching
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    #[must_use = "the watcher stops when dropped"]
    pub fn watch(&self, interval: Duration) -> Watcher {
        let (stop, stopped) = mpsc::channel::<()>();
        let file = self.clone();
        let thread = std::thread::Builder::new()
            .name("portcullis-limits-watch".into())
            .spawn(move || {
                // Until the sender is dropped (or sends).
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    // Logged and counted by `reload`.
                    let _ = file.reload();
                }
            });
        if let Err(error) = &thread {
            tracing::error!(target: "portcullis::limits", %error, "cannot start the limits file watcher; call reload() instead");
        }
        Watcher {
            stop: Some(stop),
            thread: thread.ok(),
        }
    }
}

/// Watches a [`LimitsFile`] ([`LimitsFile::watch`]); stops when dropped.
#[derive(Debug)]
pub struct Watcher {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An error and each of its sources, as one line.
fn with_sources(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The new file's `set` with the overrides set at run time kept: those in
/// `current` (the set in force) that differ from `from_file` (what the
/// previous file gave). Warns when run-time changes to the defaults or
/// tiers are replaced.
fn keep_runtime_overrides(
    path: &Path,
    from_file: &LimitSet,
    current: &LimitSet,
    set: LimitSet,
) -> Result<LimitSet, LimitsFileError> {
    if current.defaults() != from_file.defaults() || current.tiers().ne(from_file.tiers()) {
        tracing::warn!(target: "portcullis::limits", path = %path.display(), "the default policies or tiers were changed at run time since the file was loaded; the file's replace them (put lasting changes in the file)");
    }
    let changed: Vec<(&str, &crate::Override)> = current
        .overrides()
        .filter(|(subject, value)| from_file.override_for(subject) != Some(*value))
        .collect();
    let removed: Vec<&str> = from_file
        .overrides()
        .map(|(subject, _)| subject)
        .filter(|subject| current.override_for(subject).is_none())
        .collect();
    if changed.is_empty() && removed.is_empty() {
        return Ok(set);
    }
    let mut builder = set.to_builder();
    for (subject, value) in &changed {
        builder = match value {
            crate::Override::Tier(tier) => builder.override_tier(*subject, &**tier),
            crate::Override::Policies(policies) => {
                builder.override_policies(*subject, policies.iter().cloned())
            }
        };
    }
    for subject in &removed {
        builder = builder.remove_override(subject);
    }
    let kept = builder.build().map_err(|error| LimitsFileError::Invalid {
        path: path.to_path_buf(),
        line: 0,
        column: 0,
        field: "(overrides set at run time)".to_owned(),
        message: "an override set at run time (kept across reloads) does not fit the new file: define what it names in the file, or change or remove the override with Limits::update".to_owned(),
        source: Some(Box::new(error)),
    })?;
    tracing::info!(target: "portcullis::limits", path = %path.display(), kept = changed.len() + removed.len(), "overrides set at run time kept over the file's");
    Ok(kept)
}

fn count_reload(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("portcullis_limits_reloads_total", "outcome" => outcome).increment(1);
    let _ = outcome;
}

fn observe_applied(limits: &Limits, hash: &str) {
    #[cfg(feature = "metrics")]
    {
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!("portcullis_limits_version").set(limits.version() as f64);
        let prefix = u32::from_str_radix(hash.get(..8).unwrap_or("0"), 16).unwrap_or(0);
        metrics::gauge!("portcullis_limits_config_hash").set(f64::from(prefix));
    }
    let _ = (limits, hash);
}

fn read_text(path: &Path) -> Result<String, LimitsFileError> {
    std::fs::read_to_string(path).map_err(|source| LimitsFileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read(path: &Path) -> Result<(LimitSet, String), LimitsFileError> {
    let text = read_text(path)?;
    let set = parse(path, &text)?;
    Ok((set, hash_of(&text)))
}

fn hash_of(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a limits file was refused. The limits in force stay as they were.
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitsFileError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid limits: bad TOML, an unknown or missing field,
    /// a bad value, a policy that does not validate, or a name that refers
    /// to nothing.
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line (0 when unknown).
        line: usize,
        /// 1-based column (0 when unknown).
        column: usize,
        /// The field, as a dotted path (`policies.free-minute.period`).
        field: String,
        /// What is wrong and what is allowed.
        message: String,
        /// The underlying error, for a policy or a set that does not
        /// validate.
        source: Option<BoxError>,
    },
}

impl fmt::Display for LimitsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, .. } => write!(
                f,
                "cannot read the limits file {}: check the path and its permissions",
                path.display()
            ),
            Self::Invalid {
                path,
                line,
                column,
                field,
                message,
                ..
            } => write!(f, "{}:{line}:{column}: {field}: {message}", path.display()),
        }
    }
}

impl Error for LimitsFileError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Read { source, .. } => Some(source),
            Self::Invalid { source, .. } => source.as_deref().map(|e| e as &(dyn Error + 'static)),
        }
    }
}
