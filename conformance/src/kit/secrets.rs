//! Secrets in tests: a marker password full of characters URLs treat
//! specially (`#/?@:%`), and the checks that it never reaches anything the
//! library prints or returns (errors, `Debug`, tracing output).
//!
//! ```
//! use lock_conformance::kit::secrets;
//! let url = format!("redis://user:{}@127.0.0.1:1/0", secrets::MARKER);
//! assert!(secrets::leaks(&url).is_some());
//! assert!(secrets::leaks(&lockcore::backend::redact_url(&url)).is_none());
//! ```

use std::sync::OnceLock;

use crate::kit::logs::Buffer;

/// The marker password: `#`, `/`, `?`, `@`, `:` and `%` between two runs of
/// letters and digits that appear nowhere else.
pub const MARKER: &str = "Mkq7#/?@:%9Zq4";

/// The marker percent-encoded, as a careful user writes it in a URL.
pub fn encoded() -> String {
    MARKER
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What of the marker `text` shows, if anything: the marker itself, its
/// encoded form, or either run of letters and digits (a marker split by a
/// parser at one of its special characters).
pub fn leaks(text: &str) -> Option<&'static str> {
    if text.contains(MARKER) {
        Some("the marker")
    } else if text.contains(&encoded()) {
        Some("the encoded marker")
    } else if text.contains("Mkq7") || text.contains("9Zq4") {
        Some("part of the marker")
    } else {
        None
    }
}

/// Fails (panics) with `what` if `text` shows any of the marker.
#[track_caller]
pub fn assert_hidden(what: &str, text: &str) {
    if let Some(part) = leaks(text) {
        panic!("{what} shows {part}: {text}");
    }
}

static CAPTURED: OnceLock<Buffer> = OnceLock::new();

/// Everything every thread of this process logs through `tracing`, at every
/// level, from the first call on: install it at the start of each test of a
/// binary that checks secrets (later calls only return the capture), then
/// check [`captured`] at the end. Needs no other global subscriber.
pub fn capture_tracing() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let buffer = CAPTURED.get_or_init(Buffer::default).clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || buffer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("capture_tracing needs to be the only global subscriber");
    });
}

/// What [`capture_tracing`] captured so far.
pub fn captured() -> String {
    CAPTURED.get().map(Buffer::text).unwrap_or_default()
}
