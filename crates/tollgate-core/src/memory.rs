//! STUB: to be implemented.
use std::future::Ready;

use crate::{Policy, Store, StoreError, Verdict};

/// In-memory store.
#[derive(Debug, Default)]
pub struct MemoryStore {}

/// Builder.
#[derive(Debug, Default)]
pub struct MemoryStoreBuilder {}

impl MemoryStore {
    /// New store.
    #[must_use]
    pub fn new() -> Self {
        Self {}
    }
}

impl Store for MemoryStore {
    type CheckFuture = Ready<Result<Verdict, StoreError>>;
    fn check(&self, _subject: &str, _policies: &[Policy], _cost: u64) -> Self::CheckFuture {
        todo!()
    }
    fn reset(&self, _subject: &str, _policies: &[Policy]) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static {
        std::future::ready(Ok(()))
    }
}
