//! [`RateLimitLayer`], what a built layer is: the `Arc` of the
//! [`Checker`] its services share (`checker/`), the `Layer` that makes
//! [`RateLimit`] services, and what a layer answers once built (its
//! store, policies, `reset`, `keep_body`). How one is made is the
//! builder's (`builder/`, above this file): the constructors
//! (`RateLimitLayer::new`, `builder`, `builder_shared`) live there beside
//! the builder they start, and `build` makes the layer, so this file never
//! names the builder.

use std::sync::Arc;

use portcullis_core::{Policy, Store, StoreError};

use super::checker::Checker;
use super::keep_body::KeepBodyLayer;
use super::service::RateLimit;

shared_layer! {
/// Applies rate limiting to requests: a tower `Layer` producing
/// [`RateLimit`] services.
///
/// Build one with [`RateLimitLayer::new`] (one policy, keyed by peer IP) or
/// [`RateLimitLayer::builder`]. Clones share one configuration and one store,
/// so a layer applied to several routes, or cloned into several servers,
/// enforces one limit.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::{routing::get, Router};
/// use portcullis::{MemoryStore, Policy};
/// use portcullis::tower::{ClientIp, RateLimitLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(Policy::per_second(10).burst(20).name("burst").build()?)
///     .policy(Policy::per_day(10_000).name("daily").build()?)
///     .key(ClientIp::trusting(["10.0.0.0/8".parse()?]))
///     .build()?;
///
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
/// # Ok(()) }
/// ```
    RateLimitLayer,
    RateLimit,
    Checker
}

impl<St: Store, K> RateLimitLayer<St, K> {
    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<St> {
        &self.shared.store
    }

    /// This layer with responses in the inner service's own body type
    /// (`From<Bytes>`, as Axum's `Body` is) instead of
    /// [`RateLimitBody`](crate::RateLimitBody), so
    /// Axum does not box a wrapper body per response: see
    /// [`KeepBodyLayer`]. Clones of the layer still share its store,
    /// configuration and deny cache.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use portcullis::{MemoryStore, Policy};
    /// use portcullis::tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Policy::per_second(5).build().unwrap());
    /// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer.keep_body());
    /// # let _ = app;
    /// ```
    pub fn keep_body(self) -> KeepBodyLayer<Self> {
        KeepBodyLayer::new(self)
    }

    /// The default policies (with [`RateLimitLayerBuilder::limits`](crate::RateLimitLayerBuilder::limits): those
    /// in force when the layer was built; the handle has the current ones).
    #[must_use]
    pub fn policies(&self) -> &[Policy] {
        &self.shared.tiers[0].policies
    }

    /// Forgets the state of `key` (a key as the extractor produces it, for
    /// example `"203.0.113.7"`) under every tier's policies, in the store
    /// and in this layer's deny cache. Other instances' deny caches keep
    /// their entries until those expire.
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        if let Some(cache) = &self.shared.deny_cache {
            cache.remove(key);
        }
        let tiers = match &self.shared.live {
            Some(live) => live.sets_for(key),
            None => self.shared.tiers.to_vec(),
        };
        for tier in tiers {
            self.shared.store.reset(key, &tier.policies).await?;
        }
        if let Some(cache) = &self.shared.deny_cache {
            cache.remove(key);
        }
        Ok(())
    }
}
