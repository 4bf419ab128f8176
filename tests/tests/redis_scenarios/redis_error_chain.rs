//! Each cause once: the errors of the Redis store, walked through
//! `source()` as anyhow, eyre and `tracing`'s `error.sources` walk them,
//! name every cause once (redis-rs's errors print their own cause as their
//! text; `RedisCause` collapses that), for a refused connection, a name
//! that does not resolve and a server killed under an open connection.

use std::error::Error;
use std::time::Duration;

use portcullis_core::{Policy, Store, StoreError};
use portcullis_redis::{BuildError, RedisCause, RedisStore};
use portcullis_tests::{free_port, unique_prefix, OwnedRedis};

/// Every text of the chain, `error` first.
fn chain(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut texts = vec![error.to_string()];
    let mut cause = error.source();
    while let Some(error) = cause {
        texts.push(error.to_string());
        cause = error.source();
    }
    texts
}

/// The chain joined as anyhow's `{:#}` prints it names every cause once,
/// and redis-rs's error is reachable in it.
fn assert_each_cause_once(error: &(dyn Error + 'static)) {
    let texts = chain(error);
    assert!(texts.len() > 1, "no cause: {texts:?}");
    let printed = texts.join(": ");
    for cause in &texts[1..] {
        assert_eq!(
            printed.matches(cause.as_str()).count(),
            1,
            "{cause:?} more than once in {printed:?}"
        );
    }
    let mut cause = error.source();
    let mut redis = false;
    while let Some(error) = cause {
        redis |= error.downcast_ref::<RedisCause>().is_some();
        cause = error.source();
    }
    assert!(redis, "no RedisCause in {printed:?}");
}

fn policy() -> [Policy; 1] {
    [Policy::per_hour(100).name("chain").build().unwrap()]
}

#[tokio::test]
async fn a_refused_connection_names_its_cause_once() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let error = RedisStore::builder().url(&url).build().await.unwrap_err();
    assert!(matches!(error, BuildError::Connect { .. }), "{error:?}");
    assert!(
        chain(&error).iter().any(|text| text.contains("refused")),
        "{:?}",
        chain(&error)
    );
    assert_each_cause_once(&error);

    let store = RedisStore::builder()
        .url(&url)
        .lazy_connect(true)
        .build()
        .await
        .unwrap();
    let error = store.check("s", &policy(), 1).await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
    assert_each_cause_once(&error);
}

#[tokio::test]
async fn a_name_that_does_not_resolve_names_its_cause_once() {
    let url = "redis://nonexistent.invalid:6379";
    let error = RedisStore::builder().url(url).build().await.unwrap_err();
    assert!(matches!(error, BuildError::Connect { .. }), "{error:?}");
    assert!(
        chain(&error).iter().any(|text| text.contains("lookup")),
        "{:?}",
        chain(&error)
    );
    assert_each_cause_once(&error);

    let store = RedisStore::builder()
        .url(url)
        .lazy_connect(true)
        .build()
        .await
        .unwrap();
    let error = store.check("s", &policy(), 1).await.unwrap_err();
    assert!(
        chain(&error).iter().any(|text| text.contains("lookup")),
        "{:?}",
        chain(&error)
    );
    assert_each_cause_once(&error);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_under_an_open_connection_names_each_cause_once() {
    let mut server = OwnedRedis::start(&[]);
    let store = RedisStore::builder()
        .url(server.url())
        .prefix(unique_prefix("chain"))
        .pool_size(1)
        // The dead connection's error comes at once (a local server killed
        // resets its connections), and a check that then finds no
        // connection waits its whole timeout for the pool before it
        // answers "no connection" with the refusal as its cause. At 1 s the
        // whole suite on two cores once starved a check's reply on the
        // dead connection past its deadline, which then answered `Timeout`
        // (no cause): the timeout only has to outlast a loaded machine.
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    store.check("s", &policy(), 1).await.unwrap();
    server.kill();
    // The first check meets the dead connection (reset, broken pipe, or
    // dropped), the next ones a refused reconnect: every one of them
    // names each cause once.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let error = store.check("s", &policy(), 1).await.unwrap_err();
        seen.push(chain(&error));
        assert_each_cause_once(&error);
    }
    assert!(
        seen.iter()
            .flatten()
            .any(|text| !text.contains("refused") && text != &seen[0][0]),
        "no error of the dead connection itself: {seen:?}"
    );
}
