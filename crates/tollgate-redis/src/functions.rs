//! Which way a `RedisStore` calls its checks: Redis Functions (`FCALL`,
//! the default) or scripts (`EVALSHA`, when the server refuses functions),
//! and how a refusal is recognised.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use redis::RedisError;
use tollgate_core::StoreError;

/// How a [`RedisStore`](crate::RedisStore) calls its checks:
/// [`RedisStore::call_path`](crate::RedisStore::call_path).
///
/// ```
/// use tollgate_redis::CallPath;
///
/// // A new store tries Redis Functions first.
/// assert_eq!(CallPath::default(), CallPath::Functions);
/// assert_eq!(CallPath::Evalsha.to_string(), "EVALSHA");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CallPath {
    /// Redis Functions (Redis 7 and later): one library, `tollgate_<hash>`,
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
    /// them). The check that found out runs on this path at once.
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

/// The store's call path, shared by its clones.
#[derive(Debug, Default)]
pub(crate) struct PathState(AtomicU8);

impl PathState {
    pub(crate) fn get(&self) -> CallPath {
        match self.0.load(Ordering::Relaxed) {
            0 => CallPath::Functions,
            _ => CallPath::Evalsha,
        }
    }

    /// Falls back to `EVALSHA` for good.
    pub(crate) fn fall_back(&self) {
        if self.0.swap(1, Ordering::Relaxed) == 0 {
            tracing::info!("Redis refused FCALL or FUNCTION LOAD: checks use EVALSHA from now on");
        }
    }
}

/// Whether an error says the server refuses Redis Functions (an unknown
/// `FCALL`/`FUNCTION` command on Redis before 7, an ACL without them, or a
/// library it would not register), having run nothing.
pub(crate) fn functions_refused(error: &StoreError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(redis) = error.downcast_ref::<RedisError>() {
            return refusal(redis.code(), &redis.to_string());
        }
        source = error.source();
    }
    matches!(error, StoreError::Protocol { detail } if refusal(None, detail))
}

fn refusal(code: Option<&str>, text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    if text.contains("error registering functions") {
        // The server would not take the library (a Lua it runs differently):
        // scripts still work there.
        return true;
    }
    let names_functions = text.contains("'fcall") || text.contains("'function");
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
        assert!(refusal(
            Some("NOPERM"),
            "NOPERM: User u has no permissions to run the 'fcall' command"
        ));
        assert!(refusal(
            Some("NOPERM"),
            "User u has no permissions to run the 'function|load' command"
        ));
        assert!(refusal(
            Some("ERR"),
            "ERR unknown command 'FCALL', with args beginning with: 'x'"
        ));
        assert!(!refusal(Some("NOPERM"), "No permissions to access a key"));
        assert!(refusal(
            Some("ERR"),
            "Error registering functions: ERR user_function:13: Script attempted to access nonexistent global variable 'math'"
        ));
        assert!(!refusal(
            Some("OOM"),
            "command not allowed when used memory > 'maxmemory'"
        ));
        let state = PathState::default();
        assert_eq!(state.get(), CallPath::Functions);
        state.fall_back();
        assert_eq!(state.get(), CallPath::Evalsha);
    }
}
