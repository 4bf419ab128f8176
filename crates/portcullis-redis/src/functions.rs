//! Which way a `RedisStore` calls its checks: Redis Functions (`FCALL`,
//! the default) or scripts (`EVALSHA`, when the server refuses functions),
//! and how a refusal is recognised.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use portcullis_core::StoreError;

/// How a [`RedisStore`](crate::RedisStore) calls its checks:
/// [`RedisStore::call_path`](crate::RedisStore::call_path).
///
/// ```
/// use portcullis::redis::CallPath;
///
/// // A new store tries Redis Functions first.
/// assert_eq!(CallPath::default(), CallPath::Functions);
/// assert_eq!(CallPath::Evalsha.to_string(), "EVALSHA");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CallPath {
    /// Redis Functions (Redis 7 and later): one library, `portcullis_<hash>`,
    /// loaded once per node with `FUNCTION LOAD REPLACE` and called with
    /// `FCALL` (`FCALL_RO` for peeks). Its helpers and tables are built at
    /// load, not per call. A node that lost it (`FUNCTION FLUSH`, a restart
    /// without persistence, a failover, a new Cluster node) answers
    /// "Function not found" and gets it again; the call, which did not
    /// run, is then sent once more.
    #[default]
    Functions,
    /// Scripts (`EVALSHA`, loaded after `NOSCRIPT`): taken for good when a
    /// server refuses `FCALL` or `FUNCTION` (Redis before 7, an ACL without
    /// them), and, for the keys of a node that lacks the library and is
    /// too full to load it (`maxmemory` with `noeviction`; scripts load even
    /// then), for as long as that lasts: on a Cluster only that node's keys
    /// (its slots, read from `CLUSTER SLOTS`), so the other nodes stay on
    /// Functions. One check of those keys a second tries Functions again,
    /// and they return to them once the library could be loaded. The check
    /// that found out runs on this path at once; decisions are the same on
    /// both paths. [`RedisStore::call_path`](crate::RedisStore::call_path)
    /// reports this path while any node's keys are on it.
    Evalsha,
}

impl fmt::Display for CallPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Functions => "Redis Functions (FCALL)",
            Self::Evalsha => "EVALSHA",
        })
    }
}

/// How long a store that found a node too full to load the library stays
/// on `EVALSHA` for that node's keys before one check tries Redis Functions
/// again.
pub(crate) const LIBRARY_RETRY: Duration = Duration::from_secs(1);

/// `state`: Functions (0, the default), or `EVALSHA` for good.
const EVALSHA: u8 = 1;

/// Hash slots of a Cluster (a standalone server is one range of them all).
pub(crate) const SLOTS: u16 = 16_384;

/// Keys whose node had no memory to load the library: its slots (one slot
/// until the node's range is learned from `CLUSTER SLOTS`), and when the
/// next check may try Functions there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Deferred {
    first: u16,
    last: u16,
    retry_at_ms: u64,
    /// The range is one slot, still to be widened to its node's.
    learn: bool,
}

/// The store's call path, shared by its clones: Functions, `EVALSHA` for
/// good, or `EVALSHA` for the keys of the nodes that had no memory to load
/// the library (per node on a Cluster, so a node that loaded it stays on
/// Functions, and a success elsewhere does not send the full node's keys
/// back to a library it cannot load).
#[derive(Debug, Default)]
pub(crate) struct PathState {
    state: AtomicU8,
    /// Whether keys map to slots of several nodes (a Cluster).
    cluster: AtomicBool,
    /// Whether `deferred` holds any range (read on every call).
    any_deferred: AtomicBool,
    deferred: Mutex<Vec<Deferred>>,
}

/// Milliseconds of a monotonic clock (since its first reading).
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The hash slot of `key` (its `{...}` tag's, as a Cluster computes it).
pub(crate) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = bytes
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|b| *b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(tag) % SLOTS
}

impl PathState {
    /// Keys are spread over a Cluster's nodes: a node too full to load the
    /// library defers Functions for its slots only.
    pub(crate) fn set_cluster(&self, cluster: bool) {
        self.cluster.store(cluster, Ordering::Relaxed);
    }

    fn deferred(&self) -> MutexGuard<'_, Vec<Deferred>> {
        self.deferred.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The path checks take now, as [`RedisStore::call_path`](crate::RedisStore::call_path)
    /// reports it: `EVALSHA` while any node's keys are on it.
    pub(crate) fn get(&self) -> CallPath {
        if self.state.load(Ordering::Relaxed) == EVALSHA
            || self.any_deferred.load(Ordering::Relaxed)
        {
            CallPath::Evalsha
        } else {
            CallPath::Functions
        }
    }

    /// The path for one call whose first key is `key`: [`get`](Self::get)
    /// for a store on Functions, except that for the keys of a node whose
    /// library waits for memory one call per [`LIBRARY_RETRY`] is sent down
    /// the Functions path to try loading it again.
    pub(crate) fn choose(&self, key: &str) -> CallPath {
        if self.state.load(Ordering::Relaxed) == EVALSHA {
            return CallPath::Evalsha;
        }
        if !self.any_deferred.load(Ordering::Relaxed) {
            return CallPath::Functions;
        }
        self.try_again(key)
    }

    #[cold]
    fn try_again(&self, key: &str) -> CallPath {
        let slot = self.slot(key);
        let now = now_ms();
        let mut deferred = self.deferred();
        match deferred
            .iter_mut()
            .find(|range| (range.first..=range.last).contains(&slot))
        {
            None => CallPath::Functions,
            Some(range) if now >= range.retry_at_ms => {
                range.retry_at_ms = now.saturating_add(LIBRARY_RETRY.as_millis() as u64);
                CallPath::Functions
            }
            Some(_) => CallPath::Evalsha,
        }
    }

    fn slot(&self, key: &str) -> u16 {
        if self.cluster.load(Ordering::Relaxed) {
            slot_of(key)
        } else {
            0
        }
    }

    /// After a refusal of Redis Functions (see [`refusal`]) of a call whose
    /// first key is `key`: whether the call should run again on the
    /// `EVALSHA` path (it did not run).
    pub(crate) fn refused(&self, error: &StoreError, key: &str) -> bool {
        match refusal(error) {
            None => false,
            Some(Refusal::ForGood) => {
                if self.state.swap(EVALSHA, Ordering::Relaxed) != EVALSHA {
                    tracing::info!(
                        "Redis refused FCALL or FUNCTION LOAD: checks use EVALSHA from now on"
                    );
                }
                true
            }
            Some(Refusal::OutOfMemory) => {
                self.defer(key);
                true
            }
        }
    }

    /// Defers Functions for the node of `key` (the whole server when it is
    /// not a Cluster).
    fn defer(&self, key: &str) {
        let cluster = self.cluster.load(Ordering::Relaxed);
        let slot = self.slot(key);
        let retry_at_ms = now_ms().saturating_add(LIBRARY_RETRY.as_millis() as u64);
        let mut deferred = self.deferred();
        if let Some(range) = deferred
            .iter_mut()
            .find(|range| (range.first..=range.last).contains(&slot))
        {
            range.retry_at_ms = retry_at_ms;
            return;
        }
        let (first, last) = if cluster {
            (slot, slot)
        } else {
            (0, SLOTS - 1)
        };
        deferred.push(Deferred {
            first,
            last,
            retry_at_ms,
            learn: cluster,
        });
        self.any_deferred.store(true, Ordering::Relaxed);
        tracing::warn!(
            "Redis is out of memory (maxmemory with noeviction) and refused to load the function \
             library: checks of the keys it serves run as scripts (EVALSHA) until it can be \
             loaded, tried again every {LIBRARY_RETRY:?}. Subjects Redis holds are still checked \
             exactly and new ones are refused (OutOfMemory): raise maxmemory, free memory, or \
             set maxmemory-policy volatile-ttl"
        );
    }

    /// A slot deferred alone whose node's range is still to be learned.
    pub(crate) fn to_learn(&self) -> Option<u16> {
        if !self.any_deferred.load(Ordering::Relaxed) {
            return None;
        }
        self.deferred()
            .iter()
            .find(|range| range.learn)
            .map(|range| range.first)
    }

    /// The node serving `slot` serves `first..=last` (`CLUSTER SLOTS`): its
    /// deferral covers them all.
    pub(crate) fn learned(&self, slot: u16, first: u16, last: u16) {
        let mut deferred = self.deferred();
        let Some(index) = deferred
            .iter()
            .position(|range| range.learn && range.first == slot)
        else {
            return;
        };
        let retry_at_ms = deferred[index].retry_at_ms;
        // The node's other slots may have been deferred one by one meanwhile.
        deferred.retain(|range| !(first..=last).contains(&range.first));
        deferred.push(Deferred {
            first,
            last,
            retry_at_ms,
            learn: false,
        });
    }

    /// After a call of a function whose first key is `key` succeeded: a
    /// library that waited for memory on that key's node is loaded, and its
    /// keys use Functions again.
    pub(crate) fn loaded(&self, key: &str) {
        if !self.any_deferred.load(Ordering::Relaxed) {
            return;
        }
        let slot = self.slot(key);
        let mut deferred = self.deferred();
        let before = deferred.len();
        deferred.retain(|range| !(range.first..=range.last).contains(&slot));
        if deferred.len() < before {
            tracing::info!("Redis had room to load the function library: checks use it again");
        }
        self.any_deferred
            .store(!deferred.is_empty(), Ordering::Relaxed);
    }
}

/// Why a server did not run a function call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It refuses Redis Functions (an unknown `FCALL`/`FUNCTION` command on
    /// Redis before 7, an ACL without them, or a library it would not
    /// register): scripts from now on.
    ForGood,
    /// It had no memory to load the library ([`LibraryNotLoaded`]).
    OutOfMemory,
}

/// The error of a call whose node lacked the library and refused to load
/// it for lack of memory (`OOM` at `maxmemory` with `noeviction`): the call
/// did not run, and runs again as a script.
#[derive(Debug)]
pub(crate) struct LibraryNotLoaded(pub(crate) crate::errors::RedisCause);

impl fmt::Display for LibraryNotLoaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "Redis is out of memory and refused to load the function library; the call did not \
             run: raise maxmemory or free memory on the server",
        )
    }
}

impl std::error::Error for LibraryNotLoaded {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Whether an error says the server refuses Redis Functions, or could not
/// load them for now, having run nothing.
pub(crate) fn refusal(error: &StoreError) -> Option<Refusal> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if error.is::<LibraryNotLoaded>() {
            return Some(Refusal::OutOfMemory);
        }
        if let Some(redis) = crate::errors::redis_error(error) {
            return refused_for_good(redis.code(), &redis.to_string()).then_some(Refusal::ForGood);
        }
        source = error.source();
    }
    matches!(error, StoreError::Protocol { detail } if refused_for_good(None, detail))
        .then_some(Refusal::ForGood)
}

/// Whether the error is a [`LibraryNotLoaded`].
pub(crate) fn is_library_not_loaded(error: &StoreError) -> bool {
    refusal(error) == Some(Refusal::OutOfMemory)
}

fn refused_for_good(code: Option<&str>, text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    if text.contains("error registering functions") {
        // The server would not take the library (a Lua it runs differently):
        // scripts still work there.
        return true;
    }
    // Redis 7 quotes the command as 'fcall', Redis 6.2 as `fcall`.
    let names_functions = ["'fcall", "`fcall", "'function", "`function"]
        .iter()
        .any(|name| text.contains(name));
    match code {
        Some("NOPERM") => names_functions,
        _ => names_functions && text.contains("unknown command"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_of_functions_are_recognised_and_others_are_not() {
        assert!(refused_for_good(
            Some("NOPERM"),
            "NOPERM: User u has no permissions to run the 'fcall' command"
        ));
        assert!(refused_for_good(
            Some("NOPERM"),
            "User u has no permissions to run the 'function|load' command"
        ));
        assert!(refused_for_good(
            Some("ERR"),
            "ERR unknown command 'FCALL', with args beginning with: 'x'"
        ));
        assert!(refused_for_good(
            Some("ERR"),
            "unknown command `FCALL_RO`, with args beginning with: `x_peek`, `1`, "
        ));
        assert!(!refused_for_good(
            Some("NOPERM"),
            "No permissions to access a key"
        ));
        assert!(refused_for_good(
            Some("ERR"),
            "Error registering functions: ERR user_function:13: Script attempted to access nonexistent global variable 'math'"
        ));
        assert!(!refused_for_good(
            Some("OOM"),
            "command not allowed when used memory > 'maxmemory'"
        ));
    }

    fn oom() -> StoreError {
        let oom = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "OOM",
            "command not allowed when used memory > 'maxmemory'.".to_owned(),
        ));
        StoreError::unavailable(LibraryNotLoaded(oom.into()))
    }

    #[test]
    fn a_library_refused_for_memory_defers_functions_and_a_success_restores_them() {
        let state = PathState::default();
        let error = oom();
        assert_eq!(refusal(&error), Some(Refusal::OutOfMemory));
        assert!(state.refused(&error, "p:{a}:x"));
        assert_eq!(state.get(), CallPath::Evalsha);
        // A standalone server: every key waits, within the retry interval.
        assert_eq!(state.choose("p:{b}:x"), CallPath::Evalsha);
        // Past it, exactly one call tries Functions.
        state.deferred()[0].retry_at_ms = 0;
        assert_eq!(state.choose("p:{c}:x"), CallPath::Functions);
        assert_eq!(state.choose("p:{c}:x"), CallPath::Evalsha);
        state.loaded("p:{c}:x");
        assert_eq!(state.get(), CallPath::Functions);
        assert_eq!(state.choose("p:{a}:x"), CallPath::Functions);
    }

    #[test]
    fn on_a_cluster_only_the_full_nodes_keys_wait_and_a_success_elsewhere_changes_nothing() {
        let state = PathState::default();
        state.set_cluster(true);
        let full = "p:{on-the-full-node}:x";
        let slot = slot_of(full);
        assert!(state.refused(&oom(), full));
        assert_eq!(state.to_learn(), Some(slot));
        // Until the node's range is learned, only that slot waits.
        assert_eq!(state.choose(full), CallPath::Evalsha);
        let (first, last) = (
            slot.saturating_sub(10),
            slot.saturating_add(10).min(SLOTS - 1),
        );
        state.learned(slot, first, last);
        assert_eq!(state.to_learn(), None);
        let elsewhere = (0..)
            .map(|i| format!("p:{{k{i}}}:x"))
            .find(|key| !(first..=last).contains(&slot_of(key)))
            .unwrap();
        let neighbour = (0..)
            .map(|i| format!("p:{{n{i}}}:x"))
            .find(|key| slot_of(key) != slot && (first..=last).contains(&slot_of(key)))
            .unwrap();
        assert_eq!(
            state.choose(&neighbour),
            CallPath::Evalsha,
            "the node's other slots wait"
        );
        assert_eq!(
            state.choose(&elsewhere),
            CallPath::Functions,
            "other nodes do not"
        );
        state.loaded(&elsewhere);
        assert_eq!(
            state.choose(full),
            CallPath::Evalsha,
            "a success elsewhere changes nothing"
        );
        state.loaded(full);
        assert_eq!(state.choose(&neighbour), CallPath::Functions);
        assert_eq!(state.get(), CallPath::Functions);
    }

    #[test]
    fn slots_are_the_clusters() {
        // CLUSTER KEYSLOT values of Redis.
        assert_eq!(slot_of("foo"), 12_182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("a{}b"), slot_of("a{}b"));
    }

    #[test]
    fn a_refusal_for_good_is_final() {
        let state = PathState::default();
        let error = StoreError::Protocol {
            detail: "ERR unknown command 'FCALL', with args beginning with: 'x'".to_owned(),
        };
        assert_eq!(refusal(&error), Some(Refusal::ForGood));
        assert!(state.refused(&error, "k"));
        state.loaded("k");
        assert_eq!(state.get(), CallPath::Evalsha);
        assert_eq!(state.choose("k"), CallPath::Evalsha);
        let other = StoreError::Protocol {
            detail: "something else".to_owned(),
        };
        assert!(!state.refused(&other, "k"));
    }
}
