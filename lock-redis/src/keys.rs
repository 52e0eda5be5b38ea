//! The key scheme: every lock name maps to its own lock key, fence key and
//! wake-up channel, all under one configurable prefix.
//!
//! ```text
//! <prefix>{<name>}          lock key: "<owner>:<fence>", PX = TTL
//! <prefix>{<name>}:fence    fence counter (never expires)
//! <prefix>{<name>}          pub/sub channel (channels and keys are separate namespaces)
//! ```
//!
//! In the name, `%`, `{` and `}` are percent-encoded (`%25`, `%7B`, `%7D`)
//! and nothing else is touched. That encoding is injective, and it keeps
//! braces out of the hash tag, so the tag is exactly the encoded name: the
//! lock key and its fence counter always land in the same Redis Cluster slot,
//! and two names never share a key. Glob characters (`* ? [ ] \`) are plain
//! data: the adapter never uses `KEYS` or `SCAN MATCH`.

use lockcore::{LockError, LockName};

/// The default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "distlock:";

/// The longest accepted prefix, in bytes.
pub(crate) const MAX_PREFIX_BYTES: usize = 128;

/// Checks a key prefix: 1 to 128 printable ASCII characters, no spaces, and
/// no braces (they would move the Cluster hash tag).
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    let problem = if prefix.is_empty() {
        Some("must not be empty (it keeps lock keys apart from your other keys)".to_string())
    } else if prefix.len() > MAX_PREFIX_BYTES {
        Some(format!(
            "is {} bytes, at most {MAX_PREFIX_BYTES} are allowed",
            prefix.len()
        ))
    } else {
        prefix
            .chars()
            .find(|c| !c.is_ascii_graphic() || *c == '{' || *c == '}')
            .map(|c| {
                format!(
                    "contains {c:?}: use printable ASCII without spaces or braces (the adapter sets the hash tag itself)"
                )
            })
    };
    match problem {
        None => Ok(()),
        Some(why) => Err(LockError::config(format!(
            "key prefix {:?} {why}",
            prefix.chars().take(MAX_PREFIX_BYTES).collect::<String>()
        ))),
    }
}

/// The store keys and channel of one lock name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    /// Holds `"<owner>:<fence>"` with the lease's TTL.
    pub(crate) lock: String,
    /// The name's fence counter.
    pub(crate) fence: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let mut lock = String::with_capacity(prefix.len() + name.as_str().len() + 8);
        lock.push_str(prefix);
        lock.push('{');
        for c in name.as_str().chars() {
            match c {
                '%' => lock.push_str("%25"),
                '{' => lock.push_str("%7B"),
                '}' => lock.push_str("%7D"),
                c => lock.push(c),
            }
        }
        lock.push('}');
        let fence = format!("{lock}:fence");
        Keys { lock, fence }
    }

    /// The pub/sub channel releases of this name are announced on.
    pub(crate) fn channel(&self) -> &str {
        &self.lock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's hash-tag rule: the part between the first `{` and the
    /// next `}`, if non-empty; otherwise the whole key.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{')
            && let Some(len) = key[open + 1..].find('}')
            && len > 0
        {
            return &key[open + 1..open + 1 + len];
        }
        key
    }

    fn keys(name: &str) -> Keys {
        Keys::new(DEFAULT_PREFIX, &LockName::new(name).unwrap())
    }

    #[test]
    fn lock_and_fence_share_a_slot_for_any_name() {
        for name in [
            "a",
            "}",
            "{",
            "{}",
            "}{",
            "a}b{c",
            "{tag}",
            "%7B",
            "*?[]\\",
            "ünï🔒",
        ] {
            let k = keys(name);
            assert_eq!(hash_tag(&k.lock), hash_tag(&k.fence), "{name:?}");
            assert!(!hash_tag(&k.lock).is_empty(), "{name:?}");
            assert_ne!(
                hash_tag(&k.lock),
                k.lock,
                "{name:?}: the tag must not be the whole key"
            );
        }
    }

    #[test]
    fn the_mapping_is_injective_on_near_collisions() {
        let names = [
            "a{b", "a%7Bb", "a%257Bb", "a}b", "a%7Db", "%", "%25", "%2525", "a:fence", "a}:fence",
            "a", "A", "a ", "*", "?", "[a]", "\\",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let k = keys(name);
            assert!(seen.insert(k.lock.clone()), "{name:?} collides");
            assert!(seen.insert(k.fence.clone()), "{name:?} fence collides");
        }
    }

    #[test]
    fn keys_look_as_documented() {
        let k = keys("orders/{42}");
        assert_eq!(k.lock, "distlock:{orders/%7B42%7D}");
        assert_eq!(k.fence, "distlock:{orders/%7B42%7D}:fence");
        assert_eq!(k.channel(), k.lock);
    }

    #[test]
    fn prefixes_are_validated() {
        for ok in ["distlock:", "app:locks:", "x", "a/b-c_d.e:"] {
            assert!(validate_prefix(ok).is_ok(), "{ok}");
        }
        let long = "p".repeat(MAX_PREFIX_BYTES + 1);
        for bad in ["", "a{", "}", "with space", "tab\t", "é", long.as_str()] {
            assert!(
                matches!(validate_prefix(bad), Err(LockError::InvalidConfig { .. })),
                "{bad:?}"
            );
        }
    }
}
