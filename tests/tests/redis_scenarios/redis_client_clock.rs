//! A client clock (`ClockMode::Client`) is compared with Redis's `TIME` at
//! `build()`: one far from it (keys written already expired, every check
//! admitted) is refused; one within the tolerance builds.

use std::sync::Arc;
use std::time::Duration;

use portcullis_core::{Clock, ManualClock, Policy, Store, SystemClock};
use portcullis_redis::{BuildError, ClockMode, RedisStore, RedisStoreBuilder};
use portcullis_tests::unique_prefix;

const TEN_MINUTES_US: u64 = 600_000_000;

fn builder(start_micros: u64) -> RedisStoreBuilder {
    RedisStore::builder()
        .url(portcullis_tests::redis_url())
        .prefix(unique_prefix("client-clock"))
        .timeout(Duration::from_secs(5))
        .clock(ClockMode::Client(Arc::new(ManualClock::new(start_micros))))
}

#[tokio::test]
async fn a_client_clock_ten_minutes_off_is_refused_at_build() {
    let now = SystemClock.now_micros();
    for (start, ahead) in [(now - TEN_MINUTES_US, false), (now + TEN_MINUTES_US, true)] {
        let error = builder(start).build().await.unwrap_err();
        let BuildError::ClientClockSkew {
            skew,
            ahead: reported_ahead,
            tolerance,
            ..
        } = &error
        else {
            panic!("expected ClientClockSkew, got {error:?}");
        };
        assert_eq!(*reported_ahead, ahead, "{error}");
        assert!(
            *skew > Duration::from_secs(590) && *skew < Duration::from_secs(610),
            "{error}"
        );
        assert_eq!(
            *tolerance,
            portcullis_redis::defaults::DEFAULT_CLIENT_CLOCK_TOLERANCE
        );
        let text = error.to_string();
        assert!(text.contains("client_clock_tolerance"), "{text}");
        assert!(text.contains("ClockMode::Redis"), "{text}");
        assert!(
            text.contains(if ahead { "ahead of" } else { "behind" }),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_client_clock_within_the_tolerance_builds_and_limits() {
    // The test servers run on this host: its wall clock is Redis's.
    let store = builder(SystemClock.now_micros())
        .build()
        .await
        .expect("a clock that agrees with Redis's builds");
    let policy = [Policy::per_minute(2).name("m").build().unwrap()];
    let admitted = futures::future::join_all((0..5).map(|_| store.check("s", &policy, 1)))
        .await
        .into_iter()
        .filter(|decision| decision.as_ref().unwrap().is_allowed())
        .count();
    assert_eq!(admitted, 2);

    // A tolerance wide enough takes a clock far off on purpose.
    builder(SystemClock.now_micros() - TEN_MINUTES_US)
        .client_clock_tolerance(Duration::from_secs(3_600))
        .build()
        .await
        .expect("the tolerance was raised");
}
