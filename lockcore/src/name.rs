//! Lock names: validated once, at the edge, so no backend ever sees a bad one.

use std::fmt;
use std::sync::Arc;

use crate::error::{InvalidName, LockError};

/// The name of a lock: 1 to 255 bytes of UTF-8 without control characters.
///
/// Names are case-sensitive and otherwise opaque: `/`, `..`, `*`, `{}`, quotes
/// and emoji are all valid, and every backend maps each valid name to its own
/// store key (two names never share a key).
///
/// ```
/// use lockcore::LockName;
/// assert!(LockName::new("billing/nightly-settlement").is_ok());
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("tab\there").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The longest valid name, in bytes.
    pub const MAX_BYTES: usize = 255;

    /// Validates `name`.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] when the name is empty, longer than
    /// [`MAX_BYTES`](Self::MAX_BYTES) or contains a control character
    /// (`char::is_control`: C0, DEL and C1).
    pub fn new(name: impl AsRef<str>) -> Result<Self, LockError> {
        let name = name.as_ref();
        let reason = if name.is_empty() {
            Some(InvalidName::Empty)
        } else if name.len() > Self::MAX_BYTES {
            Some(InvalidName::TooLong { bytes: name.len() })
        } else {
            name.char_indices()
                .find(|(_, c)| c.is_control())
                .map(|(at, c)| InvalidName::ControlCharacter { at, code: c as u32 })
        };
        match reason {
            None => Ok(LockName(Arc::from(name))),
            Some(reason) => Err(LockError::InvalidName {
                name: preview(name),
                reason,
            }),
        }
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name with `%` and every character `special` picks
    /// percent-encoded (its UTF-8 bytes, upper-case hex), for stores whose
    /// keys or paths give some characters a meaning (`/` in a path, `{}` in
    /// a Redis hash tag). Injective: `%` is always encoded, so two names
    /// never map to one string, and percent-decoding gives the name back.
    ///
    /// ```
    /// use lockcore::LockName;
    /// let name = LockName::new("a/b%{c}").unwrap();
    /// assert_eq!(name.escaped(|c| c == '/'), "a%2Fb%25{c}");
    /// ```
    pub fn escaped(&self, special: impl Fn(char) -> bool) -> String {
        let mut out = String::with_capacity(self.0.len());
        for c in self.0.chars() {
            if c == '%' || special(c) {
                let mut utf8 = [0u8; 4];
                for byte in c.encode_utf8(&mut utf8).bytes() {
                    out.push_str(&format!("%{byte:02X}"));
                }
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// A short, escaped rendering of rejected input for error messages: a 1 MiB
/// name must not end up in a log line.
pub(crate) fn preview(name: &str) -> String {
    const MAX_CHARS: usize = 48;
    let mut out: String = name
        .chars()
        .take(MAX_CHARS)
        .collect::<String>()
        .escape_debug()
        .collect();
    if name.chars().count() > MAX_CHARS {
        out.push('…');
    }
    out
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockName({:?})", &*self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for LockName {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LockName::new(s)
    }
}

impl TryFrom<&str> for LockName {
    type Error = LockError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        LockName::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = LockError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        LockName::new(s)
    }
}

/// Anything the client layer accepts as a lock name: `&str`, `String` or an
/// already validated [`LockName`].
pub trait IntoLockName {
    /// Validates (if needed) and converts.
    ///
    /// # Errors
    /// [`LockError::InvalidName`], see [`LockName::new`].
    fn into_lock_name(self) -> Result<LockName, LockError>;
}

impl IntoLockName for LockName {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        Ok(self)
    }
}

impl IntoLockName for &LockName {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        Ok(self.clone())
    }
}

impl IntoLockName for &str {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

impl IntoLockName for String {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

impl IntoLockName for &String {
    fn into_lock_name(self) -> Result<LockName, LockError> {
        LockName::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_printable_name_up_to_the_limit() {
        for ok in [
            "a",
            "a/b",
            "..",
            "*",
            "{tag}",
            "'; DROP TABLE x; --",
            "ünï🔒",
            "\u{202e}rtl",
        ] {
            assert_eq!(LockName::new(ok).unwrap().as_str(), ok);
        }
        assert!(LockName::new("x".repeat(255)).is_ok());
        assert!(LockName::new("é".repeat(127)).is_ok()); // 254 bytes
    }

    #[test]
    fn rejects_with_a_reason() {
        let cases = [
            ("", "empty"),
            (&"x".repeat(256) as &str, "256 bytes"),
            ("a\0b", "U+0000"),
            ("a\nb", "U+000A"),
            ("del\u{7f}", "U+007F"),
            ("c1\u{85}", "U+0085"),
        ];
        for (bad, why) in cases {
            let err = LockName::new(bad).unwrap_err();
            assert!(matches!(err, LockError::InvalidName { .. }), "{err:?}");
            assert!(err.to_string().contains(why), "{err} should mention {why}");
        }
    }

    #[test]
    fn escaping_is_injective_and_readable() {
        let slash = |c: char| c == '/';
        let esc = |s: &str| LockName::new(s).unwrap().escaped(slash);
        assert_eq!(esc("plain-name"), "plain-name");
        assert_eq!(esc("a/b"), "a%2Fb");
        assert_ne!(esc("a/b"), esc("a%2Fb"));
        assert_eq!(esc("a%2Fb"), "a%252Fb");
        assert_eq!(
            LockName::new("ü/").unwrap().escaped(|c| !c.is_ascii()),
            "%C3%BC/"
        );
    }

    #[test]
    fn error_preview_is_short_and_escaped() {
        let err = LockName::new(format!("\n{}", "y".repeat(1 << 20))).unwrap_err();
        let msg = err.to_string();
        assert!(msg.len() < 200, "{msg}");
        assert!(msg.contains("\\n"));
    }
}
