//! The check at `build()`: the server is reachable, accepts the
//! credentials and lets portcullis's user run what it needs; and the
//! `maxmemory-policy` warning.

use std::error::Error as _;
use std::time::Duration;

use portcullis_core::{Policy, Store, StoreError};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::connection;
use crate::errors::{BuildError, SCRIPT_COMMANDS};
use crate::store::RedisStore;

/// The permission probe (see the file's comment).
const PROBE_LUA: &str = include_str!("../../lua/probe.lua");

/// The subject of the peek `build()` runs (a peek writes nothing).
pub(crate) const PROBE_SUBJECT: &str = "portcullis-build-check";
/// The policy name of that peek.
pub(crate) const PROBE_POLICY: &str = "build-check";

/// Whether redis-rs's error is a refused login.
pub(crate) fn is_auth(error: &RedisError) -> bool {
    error.kind() == ErrorKind::AuthenticationFailed
        || matches!(error.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// Whether redis-rs's error is an ACL refusal (also from inside a script).
pub(crate) fn is_noperm(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || error.code() == Some("NOPERM")
        || connection::is_script_acl_refusal(error)
}

/// The ACL rule a `NOPERM` message asks for: `+<command>` for a command
/// (`'evalsha'`, `'script|load'`, a command a script calls), `~<prefix>:*`
/// for a key.
pub(crate) fn permission(error: &RedisError, prefix: &str) -> String {
    if connection::is_script_acl_refusal(error) {
        return SCRIPT_COMMANDS.to_owned();
    }
    let text = error.to_string();
    if text.contains("key") {
        return format!("~{prefix}:*");
    }
    let mut quoted = text.split('\'');
    match (quoted.next(), quoted.next()) {
        (Some(_), Some(command)) if !command.is_empty() && !command.contains(' ') => {
            format!("+{}", command.to_ascii_lowercase())
        }
        _ => "to run portcullis's commands".to_owned(),
    }
}

/// Maps an error met while opening the pool.
pub(crate) fn connect_error(
    target: &str,
    user: &str,
    prefix: &str,
    source: RedisError,
) -> BuildError {
    if is_auth(&source) {
        BuildError::Auth {
            user: user.to_owned(),
            source: source.into(),
        }
    } else if is_noperm(&source) {
        BuildError::Permission {
            user: user.to_owned(),
            permission: permission(&source, prefix),
            prefix: prefix.to_owned(),
            source: source.into(),
        }
    } else {
        BuildError::Connect {
            target: target.to_owned(),
            source: source.into(),
        }
    }
}

/// Maps a store error met by the test calls, digging out redis-rs's error.
fn check_error(error: StoreError, target: &str, user: &str, prefix: &str) -> BuildError {
    let telling = error
        .source()
        .and_then(crate::errors::redis_error)
        .is_some_and(|e| is_auth(e) || is_noperm(e) || e.is_io_error());
    if !telling {
        return BuildError::Check { source: error };
    }
    match error {
        StoreError::Unavailable { source } | StoreError::OutcomeUnknown { source } => {
            match source.downcast::<crate::errors::RedisCause>() {
                Ok(cause) => connect_error(target, user, prefix, cause.into_redis_error()),
                Err(source) => BuildError::Check {
                    source: StoreError::Unavailable { source },
                },
            }
        }
        other => BuildError::Check { source: other },
    }
}

/// Runs the checks of `build()` on a freshly built store.
pub(crate) async fn at_build(
    store: &RedisStore,
    target: &str,
    user: &str,
    connect_timeout: Duration,
) -> Result<(), BuildError> {
    let inner = &*store.inner.caller;
    let prefix = store.prefix();
    // Connections may still be opening (an application's pool): allow for it.
    let timeout = inner.timeout + connect_timeout;
    // PING (the pool's check of a connection after a failure).
    connection::query(&inner.pool, timeout, &redis::cmd("PING"))
        .await
        .map_err(|e| check_error(e, target, user, prefix))?;
    // SCRIPT LOAD and EVALSHA of the permission probe (every command the
    // scripts call, on keys of the prefix, deleted again).
    let probe_script = redis::Script::new(PROBE_LUA);
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(PROBE_LUA);
    connection::query(&inner.pool, timeout, &load)
        .await
        .map_err(|e| check_error(e, target, user, prefix))?;
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(probe_script.get_hash()).arg(3);
    for kind in ["s", "z", "h"] {
        evalsha.arg(format!(
            "{prefix}:{{{PROBE_SUBJECT}}}:{PROBE_POLICY}-{kind}"
        ));
    }
    let reply = connection::query(&inner.pool, timeout, &evalsha)
        .await
        .map_err(|e| check_error(e, target, user, prefix))?;
    if let Some((command, message)) = refused(&reply) {
        let source = RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoPerm),
            "a command portcullis's scripts call was refused",
            message,
        ));
        return Err(BuildError::Permission {
            user: user.to_owned(),
            permission: format!("+{}", command.to_ascii_lowercase()),
            prefix: prefix.to_owned(),
            source: source.into(),
        });
    }
    let probe = Policy::per_second(1)
        .name(PROBE_POLICY)
        .build()
        .map_err(|e| BuildError::Unsupported {
            detail: format!("the build-time probe policy was refused ({e}); please report this"),
        })?;
    // A peek: runs the script (EVALSHA, TIME, GET) and writes nothing.
    store
        .check(PROBE_SUBJECT, std::slice::from_ref(&probe), 0)
        .await
        .map_err(|e| check_error(e, target, user, prefix))?;
    warn_on_noeviction(store, timeout).await;
    Ok(())
}

/// The probe's `{command, error}` reply, if a command was refused.
fn refused(reply: &Value) -> Option<(String, String)> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    match reply {
        Value::Array(items) if items.len() == 2 => Some((text(&items[0])?, text(&items[1])?)),
        _ => None,
    }
}

/// Reads `maxmemory` and `maxmemory-policy` (skipped silently where
/// `CONFIG` is refused, as on most managed Redis) and warns when a full
/// Redis would refuse every write.
async fn warn_on_noeviction(store: &RedisStore, timeout: Duration) {
    let inner = &*store.inner.caller;
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("maxmemory-policy");
    let policy = match connection::query(&inner.pool, timeout, &get).await {
        Ok(value) => config_value(value),
        Err(error) => {
            let error: &(dyn std::error::Error + 'static) = &error;
            tracing::debug!(error, "CONFIG GET refused; not checking maxmemory-policy");
            return;
        }
    };
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("maxmemory");
    let maxmemory = match connection::query(&inner.pool, timeout, &get).await {
        Ok(value) => config_value(value),
        Err(_) => return,
    };
    if let (Some(policy), Some(maxmemory)) = (policy, maxmemory)
        && noeviction_with_limit(&policy, &maxmemory)
    {
        tracing::warn!(
            maxmemory = %maxmemory,
            maxmemory_policy = %policy,
            "Redis has maxmemory set with maxmemory-policy noeviction: once it is full every \
             check that writes fails with a store error (OOM). Every portcullis key has a TTL, so \
             `CONFIG SET maxmemory-policy volatile-ttl` lets Redis free the keys closest to \
             expiring instead"
        );
    }
}

/// Whether this `maxmemory-policy` / `maxmemory` pair refuses writes when full.
pub(crate) fn noeviction_with_limit(policy: &str, maxmemory: &str) -> bool {
    policy.eq_ignore_ascii_case("noeviction") && maxmemory.trim() != "0"
}

/// The value of a one-parameter `CONFIG GET` reply (an array in RESP2, a
/// map in RESP3).
fn config_value(value: Value) -> Option<String> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    match value {
        Value::Array(items) if items.len() == 2 => text(&items[1]),
        Value::Map(pairs) if pairs.len() == 1 => text(&pairs[0].1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noeviction_warns_only_with_a_limit() {
        assert!(noeviction_with_limit("noeviction", "104857600"));
        assert!(!noeviction_with_limit("noeviction", "0"));
        assert!(!noeviction_with_limit("volatile-ttl", "104857600"));
        assert!(!noeviction_with_limit("allkeys-lru", "1"));
    }

    #[test]
    fn permissions_are_named_from_noperm_messages() {
        let command = RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoPerm),
            "An error was signalled by the server",
            "this user has no permissions to run the 'evalsha' command".to_owned(),
        ));
        assert!(is_noperm(&command));
        assert_eq!(permission(&command, "pc"), "+evalsha");
        let key = RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoPerm),
            "An error was signalled by the server",
            "this user has no permissions to access one of the keys used as arguments".to_owned(),
        ));
        assert_eq!(permission(&key, "pc"), "~pc:*");
        let script = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "The user executing the script can't run this command or subcommand script: 104ae6, on @user_script:1.".to_owned(),
        ));
        assert!(is_noperm(&script));
        assert_eq!(permission(&script, "pc"), SCRIPT_COMMANDS);
    }

    #[test]
    fn config_values_are_read_from_resp2_and_resp3() {
        let resp2 = Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"noeviction".to_vec()),
        ]);
        assert_eq!(config_value(resp2).as_deref(), Some("noeviction"));
        let resp3 = Value::Map(vec![(
            Value::BulkString(b"maxmemory".to_vec()),
            Value::BulkString(b"0".to_vec()),
        )]);
        assert_eq!(config_value(resp3).as_deref(), Some("0"));
        assert_eq!(config_value(Value::Nil), None);
    }
}
