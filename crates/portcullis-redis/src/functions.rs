//! Which way a `RedisStore` calls its checks: Redis Functions (`FCALL`,
//! the default) or scripts (`EVALSHA`, when the server refuses functions),
//! and how a refusal is recognised.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// them), and for as long as a node lacks the library and is too full
    /// to load it (`maxmemory` with `noeviction`; scripts load even then).
    /// In that case one check a second tries Functions again, and the
    /// store returns to them once the library could be loaded. The check
    /// that found out runs on this path at once; decisions are the same on
    /// both paths.
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
/// on `EVALSHA` before one check tries Redis Functions again.
pub(crate) const LIBRARY_RETRY: Duration = Duration::from_secs(1);

const FUNCTIONS: u8 = 0;
const EVALSHA: u8 = 1;
/// On `EVALSHA` because a node had no memory to load the library; one
/// check at a time (after [`LIBRARY_RETRY`]) tries Functions again.
const DEFERRED: u8 = 2;

/// The store's call path, shared by its clones.
#[derive(Debug, Default)]
pub(crate) struct PathState {
    state: AtomicU8,
    /// While [`DEFERRED`]: when the next check may try Functions, in
    /// milliseconds since the Unix epoch.
    retry_at_ms: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

impl PathState {
    /// The path checks take now, as [`RedisStore::call_path`](crate::RedisStore::call_path) reports it.
    pub(crate) fn get(&self) -> CallPath {
        match self.state.load(Ordering::Relaxed) {
            FUNCTIONS => CallPath::Functions,
            _ => CallPath::Evalsha,
        }
    }

    /// The path for one call: [`get`](Self::get), except that while the
    /// library waits for memory one call per [`LIBRARY_RETRY`] is sent
    /// down the Functions path to try loading it again.
    pub(crate) fn choose(&self) -> CallPath {
        match self.state.load(Ordering::Relaxed) {
            FUNCTIONS => CallPath::Functions,
            EVALSHA => CallPath::Evalsha,
            _ => self.try_again(),
        }
    }

    #[cold]
    fn try_again(&self) -> CallPath {
        let now = now_ms();
        let retry_at = self.retry_at_ms.load(Ordering::Relaxed);
        let next = now.saturating_add(LIBRARY_RETRY.as_millis() as u64);
        if now >= retry_at
            && self
                .retry_at_ms
                .compare_exchange(retry_at, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            CallPath::Functions
        } else {
            CallPath::Evalsha
        }
    }

    /// After a refusal of Redis Functions (see [`refusal`]): whether the
    /// call should run again on the `EVALSHA` path (it did not run).
    pub(crate) fn refused(&self, error: &StoreError) -> bool {
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
                self.retry_at_ms.store(
                    now_ms().saturating_add(LIBRARY_RETRY.as_millis() as u64),
                    Ordering::Relaxed,
                );
                if self
                    .state
                    .compare_exchange(FUNCTIONS, DEFERRED, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    tracing::warn!(
                        "Redis is out of memory (maxmemory with noeviction) and refused to load \
                         the function library: checks run as scripts (EVALSHA) until it can be \
                         loaded, tried again every {LIBRARY_RETRY:?}. Subjects Redis holds are \
                         still checked exactly and new ones are refused (OutOfMemory): raise \
                         maxmemory, free memory, or set maxmemory-policy volatile-ttl"
                    );
                }
                true
            }
        }
    }

    /// After a call of a function succeeded: a library that waited for
    /// memory is loaded, and checks use Functions again.
    pub(crate) fn loaded(&self) {
        if self.state.load(Ordering::Relaxed) == DEFERRED
            && self
                .state
                .compare_exchange(DEFERRED, FUNCTIONS, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::info!("Redis had room to load the function library: checks use it again");
        }
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

    #[test]
    fn a_library_refused_for_memory_defers_functions_and_a_success_restores_them() {
        let state = PathState::default();
        let oom = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "OOM",
            "command not allowed when used memory > 'maxmemory'.".to_owned(),
        ));
        let error = StoreError::unavailable(LibraryNotLoaded(oom.into()));
        assert_eq!(refusal(&error), Some(Refusal::OutOfMemory));
        assert!(state.refused(&error));
        assert_eq!(state.get(), CallPath::Evalsha);
        // Within the retry interval no call tries Functions.
        assert_eq!(state.choose(), CallPath::Evalsha);
        // Past it, exactly one call does.
        state.retry_at_ms.store(0, Ordering::Relaxed);
        assert_eq!(state.choose(), CallPath::Functions);
        assert_eq!(state.choose(), CallPath::Evalsha);
        state.loaded();
        assert_eq!(state.get(), CallPath::Functions);
        assert_eq!(state.choose(), CallPath::Functions);
    }

    #[test]
    fn a_refusal_for_good_is_final() {
        let state = PathState::default();
        let error = StoreError::Protocol {
            detail: "ERR unknown command 'FCALL', with args beginning with: 'x'".to_owned(),
        };
        assert_eq!(refusal(&error), Some(Refusal::ForGood));
        assert!(state.refused(&error));
        state.loaded();
        assert_eq!(state.get(), CallPath::Evalsha);
        assert_eq!(state.choose(), CallPath::Evalsha);
        let other = StoreError::Protocol {
            detail: "something else".to_owned(),
        };
        assert!(!state.refused(&other));
    }
}
