//! [`LogGate`]: at most one log line per second from what requests can
//! cause (a client must not be able to flood the log), with the number of
//! lines held back. A leaf.

use std::fmt::Arguments;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Lets one line a second through; counts the others.
#[derive(Debug, Default)]
pub(crate) struct LogGate {
    /// The second of the last line written.
    last: AtomicU64,
    held_back: AtomicU64,
}

impl LogGate {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether a line may be written now, and how many were held back.
    fn open(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last.load(Ordering::Relaxed);
        if now > last
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }

    pub(crate) fn warn(&self, line: Arguments<'_>) {
        if let Some(held_back) = self.open() {
            tracing::warn!(target: "portcullis_envoy", held_back, "{line}");
        }
    }

    pub(crate) fn info(&self, line: Arguments<'_>) {
        if let Some(held_back) = self.open() {
            tracing::info!(target: "portcullis_envoy", held_back, "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_second() {
        let gate = LogGate::new();
        assert_eq!(gate.open(), Some(0));
        // The same second (the test is far from a second's end more often
        // than not; either way at most one more line opens).
        let opened = (0..100).filter(|_| gate.open().is_some()).count();
        assert!(opened <= 1, "{opened}");
    }
}
