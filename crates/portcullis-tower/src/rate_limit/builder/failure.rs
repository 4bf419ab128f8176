//! The builder's setters for a failing or full store: the failure
//! policy, the check timeout, the circuit breaker, the deny cache that
//! spares the store and the clock it counts in, and the status of a new
//! subject it has no room for.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use portcullis_core::{Clock, Store};

use super::RateLimitLayerBuilder;
use crate::config::FailurePolicy;
use crate::key::KeyExtractor;

impl<St: Store, K: KeyExtractor> RateLimitLayerBuilder<St, K> {
    /// Sets what happens when the store fails (default
    /// [`FailurePolicy::FailOpen`]). Only errors about the store as a whole
    /// count toward the circuit breaker; an error about one subject is
    /// answered for that request alone, and a new subject the store has no
    /// room for is denied whatever this says (see
    /// [`RateLimitLayerBuilder::no_room_status`] and the table at
    /// [`ErrorScope`](portcullis_core::ErrorScope)).
    pub fn on_store_failure(mut self, failure: FailurePolicy) -> Self {
        self.settings.failure = failure;
        self
    }

    /// Bounds each store check; a check that takes longer is a store
    /// failure. The same bound applies to the fallback store's check
    /// ([`FailurePolicy::Fallback`]), whose timeout lets the request through
    /// undecided. Default: 500 ms.
    ///
    /// The default is above a `RedisStore`'s own per-call timeout (250 ms by
    /// default), so that the store's own timeout answers first, and leaves
    /// it room to answer on a loaded machine: measured on a 2-core box with
    /// four busy threads and 1024 checks in flight through this layer over
    /// Redis, the slowest check took 164 ms. So the layer fails open only
    /// when the store really is stuck; the
    /// [circuit breaker](Self::circuit_breaker) then stops waiting on it
    /// after 5 failures in a row (by default).
    pub fn check_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// After `failures` consecutive store failures, skip the store for
    /// `pause` (applying the failure policy at once), then let one request
    /// probe it. Default 5 failures and 1 second; 0 failures disables the
    /// breaker.
    pub fn circuit_breaker(mut self, failures: u32, pause: Duration) -> Self {
        self.settings.breaker = (failures, pause);
        self
    }

    /// Remembers up to `capacity` denied subjects and denies their further
    /// requests locally until their retry time, without asking the store
    /// (on by default with 65 536 subjects; `0` turns it off). This is
    /// exact: nothing but a reset can admit a denied subject sooner. A reset
    /// done through another instance is seen here only when the entry
    /// expires.
    ///
    /// Only answers that took a round trip are held: a store that answers
    /// at once ([`Store::check_now`], as
    /// [`MemoryStore`](portcullis_core::MemoryStore) does) is as quick as the
    /// cache, so it is asked every time.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.settings.deny_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// The clock the [deny cache](Self::deny_cache) counts a held denial
    /// down in: by default tokio's (which a test on paused tokio time
    /// moves). In a test whose store reads a
    /// [`ManualClock`](portcullis_core::ManualClock), give the layer the
    /// same clock, so that advancing it ends the cached denial when it ends
    /// the store's: no sleeping.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::{ManualClock, MemoryStore, Policy, SystemClock, Clock};
    /// use portcullis::tower::RateLimitLayer;
    ///
    /// let clock = ManualClock::new(SystemClock.now_micros());
    /// let store = MemoryStore::builder().clock(clock.clone()).build();
    /// let layer = RateLimitLayer::builder(store)
    ///     .policy(Policy::per_minute(5).build()?)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// clock.advance(Duration::from_secs(60)); // the store and the layer's cache
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.settings.clock = Some(Arc::new(clock));
        self
    }

    /// The status of a request from a new subject that the store has no
    /// room for ([`ErrorScope::NoRoom`](portcullis_core::ErrorScope): a
    /// `MemoryStore` at its bound told to deny, a Redis at `maxmemory`):
    /// `429 Too Many Requests` by default, or for example
    /// `503 Service Unavailable`. Either carries the store's
    /// `Retry-After`; such a request is never let through.
    pub fn no_room_status(mut self, status: StatusCode) -> Self {
        self.settings.no_room_status = status;
        self
    }
}
