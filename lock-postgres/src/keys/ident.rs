//! SQL identifiers from configuration: validated, then always quoted.

use std::fmt;

use lockcore::LockError;

/// A schema, table or sequence name that matched
/// `^[A-Za-z_][A-Za-z0-9_]{0,62}$`. It is interpolated into SQL only in
/// quoted form, so case is kept and reserved words work; lock names never
/// come here (they are always bind parameters).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Ident(String);

impl Ident {
    /// PostgreSQL's identifier limit (NAMEDATALEN - 1); longer names are
    /// silently truncated by the server, so they are refused here.
    pub(crate) const MAX_BYTES: usize = 63;

    /// Validates `value` as the `what` option, at most `max` bytes.
    pub(crate) fn new(what: &str, value: &str, max: usize) -> Result<Self, LockError> {
        let mut chars = value.chars();
        let valid_start = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_start || !valid_rest {
            return Err(LockError::config(format!(
                "{what} name {:?} is not a safe SQL identifier: use ASCII letters, digits and _, not starting with a digit",
                preview(value)
            )));
        }
        if value.len() > max {
            return Err(LockError::config(format!(
                "{what} name {:?} is {} bytes; at most {max} are allowed (PostgreSQL truncates identifiers longer than 63 bytes)",
                preview(value),
                value.len()
            )));
        }
        Ok(Ident(value.to_owned()))
    }

    /// This identifier with `suffix` appended (the suffix is a constant of
    /// identifier characters and the length was checked by the caller).
    pub(crate) fn with_suffix(&self, suffix: &str) -> Ident {
        Ident(format!("{}{suffix}", self.0))
    }

    /// The bare name.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The quoted form, for SQL text.
    pub(crate) fn quoted(&self) -> String {
        // Validation leaves no `"` to double; quoting keeps case and
        // protects reserved words.
        format!("\"{}\"", self.0)
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

fn preview(value: &str) -> String {
    value.chars().take(70).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_identifiers_and_quotes_them() {
        for ok in ["a", "_", "Locks", "select", "t_1", &"x".repeat(63)] {
            let ident = Ident::new("table", ok, 63).unwrap();
            assert_eq!(ident.quoted(), format!("\"{ok}\""));
        }
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "",
            "1a",
            "a b",
            "a\"b",
            "a;b",
            "a.b",
            "é",
            "a\0",
            "locks\"; DROP TABLE x; --",
            &"x".repeat(64),
        ] {
            let err = Ident::new("table", bad, 63).unwrap_err();
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{bad:?}");
        }
    }
}
