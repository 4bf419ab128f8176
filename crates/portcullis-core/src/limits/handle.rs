//! [`Limits`]: the live handle on the limits in force, which swaps one
//! [`LimitSet`] for another atomically at run time and calls its
//! subscribers ([`LimitsSubscription`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::error::LimitsError;
use super::set::{LimitSet, LimitSetBuilder};

/// A live handle on the limits in force: the current [`LimitSet`], swapped
/// atomically at run time.
///
/// Clones share one set: build every layer (on every route, in every
/// server of the process) from clones of one handle, and a
/// [`replace`](Limits::replace) or [`update`](Limits::update) is seen by
/// each of them at its next request. Reading is one atomic load of a
/// version and, when that changed, of the new set (no lock, no
/// allocation); writers are serialised among themselves. A set is swapped
/// whole: a check sees the old set or the new one, never half of each.
///
/// Changing a policy keeps state: stores read a subject's state through
/// the *current* policy (clamped to what it can produce), so lowering a
/// limit takes effect at once and raising one never forgets what was
/// used. A policy's state is keyed by its name: keep the name to keep the
/// count across a change, rename it to start afresh.
///
/// ```
/// use portcullis::{LimitSet, Limits, Policy, PolicySource};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limits = Limits::new(LimitSet::builder()
///     .policy(Policy::per_minute(100).name("minute").build()?)
///     .tier("pro", [Policy::per_minute(1_000).name("minute").build()?])
///     .build()?);
/// assert_eq!(limits.version(), 1);
///
/// // During an incident: lower everyone's limit, at once, everywhere.
/// let version = limits.update(|set| {
///     set.defaults([Policy::per_minute(10).name("minute").build().unwrap()])
/// })?;
/// assert_eq!(version, 2);
/// assert_eq!(limits.load().defaults()[0].limit(), 10);
///
/// // Move one customer to another tier.
/// limits.update(|set| set.override_tier("acme", "pro"))?;
/// let current = limits.load();
/// assert_eq!(current.select("acme", None).source(), PolicySource::Override);
///
/// // An invalid set is refused; the limits in force stay.
/// assert!(limits.update(|set| set.override_tier("globex", "gold")).is_err());
/// assert_eq!(limits.version(), 3);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limits {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<LimitSet>,
    /// The version of `current`, written after it.
    version: AtomicU64,
    /// Serialises writers, so versions follow the order of the swaps; holds
    /// the [`Limits::on_change`] callbacks, called under it.
    writer: Mutex<Subscribers>,
}

type OnChange = Arc<dyn Fn(&LimitSet) + Send + Sync + 'static>;

#[derive(Default)]
struct Subscribers {
    next_id: u64,
    callbacks: Vec<(u64, OnChange)>,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limits")
            .field("current", &*self.inner.current.load())
            .finish()
    }
}

impl Limits {
    /// A handle holding `set` (as version 1).
    #[must_use]
    pub fn new(mut set: LimitSet) -> Self {
        set.version = 1;
        Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(set),
                version: AtomicU64::new(1),
                writer: Mutex::new(Subscribers::default()),
            }),
        }
    }

    /// The version of the set in force: 1 for the first, one more per
    /// swap. One atomic load: cheap enough to call per request.
    #[inline]
    #[must_use]
    pub fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    /// The set in force.
    #[must_use]
    pub fn load(&self) -> Arc<LimitSet> {
        self.inner.current.load_full()
    }

    /// Swaps in `set` (already validated: a [`LimitSet`] always is) and
    /// returns its version. Requests already being checked finish with the
    /// set they started with.
    pub fn replace(&self, set: LimitSet) -> u64 {
        let writer = self.lock_writer();
        self.store(&writer, set)
    }

    /// Builds a new set from the one in force (`change` edits a builder
    /// holding it), validates it and swaps it in.
    ///
    /// # Errors
    ///
    /// The [`LimitsError`] of the new set; the set in force stays.
    pub fn update(
        &self,
        change: impl FnOnce(LimitSetBuilder) -> LimitSetBuilder,
    ) -> Result<u64, LimitsError> {
        let writer = self.lock_writer();
        let set = change(self.inner.current.load().to_builder()).build()?;
        Ok(self.store(&writer, set))
    }

    /// Swaps in the set `make` builds from the one in force, as one write
    /// (no other write comes between the read and the swap).
    #[cfg(feature = "config")]
    pub(crate) fn replace_with<E>(
        &self,
        make: impl FnOnce(&LimitSet) -> Result<LimitSet, E>,
    ) -> Result<u64, E> {
        let writer = self.lock_writer();
        let set = make(&self.inner.current.load())?;
        Ok(self.store(&writer, set))
    }

    /// Calls `callback` with the set in force now, then with every new set
    /// **before** it is in force, until the returned [`LimitsSubscription`]
    /// is dropped: for state derived from the limits (compiled headers, an
    /// index) that must be ready when a request first sees the new version,
    /// so that no request waits for it to be built. The layer built with
    /// `.limits(...)` uses this.
    ///
    /// The callback runs on the writer's thread ([`replace`](Self::replace),
    /// [`update`](Self::update), a reload), with other writes waiting: keep
    /// it short, don't panic, and don't write to this handle from it (that
    /// would wait for itself).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use portcullis::{LimitSet, Limits, Policy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limits = Limits::new(LimitSet::of([Policy::per_minute(10).name("minute").build()?])?);
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// let subscription = limits.on_change(move |set| log.lock().unwrap().push(set.version()));
    /// limits.update(|set| set.defaults([Policy::per_minute(20).name("minute").build().unwrap()]))?;
    /// drop(subscription);
    /// limits.update(|set| set.defaults([Policy::per_minute(30).name("minute").build().unwrap()]))?;
    /// assert_eq!(*seen.lock().unwrap(), [1, 2]);
    /// # Ok(()) }
    /// ```
    #[must_use = "the callback is removed when the subscription is dropped"]
    pub fn on_change(
        &self,
        callback: impl Fn(&LimitSet) + Send + Sync + 'static,
    ) -> LimitsSubscription {
        let mut writer = self.lock_writer();
        callback(&self.inner.current.load());
        writer.next_id += 1;
        let id = writer.next_id;
        writer.callbacks.push((id, Arc::new(callback)));
        LimitsSubscription {
            limits: Arc::downgrade(&self.inner),
            id,
        }
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, Subscribers> {
        self.inner
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores `set` as the next version; the caller holds the writer lock
    /// (`subscribers`). The callbacks see the set before any reader can.
    fn store(&self, subscribers: &Subscribers, mut set: LimitSet) -> u64 {
        let version = self.inner.version.load(Ordering::Relaxed) + 1;
        set.version = version;
        for (_, callback) in &subscribers.callbacks {
            callback(&set);
        }
        self.inner.current.store(Arc::new(set));
        // Readers that see this version then load a set at least as new.
        self.inner.version.store(version, Ordering::Release);
        version
    }
}

/// A callback of [`Limits::on_change`]; removes it when dropped.
#[derive(Debug)]
pub struct LimitsSubscription {
    limits: std::sync::Weak<Inner>,
    id: u64,
}

impl Drop for LimitsSubscription {
    fn drop(&mut self) {
        if let Some(inner) = self.limits.upgrade() {
            inner
                .writer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .callbacks
                .retain(|(id, _)| *id != self.id);
        }
    }
}

impl From<LimitSet> for Limits {
    fn from(set: LimitSet) -> Self {
        Self::new(set)
    }
}
