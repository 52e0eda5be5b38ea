//! Where things live in the lock file: the tables, their columns, the
//! stamp that marks a file as distlock's, and the two namespaces (locks and
//! semaphore slots) of the lease table.

use lockcore::Lease;

/// Locks and semaphores live in separate namespaces of one table: the
/// `kind` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lock,
    Permit,
}

impl Kind {
    /// The `kind` column's value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Permit => "permit",
        }
    }

    /// The namespace of `lease`'s grant: a slot means a semaphore.
    pub(crate) fn of(lease: &Lease) -> Kind {
        if lease.slot().is_some() {
            Kind::Permit
        } else {
            Kind::Lock
        }
    }
}

/// `PRAGMA application_id` of a distlock lock file ("DLK1"): how a file is
/// known to be ours before anything is written to it.
pub(crate) const APPLICATION_ID: i64 = 0x444C_4B31;

/// `PRAGMA user_version`: the schema version.
pub(crate) const SCHEMA_VERSION: i64 = 1;

/// Marks the file as a distlock lock file of this schema version
/// (`APPLICATION_ID`, `SCHEMA_VERSION`).
pub(crate) const STAMP: &[&str] = &[
    "PRAGMA application_id = 1145850673",
    "PRAGMA user_version = 1",
];

/// Creates the tables in an empty database (inside `BEGIN IMMEDIATE`).
///
/// - `distlock_fence`: the one fence counter of the file; every grant of
///   every name and slot takes the next value, so fences never repeat and
///   never go back, and nothing needs remembering once a name is free.
/// - `distlock_leases`: one row per held lock or permit slot. Expiry is
///   `expires_at`, nanoseconds of `CLOCK_BOOTTIME` of boot `boot_id`.
///   `presence_dev`/`presence_ino` name the holder's presence file (see
///   `presence.rs`), NULL when it has none.
pub(crate) const CREATE: &[&str] = &[
    "CREATE TABLE distlock_fence (
        id   INTEGER PRIMARY KEY CHECK (id = 1),
        last INTEGER NOT NULL CHECK (last >= 0)
    )",
    "INSERT INTO distlock_fence (id, last) VALUES (1, 0)",
    "CREATE TABLE distlock_leases (
        kind         TEXT    NOT NULL CHECK (kind IN ('lock', 'permit')),
        name         TEXT    NOT NULL,
        slot         INTEGER NOT NULL CHECK (slot >= 0),
        permits      INTEGER NOT NULL CHECK (permits >= 1),
        owner        TEXT    NOT NULL,
        fence        INTEGER NOT NULL UNIQUE CHECK (fence > 0),
        label        TEXT,
        boot_id      TEXT    NOT NULL,
        expires_at   INTEGER NOT NULL,
        presence_dev INTEGER,
        presence_ino INTEGER,
        PRIMARY KEY (kind, name, slot)
    ) WITHOUT ROWID",
];

#[cfg(test)]
mod tests {
    #[test]
    fn the_stamp_writes_the_constants() {
        assert_eq!(
            super::STAMP,
            [
                format!("PRAGMA application_id = {}", super::APPLICATION_ID),
                format!("PRAGMA user_version = {}", super::SCHEMA_VERSION),
            ]
        );
    }
}
