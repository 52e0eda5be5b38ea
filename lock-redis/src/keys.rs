//! The key scheme: every lock name maps to its own keys, all under one
//! configurable prefix and one hash tag; each backend instance has one
//! wake-up channel.
//!
//! ```text
//! <prefix>{<name>}                   lock key: "<owner>:<fence> <label>", PX = TTL
//! <prefix>{<name>}:fence             fence counter (never expires)
//! <prefix>{<name>}:queue             waiters in line (zset), expires when nobody refreshes it
//! <prefix>{<name>}:next              the waiter a free lock is reserved for, PX = its claim window
//! <prefix>{<name>}:offers            waiters' standing offers (hash), expires with the line
//! <prefix>{<name>}:watchers          instances watching the lock (set), one-shot
//! <prefix>{<name>}:permits           semaphore: taken slot -> expiry in server ms (zset)
//! <prefix>{<name>}:permits:holders   semaphore: slot -> "<owner>:<fence> <label>", permits -> N
//! <prefix>{<name>}:permits:fence     semaphore fence counter (never expires)
//! <prefix>{<name>}:permits:watchers  instances watching the semaphore (set), one-shot
//! <prefix>{<name>}:rw                rw lock: holder "<access>:<owner>" -> expiry in server ms (zset)
//! <prefix>{<name>}:rw:holders        rw lock: holder -> "<owner>:<fence> <label>"
//! <prefix>{<name>}:rw:intents        rw lock: waiting writer's intent id -> expiry in server ms (zset)
//! <prefix>{<name>}:rw:fence          rw lock fence counter (never expires)
//! <prefix>{<name>}:rw:watchers       instances watching the rw lock (set), one-shot
//! <prefix>fence-floor:{<t>}          the fence floor of one Cluster slot (16384 of them, once raised)
//! <prefix>era:{<t>}                  the replication id one Cluster slot's grants came from (hash)
//! <prefix>wake:<instance>            pub/sub channel of one backend instance (not a key)
//! <prefix>evict                      pub/sub channel announcing forced releases to holders
//! ```
//!
//! In the name, `%`, `{` and `}` are percent-encoded (`%25`, `%7B`, `%7D`)
//! and nothing else is touched. That encoding is injective, and it keeps
//! braces out of the hash tag, so the tag is exactly the encoded name: all
//! keys of a name always land in the same Redis Cluster slot, and two names
//! never share a key. The fence floor and the era are kept per slot, under
//! a tag chosen to land in that slot, so each name's scripts read them
//! without leaving their slot. Glob characters (`* ? [ ] \`) are plain data: the adapter
//! never uses `KEYS` or `SCAN MATCH`.

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
    /// Holds `"<owner>:<fence> <label>"` with the lease's TTL.
    pub(crate) lock: String,
    /// The name's fence counter.
    pub(crate) fence: String,
    /// The waiters in line, by arrival.
    pub(crate) queue: String,
    /// The waiter a free lock is reserved for.
    pub(crate) next: String,
    /// The waiters' standing offers (`wait/scripts/handoff.lua`).
    pub(crate) offers: String,
    /// The instances watching the lock (`LockBackend::watch`).
    pub(crate) watchers: String,
    /// The fence floor of the name's Cluster slot.
    pub(crate) floor: String,
    /// The era of the name's Cluster slot.
    pub(crate) era: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        Self::of_lock(prefix, format!("{prefix}{{{}}}", tag(name)))
    }

    /// The keys that go with lock key `lock`.
    fn of_lock(prefix: &str, lock: String) -> Self {
        let tag = &lock[prefix.len() + 1..lock.len() - 1];
        Keys {
            fence: format!("{lock}:fence"),
            queue: format!("{lock}:queue"),
            next: format!("{lock}:next"),
            offers: format!("{lock}:offers"),
            watchers: format!("{lock}:watchers"),
            floor: floor_key(prefix, slot_of(tag)),
            era: era_key(prefix, slot_of(tag)),
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
        (!tag.is_empty() && !tag.contains(['{', '}']))
            .then(|| Self::of_lock(prefix, lock.to_owned()))
    }
}

/// The store keys of one semaphore: a namespace apart from the lock of the
/// same name, in the same hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PermitKeys {
    /// Sorted set: taken slot -> expiry (server time, ms).
    pub(crate) slots: String,
    /// Hash: slot -> `"<owner>:<fence> <label>"`, and `permits` -> N.
    pub(crate) holders: String,
    /// The semaphore's fence counter (one for all its slots).
    pub(crate) fence: String,
    /// The instances watching the semaphore (`watch_permits`).
    pub(crate) watchers: String,
    /// The fence floor of the name's Cluster slot.
    pub(crate) floor: String,
    /// The era of the name's Cluster slot.
    pub(crate) era: String,
}

impl PermitKeys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let tag = tag(name);
        let base = format!("{prefix}{{{tag}}}:permits");
        PermitKeys {
            holders: format!("{base}:holders"),
            fence: format!("{base}:fence"),
            watchers: format!("{base}:watchers"),
            floor: floor_key(prefix, slot_of(&tag)),
            era: era_key(prefix, slot_of(&tag)),
            slots: base,
        }
    }
}

/// The store keys of one reader-writer lock: a namespace apart from the
/// lock and the semaphore of the same name, in the same hash tag, so one
/// script reaches them all on a Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RwKeys {
    /// Sorted set: holder `"<access>:<owner>"` -> expiry (server time, ms).
    pub(crate) shares: String,
    /// Hash: holder -> `"<owner>:<fence> <label>"`.
    pub(crate) holders: String,
    /// Sorted set: a waiting writer's intent id -> expiry (server time, ms).
    pub(crate) intents: String,
    /// The reader-writer lock's fence counter (one for reads and writes).
    pub(crate) fence: String,
    /// The instances watching the reader-writer lock.
    pub(crate) watchers: String,
    /// The fence floor of the name's Cluster slot.
    pub(crate) floor: String,
    /// The era of the name's Cluster slot.
    pub(crate) era: String,
}

impl RwKeys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let tag = tag(name);
        let base = format!("{prefix}{{{tag}}}:rw");
        RwKeys {
            holders: format!("{base}:holders"),
            intents: format!("{base}:intents"),
            fence: format!("{base}:fence"),
            watchers: format!("{base}:watchers"),
            floor: floor_key(prefix, slot_of(&tag)),
            era: era_key(prefix, slot_of(&tag)),
            shares: base,
        }
    }
}

/// The hash tag of `name`: the name with `%`, `{` and `}` percent-encoded.
fn tag(name: &LockName) -> String {
    name.escaped(|c| c == '{' || c == '}')
}

/// Redis Cluster's slot count.
pub(crate) const SLOTS: u16 = 16384;

/// The Cluster slot of hash tag `tag` (CRC16/XMODEM of its bytes, mod 16384).
fn slot_of(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for byte in tag.bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// The fence floor key of Cluster slot `slot` (see [`slot_key`]).
pub(crate) fn floor_key(prefix: &str, slot: u16) -> String {
    slot_key(prefix, "fence-floor", slot)
}

/// The era key of Cluster slot `slot` (see [`slot_key`]).
pub(crate) fn era_key(prefix: &str, slot: u16) -> String {
    slot_key(prefix, "era", slot)
}

/// The key `<prefix><what>:{<t>}` of Cluster slot `slot`, where `<t>` is
/// the first lowercase-hex number whose slot is `slot`, so each name's
/// scripts read it from their own slot.
fn slot_key(prefix: &str, what: &str, slot: u16) -> String {
    static TAGS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = tags.len();
        for i in 0_u32.. {
            let tag = format!("{i:x}");
            let found = &mut tags[usize::from(slot_of(&tag))];
            if found.is_empty() {
                *found = tag;
                missing -= 1;
                if missing == 0 {
                    break;
                }
            }
        }
        tags
    });
    format!("{prefix}{what}:{{{}}}", TAGS[usize::from(slot % SLOTS)])
}

/// The channel forced releases announce evictions on, for the holders.
pub(crate) fn evict_channel(prefix: &str) -> String {
    format!("{prefix}evict")
}

/// A fresh wake-up channel for one backend instance.
pub(crate) fn wake_channel(prefix: &str) -> String {
    format!("{prefix}wake:{}", lockcore::OwnerToken::new().encode())
}

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

/// The Cluster slot of store key `key`.
pub(crate) fn key_slot(key: &str) -> u16 {
    slot_of(hash_tag(key))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let p = PermitKeys::new(DEFAULT_PREFIX, &LockName::new(name).unwrap());
            let rw = RwKeys::new(DEFAULT_PREFIX, &LockName::new(name).unwrap());
            for other in [
                &k.fence,
                &k.queue,
                &k.next,
                &k.offers,
                &k.watchers,
                &p.slots,
                &p.holders,
                &p.fence,
                &p.watchers,
                &rw.shares,
                &rw.holders,
                &rw.intents,
                &rw.fence,
                &rw.watchers,
            ] {
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
            "a{b",
            "a%7Bb",
            "a%257Bb",
            "a}b",
            "a%7Db",
            "%",
            "%25",
            "%2525",
            "a:fence",
            "a}:fence",
            "a:queue",
            "a}:queue",
            "a:next",
            "a}:next",
            "a",
            "A",
            "a ",
            "*",
            "?",
            "[a]",
            "\\",
            "a:rw",
            "a}:rw",
            "a:permits",
            "a}:permits",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let k = keys(name);
            let p = PermitKeys::new(DEFAULT_PREFIX, &LockName::new(name).unwrap());
            let rw = RwKeys::new(DEFAULT_PREFIX, &LockName::new(name).unwrap());
            for key in [
                &k.lock,
                &k.fence,
                &k.queue,
                &k.next,
                &k.offers,
                &k.watchers,
                &p.slots,
                &p.holders,
                &p.fence,
                &p.watchers,
                &rw.shares,
                &rw.holders,
                &rw.intents,
                &rw.fence,
                &rw.watchers,
            ] {
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
        assert_eq!(k.watchers, "distlock:{orders/%7B42%7D}:watchers");
        let rw = RwKeys::new(DEFAULT_PREFIX, &LockName::new("orders/{42}").unwrap());
        assert_eq!(rw.shares, "distlock:{orders/%7B42%7D}:rw");
        assert_eq!(rw.holders, "distlock:{orders/%7B42%7D}:rw:holders");
        assert_eq!(rw.intents, "distlock:{orders/%7B42%7D}:rw:intents");
        assert_eq!(rw.fence, "distlock:{orders/%7B42%7D}:rw:fence");
        assert_eq!(rw.watchers, "distlock:{orders/%7B42%7D}:rw:watchers");
        assert_eq!((&rw.floor, &rw.era), (&k.floor, &k.era));
        assert!(k.floor.starts_with("distlock:fence-floor:{"));
        assert_eq!(k.era, k.floor.replace("fence-floor:", "era:"));
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
    fn slots_match_redis_cluster_and_each_floor_key_lands_in_its_slot() {
        // Values from the Redis Cluster specification and CLUSTER KEYSLOT.
        assert_eq!(slot_of("123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("user1000"), 3443);
        let mut floors = std::collections::HashSet::new();
        for slot in 0..SLOTS {
            let key = floor_key("p:", slot);
            assert_eq!(slot_of(hash_tag(&key)), slot, "{key}");
            assert!(floors.insert(key));
        }
        for name in ["a", "orders/{42}", "ünï🔒"] {
            let k = keys(name);
            assert_eq!(
                slot_of(hash_tag(&k.floor)),
                slot_of(hash_tag(&k.lock)),
                "{name}"
            );
            assert_eq!(slot_of(hash_tag(&k.era)), slot_of(hash_tag(&k.lock)));
            let p = PermitKeys::new(DEFAULT_PREFIX, &LockName::new(name).unwrap());
            assert_eq!((&p.floor, &p.era), (&k.floor, &k.era), "{name}");
        }
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
