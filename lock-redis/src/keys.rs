//! The key scheme: every lock name maps to its own keys, all under one
//! configurable prefix and one hash tag; each backend instance has one
//! wake-up channel.
//!
//! ```text
//! <prefix>{<name>}          lock key: "<owner>:<fence>", PX = TTL
//! <prefix>{<name>}:fence    fence counter (never expires)
//! <prefix>{<name>}:queue    waiters in line (zset), expires when nobody refreshes it
//! <prefix>{<name>}:next     the waiter a free lock is reserved for, PX = its claim window
//! <prefix>wake:<instance>   pub/sub channel of one backend instance (not a key)
//! <prefix>evict             pub/sub channel announcing forced releases to holders
//! ```
//!
//! In the name, `%`, `{` and `}` are percent-encoded (`%25`, `%7B`, `%7D`)
//! and nothing else is touched. That encoding is injective, and it keeps
//! braces out of the hash tag, so the tag is exactly the encoded name: all
//! keys of a name always land in the same Redis Cluster slot, and two names
//! never share a key. Glob characters (`* ? [ ] \`) are plain data: the
//! adapter never uses `KEYS` or `SCAN MATCH`.

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

/// The store keys of one lock name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    /// Holds `"<owner>:<fence>"` with the lease's TTL.
    pub(crate) lock: String,
    /// The name's fence counter.
    pub(crate) fence: String,
    /// The waiters in line, by arrival.
    pub(crate) queue: String,
    /// The waiter a free lock is reserved for.
    pub(crate) next: String,
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
        Self::of_lock(lock)
    }

    /// The keys that go with lock key `lock`.
    fn of_lock(lock: String) -> Self {
        Keys {
            fence: format!("{lock}:fence"),
            queue: format!("{lock}:queue"),
            next: format!("{lock}:next"),
            lock,
        }
    }

    /// The keys of the lock key a wake-up message names, if it is one of
    /// ours: `<prefix>{...}` with nothing after the tag.
    pub(crate) fn from_lock_key(prefix: &str, lock: &str) -> Option<Self> {
        let tag = lock
            .strip_prefix(prefix)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        (!tag.is_empty() && !tag.contains(['{', '}'])).then(|| Self::of_lock(lock.to_owned()))
    }
}

/// The channel forced releases announce evictions on, for the holders.
pub(crate) fn evict_channel(prefix: &str) -> String {
    format!("{prefix}evict")
}

/// A fresh wake-up channel for one backend instance.
pub(crate) fn wake_channel(prefix: &str) -> String {
    format!("{prefix}wake:{}", lockcore::OwnerToken::new().encode())
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
            for other in [&k.fence, &k.queue, &k.next] {
                assert_eq!(hash_tag(&k.lock), hash_tag(other), "{name:?}");
            }
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
            "a:queue", "a}:queue", "a:next", "a}:next", "a", "A", "a ", "*", "?", "[a]", "\\",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let k = keys(name);
            for key in [&k.lock, &k.fence, &k.queue, &k.next] {
                assert!(seen.insert(key.clone()), "{name:?}: {key} collides");
            }
        }
    }

    #[test]
    fn keys_look_as_documented() {
        let k = keys("orders/{42}");
        assert_eq!(k.lock, "distlock:{orders/%7B42%7D}");
        assert_eq!(k.fence, "distlock:{orders/%7B42%7D}:fence");
        assert_eq!(k.queue, "distlock:{orders/%7B42%7D}:queue");
        assert_eq!(k.next, "distlock:{orders/%7B42%7D}:next");
        assert_eq!(
            Keys::from_lock_key(DEFAULT_PREFIX, &k.lock),
            Some(k.clone())
        );
        for foreign in [
            "distlock:{a}:fence",
            "other:{a}",
            "distlock:a",
            "distlock:{}",
            "distlock:{a}b}",
            &k.fence,
        ] {
            assert_eq!(
                Keys::from_lock_key(DEFAULT_PREFIX, foreign),
                None,
                "{foreign}"
            );
        }
        let channel = wake_channel(DEFAULT_PREFIX);
        assert!(channel.starts_with("distlock:wake:") && !channel.contains(' '));
        assert_ne!(channel, wake_channel(DEFAULT_PREFIX));
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
