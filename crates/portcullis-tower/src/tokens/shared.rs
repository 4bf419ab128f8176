//! What every service of one token layer shares ([`Shared`]), its
//! warnings' counters ([`TokenLogs`]) among them.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use portcullis_core::TokenBudget;

use super::request::Estimate;
use crate::breaker::UndecidedLog;
use crate::KeyExtractor;

/// What every service of one layer shares.
pub(crate) struct Shared<St> {
    pub(crate) store: Arc<St>,
    pub(crate) budget: TokenBudget,
    pub(crate) key: Box<dyn KeyExtractor>,
    pub(crate) estimate: Estimate,
    pub(crate) usage_header: Option<HeaderName>,
    pub(crate) body_usage: bool,
    pub(crate) timeout: Duration,
    pub(crate) fail_open: bool,
    /// `RateLimit-Policy` of the budget's policies, computed once.
    pub(crate) policy_header: Option<HeaderValue>,
    /// `"<name>";r=` of each policy, computed once.
    pub(crate) prefixes: Box<[Box<str>]>,
    /// The layer's warnings, each logged at most once a second with the
    /// count since the last: a request can cause them.
    pub(crate) logs: Arc<TokenLogs>,
}

/// The token layer's warnings that requests or an outage can repeat, each
/// counted and logged at most once a second ([`UndecidedLog`]).
#[derive(Debug)]
pub(crate) struct TokenLogs {
    /// Reservations refused as sent (a request-scope store error).
    pub(crate) refused: UndecidedLog,
    /// Store failures at admission.
    pub(crate) failed: UndecidedLog,
    /// Settlements that failed.
    pub(crate) settles: UndecidedLog,
    /// Renewals of open reservations that failed.
    pub(crate) renewals: UndecidedLog,
}

impl TokenLogs {
    pub(crate) fn new() -> Self {
        Self {
            refused: UndecidedLog::new(),
            failed: UndecidedLog::new(),
            settles: UndecidedLog::new(),
            renewals: UndecidedLog::new(),
        }
    }
}
