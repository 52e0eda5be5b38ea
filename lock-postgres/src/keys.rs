//! Where things live in the server: the lock tables, their sequence and
//! DDL (`schema.rs`), the validated identifiers they are named by
//! (`ident.rs`), and here how names map to what the server keys on besides
//! rows: NOTIFY channels and advisory-lock keys.
//!
//! Advisory keys are 64-bit hashes of the table and the name (FNV-1a, stable
//! across builds and platforms: every instance must queue on the same key).
//! Two names may share a key; that only makes their waiters share a line,
//! or wakes a waiter for nothing: a key never grants anything, the lease
//! row stays the only authority.

pub(crate) mod ident;
pub(crate) mod schema;

use ident::Ident;

/// The NOTIFY channel of a table: readable when it fits PostgreSQL's
/// 63-byte identifier limit, hashed otherwise. Two tables sharing a channel
/// would only cost spurious wake-ups.
pub(crate) fn channel(prefix: &str, schema: &Ident, table: &Ident) -> String {
    let readable = format!("{prefix}:{}.{}", schema.as_str(), table.as_str());
    if readable.len() <= Ident::MAX_BYTES {
        return readable;
    }
    format!("{prefix}:{:016x}", fnv1a(readable.as_bytes()))
}

/// The advisory-lock key of a name's turnstile (see `wait/turnstile.rs`): the
/// table and the name.
pub(crate) fn turnstile_key(table_regclass: &str, name: &str) -> i64 {
    key(&[table_regclass.as_bytes(), name.as_bytes()])
}

/// The wake-up topic of a lock name: the name itself, the payload of the
/// NOTIFY a release sends.
pub(crate) fn lock_topic(name: &str) -> String {
    name.to_owned()
}

/// The wake-up topic of a semaphore: its name after U+0001, which no lock
/// name contains (lock names have no control characters).
pub(crate) fn permits_topic(name: &str) -> String {
    format!("\u{1}{name}")
}

/// The advisory-lock key that serializes the permit grants of one
/// semaphore (held for one short transaction each).
pub(crate) fn permits_key(table_regclass: &str, name: &str) -> i64 {
    key(&[table_regclass.as_bytes(), name.as_bytes(), b"permits"])
}

/// The wake-up topic of a reader-writer lock: its name after U+0002.
pub(crate) fn rw_topic(name: &str) -> String {
    format!("\u{2}{name}")
}

/// Whether a notification of `topic` wakes every local waiter of it, not
/// one: a reader-writer lock's change may admit every waiting reader at
/// once (a lock or a slot admits one).
pub(crate) fn wakes_all(topic: &str) -> bool {
    topic.starts_with('\u{2}')
}

/// The advisory-lock key that serializes the grants of one reader-writer
/// lock (held for one short transaction each).
pub(crate) fn rw_key(table_regclass: &str, name: &str) -> i64 {
    key(&[table_regclass.as_bytes(), name.as_bytes(), b"rw"])
}

/// The advisory-lock key a waiter's listener holds (shared) while it waits
/// for `topic`: a release takes it exclusively (`pg_try_advisory_xact_lock`)
/// and notifies only when that fails, i.e. when somebody waits.
pub(crate) fn watch_key(table_regclass: &str, topic: &str) -> i64 {
    key(&[table_regclass.as_bytes(), topic.as_bytes(), b"watch"])
}

/// Hashes `parts` joined by NUL bytes. No part contains NUL (table names
/// are identifiers, lock names have no control characters), so different
/// part lists never hash the same bytes.
fn key(parts: &[&[u8]]) -> i64 {
    let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            bytes.push(0);
        }
        bytes.extend_from_slice(part);
    }
    i64::from_le_bytes(fnv1a(&bytes).to_le_bytes())
}

/// FNV-1a: stable across builds and platforms, unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(s: &str) -> Ident {
        Ident::new("x", s, 63).unwrap()
    }

    #[test]
    fn channels_fit_identifiers() {
        let short = channel("distlock", &ident("public"), &ident("distlock_locks"));
        assert_eq!(short, "distlock:public.distlock_locks");
        for prefix in ["distlock", "distlock-evict"] {
            let long = channel(prefix, &ident(&"s".repeat(63)), &ident(&"t".repeat(53)));
            assert!(long.len() <= 63, "{long}");
            assert_ne!(
                long,
                channel(prefix, &ident(&"s".repeat(63)), &ident(&"u".repeat(53)))
            );
        }
    }

    #[test]
    fn turnstile_keys_are_stable_and_per_table() {
        let key = turnstile_key("\"public\".\"distlock_locks\"", "sku-42");
        assert_eq!(
            key,
            turnstile_key("\"public\".\"distlock_locks\"", "sku-42")
        );
        assert_ne!(
            key,
            turnstile_key("\"public\".\"distlock_locks\"", "sku-43")
        );
        assert_ne!(key, turnstile_key("\"public\".\"other\"", "sku-42"));
        // Pinned: every instance, whatever its build, must queue on one key.
        assert_eq!(
            turnstile_key("t", "n"),
            i64::from_le_bytes(fnv1a(b"t\0n").to_le_bytes())
        );
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(key, watch_key("\"public\".\"distlock_locks\"", "sku-42"));
        assert_ne!(key, permits_key("\"public\".\"distlock_locks\"", "sku-42"));
        assert_ne!(
            permits_key("\"public\".\"distlock_locks\"", "sku-42"),
            rw_key("\"public\".\"distlock_locks\"", "sku-42")
        );
        assert_ne!(
            watch_key("t", &lock_topic("n")),
            watch_key("t", &permits_topic("n"))
        );
        assert_ne!(
            watch_key("t", &rw_topic("n")),
            watch_key("t", &permits_topic("n"))
        );
        assert!(wakes_all(&rw_topic("n")));
        assert!(!wakes_all(&lock_topic("n")) && !wakes_all(&permits_topic("n")));
    }
}
