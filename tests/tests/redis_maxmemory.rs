//! `build()` reads `maxmemory` / `maxmemory-policy` and warns (tracing)
//! when a full Redis would refuse every write (`noeviction` with a limit),
//! recommending `volatile-ttl`; it says nothing for other policies, for no
//! limit, and where `CONFIG GET` is refused (managed Redis).
//!
//! Each test owns its server ([`portcullis_tests::OwnedRedis`]), started with
//! the settings under test.

mod log_capture;

use std::time::Duration;

use log_capture::Captured;
use portcullis_redis::{RedisStore, ACL_COMMANDS};
use portcullis_tests::{unique_prefix, OwnedRedis};

/// Builds a store on `url` under a subscriber that captures warnings, and
/// returns what was logged.
fn warnings_when_building(url: &str) -> String {
    let captured = Captured::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::dispatcher::with_default(&captured.dispatch(tracing::Level::WARN), || {
        runtime.block_on(async {
            RedisStore::builder()
                .url(url)
                .prefix(unique_prefix("maxmemory"))
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap_or_else(|e| panic!("the store should build: {e}"))
        })
    });
    captured.text()
}

#[test]
fn noeviction_with_a_limit_is_warned_about() {
    let server = OwnedRedis::start(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]);
    let logged = warnings_when_building(&server.url());
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains("noeviction"), "{logged}");
    assert!(logged.contains("volatile-ttl"), "{logged}");
}

#[test]
fn other_policies_and_no_limit_are_not_warned_about() {
    for args in [
        ["--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"],
        ["--maxmemory", "0", "--maxmemory-policy", "noeviction"],
    ] {
        let server = OwnedRedis::start(&args);
        let logged = warnings_when_building(&server.url());
        assert!(logged.is_empty(), "{args:?}: {logged}");
    }
}

#[test]
fn a_refused_config_get_is_skipped_silently() {
    let server = OwnedRedis::start(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]);
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(">pw")
        .arg("~pc-test*");
    for rule in ACL_COMMANDS.split(' ') {
        setuser.arg(rule);
    }
    let () = setuser.query(&mut admin).unwrap();
    let url = format!("redis://app:pw@127.0.0.1:{}", server.port());
    let logged = warnings_when_building(&url);
    assert!(logged.is_empty(), "{logged}");
}
