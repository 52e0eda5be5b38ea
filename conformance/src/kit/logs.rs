//! What a piece of code logs, captured for one test while other tests run
//! on other threads.
//!
//! `tracing` caches, per call site, whether any subscriber listens. A call
//! site first reached on a thread without a subscriber, while another
//! thread installs its own scoped one, can be cached as unheard, and that
//! thread's events from it are then dropped: a warning went missing from a
//! captured log in CI, and 6 of 400 runs of one adapter's URL tests at 8
//! threads (none of 1,000 since). So the first capture installs
//! a global subscriber that hears every call site and writes nothing, and
//! each capture rebuilds the call sites' interest once its own subscriber
//! is in place. (A binary that uses `secrets::capture_tracing`, which is
//! the global subscriber itself, needs neither.)

use std::io::Write;
use std::sync::{Arc, Mutex, Once};

use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber, span};

/// Runs `work` with a subscriber of its own (info and above, no colours)
/// and returns its result and the text it logged.
pub fn captured<T>(work: impl FnOnce() -> T) -> (T, String) {
    static QUIET: Once = Once::new();
    QUIET.call_once(|| {
        // Another global subscriber, if one is set, hears them too.
        let _ = tracing::subscriber::set_global_default(Quiet);
    });
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        tracing::callsite::rebuild_interest_cache();
        work()
    });
    (out, buffer.text())
}

/// Sends what the code under test logs to stderr at the filter
/// `LOCK_TEST_LOG` gives (`RUST_LOG` syntax), once per process; nothing
/// when it is unset. A soak keeps a failed run's output, and with it what
/// the adapter decided on the way (the suite's tests call this first).
pub fn to_stderr_from_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some(filter) = crate::kit::env::LOG.get() else {
            return;
        };
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Text written from any thread, kept for a test to read.
#[derive(Clone, Default)]
pub(crate) struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Buffer {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Hears every call site (so none is cached as unheard), records nothing.
struct Quiet;

impl Subscriber for Quiet {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_holds_what_its_work_logged_and_only_that() {
        let (value, text) = captured(|| {
            tracing::warn!(option = "lock_table", "renamed");
            7
        });
        assert_eq!(value, 7);
        assert!(
            text.contains("renamed") && text.contains("lock_table"),
            "{text}"
        );
        let (_, other) = captured(|| ());
        assert!(other.is_empty(), "{other}");
    }
}
