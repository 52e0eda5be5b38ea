//! `HolderLabel`: who holds a lock, in words an operator can read.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::LockError;

/// A short, human-readable label stored with each lease ("billing-7f9c:4121",
/// "settlement worker 3"), shown by `inspect` and carried in audit events, so
/// an operator can tell *who* holds a lock. It is only a label: who owns a
/// lease is decided by its owner token, never by the label.
///
/// Defaults to `hostname:pid`. At most [`MAX_BYTES`](Self::MAX_BYTES) bytes of
/// UTF-8, no control characters.
///
/// ```
/// use lockcore::HolderLabel;
/// assert!(HolderLabel::new("settlement worker 3").is_ok());
/// assert!(HolderLabel::new("two\nlines").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HolderLabel(Arc<str>);

impl HolderLabel {
    /// The longest label, in bytes.
    pub const MAX_BYTES: usize = 128;

    /// Validates `label`.
    ///
    /// # Errors
    /// [`LockError::InvalidLabel`] when it is empty, longer than
    /// [`MAX_BYTES`](Self::MAX_BYTES) or contains a control character.
    pub fn new(label: impl AsRef<str>) -> Result<Self, LockError> {
        let label = label.as_ref();
        let why = if label.is_empty() {
            Some("labels must not be empty".to_owned())
        } else if label.len() > Self::MAX_BYTES {
            Some(format!(
                "{} bytes, labels are at most {} bytes of UTF-8",
                label.len(),
                Self::MAX_BYTES
            ))
        } else {
            label.char_indices().find(|(_, c)| c.is_control()).map(|(at, c)| {
                format!(
                    "control character U+{:04X} at byte {at} (control characters are not allowed)",
                    c as u32
                )
            })
        };
        match why {
            None => Ok(HolderLabel(Arc::from(label))),
            Some(reason) => Err(LockError::InvalidLabel {
                label: crate::name::preview(label),
                reason,
            }),
        }
    }

    /// This process: `hostname:pid` (the host name cut to fit).
    pub fn this_process() -> HolderLabel {
        static LABEL: OnceLock<HolderLabel> = OnceLock::new();
        LABEL
            .get_or_init(|| {
                let pid = std::process::id();
                let host: String = hostname()
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(Self::MAX_BYTES / 2)
                    .collect();
                let host = if host.is_empty() {
                    "localhost".to_owned()
                } else {
                    host
                };
                HolderLabel::new(format!("{host}:{pid}"))
                    .unwrap_or_else(|_| HolderLabel(Arc::from(format!("pid:{pid}"))))
            })
            .clone()
    }

    /// The label as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The host name, from the kernel where it says (Linux), else the
/// environment, else empty.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}

impl Default for HolderLabel {
    fn default() -> Self {
        HolderLabel::this_process()
    }
}

impl fmt::Display for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderLabel({:?})", &*self.0)
    }
}

impl std::str::FromStr for HolderLabel {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HolderLabel::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_and_defaults_to_host_and_pid() {
        assert_eq!(HolderLabel::new("worker 3").unwrap().as_str(), "worker 3");
        for bad in ["", "a\nb", "\u{7f}", &"x".repeat(129)] {
            assert!(
                matches!(HolderLabel::new(bad), Err(LockError::InvalidLabel { .. })),
                "{bad:?}"
            );
        }
        let me = HolderLabel::this_process();
        assert!(
            me.as_str().ends_with(&format!(":{}", std::process::id())),
            "{me}"
        );
        assert!(me.as_str().len() <= HolderLabel::MAX_BYTES);
    }
}
