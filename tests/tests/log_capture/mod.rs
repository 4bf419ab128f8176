//! What a `tracing` subscriber writes, captured for a test to read (a
//! module shared by the tests that count log lines, not a test target).
#![allow(dead_code)] // each test binary uses a different subset

use std::sync::{Arc, Mutex};

/// Captures what a `tracing` subscriber writes.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The lines written so far that contain `needle` (a level such as
    /// `"ERROR"`, or any text).
    pub(crate) fn lines(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// A plain-text subscriber of events at `level` and above, writing
    /// here, with thread names (so a test can tell whose thread logged).
    pub(crate) fn dispatch(&self, level: tracing::Level) -> tracing::Dispatch {
        tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_writer(self.clone())
                .with_max_level(level)
                .with_thread_names(true)
                .with_ansi(false)
                .finish(),
        )
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
