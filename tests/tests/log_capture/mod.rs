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
    ///
    /// The first call also installs [`AskEveryTime`] as the process's
    /// global subscriber, so that no callsite's interest is cached as
    /// "never" (see there).
    pub(crate) fn dispatch(&self, level: tracing::Level) -> tracing::Dispatch {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            // Fails only if another global subscriber is set, which then
            // decides; these binaries set none.
            let _ = tracing::subscriber::set_global_default(AskEveryTime);
        });
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

/// The global subscriber of the binaries that count log lines: it records
/// nothing, and answers every callsite's registration with "sometimes",
/// so each event asks the subscriber in force on its thread.
///
/// Without it, `tracing` caches a callsite's interest for the whole
/// process when the callsite is first hit: hit first on a thread with no
/// subscriber, while a test's scoped subscriber was being registered on
/// another, the callsite was cached as "never" and that test saw no line
/// (`refused_estimates_do_not_flood_the_log`, once in CI). "Sometimes"
/// from the global subscriber keeps every callsite asking.
struct AskEveryTime;

impl tracing::Subscriber for AskEveryTime {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
