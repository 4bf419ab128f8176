//! A request's check options in the rate-limit layer (idempotency keys and
//! priority classes): where a layer takes them from ([`OptionSources`],
//! set by the builder's `builder/options.rs`), the [`CheckOptions`] they
//! give one request ([`RequestOptions`]), and its check through
//! [`Store::check_with`] (one call: the record, the class reserves and the
//! check together).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use portcullis_core::{
    BoxCheckFuture, CheckOptions, Policy, Store, StoreError, Verdict, DEFAULT_FREE_REPLAYS,
    MAX_IDEMPOTENCY_WINDOW,
};

use crate::config::ConfigError;
use crate::key::{KeyBuf, KeyExtractor, RequestHead};

/// What a layer adds to each check: an idempotency key extractor with its
/// window, the free replays of a record and what else binds it to its
/// request, and a priority class selector.
pub(crate) struct OptionSources {
    pub(super) idempotency: Option<(Box<dyn KeyExtractor>, Duration)>,
    pub(super) fingerprint: Option<Box<dyn KeyExtractor>>,
    pub(super) free_replays: u32,
    pub(super) priority: Option<Box<dyn KeyExtractor>>,
}

impl Default for OptionSources {
    fn default() -> Self {
        Self {
            idempotency: None,
            fingerprint: None,
            free_replays: DEFAULT_FREE_REPLAYS,
            priority: None,
        }
    }
}

/// A request's options, and whether its check was a replay (set by the
/// check's future, read when the verdict arrives).
#[derive(Debug)]
pub(crate) struct RequestOptions {
    options: CheckOptions,
    replayed: Arc<AtomicBool>,
}

impl RequestOptions {
    /// The options of a request checked as its policies' default class
    /// (no idempotency key, no class of its own).
    pub(crate) fn default_class() -> Box<Self> {
        Box::new(Self {
            options: CheckOptions::new(),
            replayed: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Whether the verdict replays an earlier request with the same
    /// idempotency key (nothing was charged, nor is after the response).
    pub(crate) fn is_replay(&self) -> bool {
        self.replayed.load(Ordering::Relaxed)
    }
}

impl OptionSources {
    /// Whether the layer adds anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.idempotency.is_none() && self.priority.is_none()
    }

    /// The options of this request; `None` when it carries neither an
    /// idempotency key nor a class (a plain check).
    pub(crate) fn for_request(&self, request: &RequestHead<'_>) -> Option<Box<RequestOptions>> {
        let mut options = CheckOptions::new();
        if let Some((extractor, window)) = &self.idempotency {
            let mut key = KeyBuf::new();
            if extractor.extract_into(request, &mut key) && !key.as_str().is_empty() {
                options = options
                    .idempotency_key(key.as_str(), *window)
                    .free_replays(self.free_replays)
                    .fingerprint(self.fingerprint(request));
            }
        }
        if let Some(selector) = &self.priority {
            let mut class = KeyBuf::new();
            if selector.extract_into(request, &mut class) && !class.as_str().is_empty() {
                options = options.class(class.as_str());
            }
        }
        (!options.is_empty()).then(|| {
            Box::new(RequestOptions {
                options,
                replayed: Arc::new(AtomicBool::new(false)),
            })
        })
    }
}

impl OptionSources {
    /// What binds a record to its request: the method, the path with its
    /// query, and the configured fingerprint extractor's value (a body
    /// digest header, say), each length-prefixed so no two requests read
    /// alike, hashed (so a long URL is never too long a fingerprint). The
    /// cost is added by the store.
    fn fingerprint(&self, request: &RequestHead<'_>) -> String {
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let mut extra = KeyBuf::new();
        let has_extra = self
            .fingerprint
            .as_ref()
            .is_some_and(|extractor| extractor.extract_into(request, &mut extra));
        let mut fingerprint = Vec::with_capacity(path.len() + extra.as_str().len() + 32);
        for part in [
            request.method().as_str(),
            path,
            if has_extra { extra.as_str() } else { "" },
        ] {
            fingerprint.extend_from_slice(&(part.len() as u64).to_be_bytes());
            fingerprint.extend_from_slice(part.as_bytes());
        }
        fingerprint.push(u8::from(has_extra));
        portcullis_core::subject::hash_subject(&fingerprint)
    }
}

/// A check with options: answered now when the store answers at once
/// (its future is ready at the first poll), else the future to wait for,
/// already started (never dropped and sent again: that would charge twice).
pub(crate) enum Asked {
    Now(Result<Verdict, StoreError>),
    Later(BoxCheckFuture),
}

/// Sends the check with `request`'s options; the future records a replay
/// in `request`.
pub(crate) fn ask<St: Store>(
    store: &St,
    key: &str,
    policies: &[Policy],
    cost: u64,
    request: &RequestOptions,
) -> Asked {
    let replayed = Arc::clone(&request.replayed);
    let checked = store.check_with(key, policies, cost, &request.options);
    let mut future: BoxCheckFuture = Box::pin(async move {
        let checked = checked.await?;
        replayed.store(checked.is_replay(), Ordering::Relaxed);
        Ok(checked.into_verdict())
    });
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(result) => Asked::Now(result),
        Poll::Pending => Asked::Later(future),
    }
}

/// Checks the layer's idempotency window at build time.
pub(crate) fn validate(sources: &OptionSources) -> Result<(), ConfigError> {
    match &sources.idempotency {
        Some((_, window)) if window.is_zero() || *window > MAX_IDEMPOTENCY_WINDOW => {
            Err(ConfigError::IdempotencyWindow { window: *window })
        }
        _ => Ok(()),
    }
}
