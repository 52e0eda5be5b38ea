//! Where things live in the lock file: the tables, their columns, the
//! stamp that marks a file as distlock's, the schema and its upgrades, and
//! the namespaces (locks, semaphore slots, reader-writer holders and
//! writers' intents) of the lease table.

use lockcore::Lease;

/// Locks, semaphores and reader-writer locks live in separate namespaces
/// of one table: the `kind` column. A writer waiting for a reader-writer
/// lock leaves a row of its own there too (`Intent`), judged and removed
/// as a lease is, but never handed out as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lock,
    Permit,
    /// A reader or the writer of a reader-writer lock.
    Rw,
    /// A writer waiting for a reader-writer lock.
    Intent,
}

impl Kind {
    /// The `kind` column's value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Permit => "permit",
            Kind::Rw => "rw",
            Kind::Intent => "intent",
        }
    }

    /// The namespace of `lease`'s grant: an access means a reader-writer
    /// lock, a slot a semaphore.
    pub(crate) fn of(lease: &Lease) -> Kind {
        match (lease.access(), lease.slot()) {
            (Some(_), _) => Kind::Rw,
            (None, Some(_)) => Kind::Permit,
            (None, None) => Kind::Lock,
        }
    }

    /// The `slot` column of a row of this kind: a permit's slot, 0 for a
    /// lock, and for the rows a name has any number of (reader-writer
    /// holders, intents) their own fence, which no other row has.
    pub(crate) fn row_slot(self, slot: Option<u32>, fence: u64) -> i64 {
        match self {
            Kind::Lock | Kind::Permit => i64::from(slot.unwrap_or(0)),
            Kind::Rw | Kind::Intent => i64::try_from(fence).unwrap_or(i64::MAX),
        }
    }
}

/// The `slot` column of `lease`'s row.
pub(crate) fn slot_of(lease: &Lease) -> i64 {
    Kind::of(lease).row_slot(lease.slot(), lease.fence().get())
}

/// `PRAGMA application_id` of a distlock lock file ("DLK1"): how a file is
/// known to be ours before anything is written to it.
pub(crate) const APPLICATION_ID: i64 = 0x444C_4B31;

/// `PRAGMA user_version`: the schema version.
pub(crate) const SCHEMA_VERSION: i64 = 2;

/// Marks the file as a distlock lock file of this schema version
/// (`APPLICATION_ID`, `SCHEMA_VERSION`).
pub(crate) const STAMP: &[&str] = &[
    "PRAGMA application_id = 1145850673",
    "PRAGMA user_version = 2",
];

/// Creates the tables of schema 1 in an empty database (inside `BEGIN
/// IMMEDIATE`); [`UPGRADES`] then bring them to [`SCHEMA_VERSION`], so a
/// new file and an upgraded one have the very same schema.
///
/// - `distlock_fence`: the one fence counter of the file; every grant of
///   every name and slot takes the next value, so fences never repeat and
///   never go back, and nothing needs remembering once a name is free.
/// - `distlock_leases`: one row per held lock or permit slot (and from
///   schema 2, per reader-writer holder and waiting writer). Expiry is
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

/// The statements that bring a file of schema `n + 1` to `n + 2`
/// (`UPGRADES[n]`), run in one `BEGIN IMMEDIATE` transaction with the
/// [`STAMP`]. Clients of an older schema already connected go on working
/// (every statement names its columns); one connecting later is refused.
///
/// Schema 2, reader-writer locks: `distlock_leases` also keeps `kind =
/// 'rw'` (a reader or the writer, `access` says which; `slot` is its fence)
/// and `kind = 'intent'` (a waiting writer; `slot` and `fence` are a fence
/// taken from the counter for it, which names its presence file). SQLite
/// cannot change a CHECK in place: the table is rebuilt, rows kept.
pub(crate) const UPGRADES: &[&[&str]] = &[&[
    "CREATE TABLE distlock_leases_2 (
        kind         TEXT    NOT NULL CHECK (kind IN ('lock', 'permit', 'rw', 'intent')),
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
        access       TEXT    CHECK (CASE WHEN kind = 'rw'
            THEN coalesce(access IN ('read', 'write'), 0) ELSE access IS NULL END),
        PRIMARY KEY (kind, name, slot)
    ) WITHOUT ROWID",
    "INSERT INTO distlock_leases_2
        (kind, name, slot, permits, owner, fence, label, boot_id, expires_at, presence_dev, presence_ino)
     SELECT kind, name, slot, permits, owner, fence, label, boot_id, expires_at, presence_dev, presence_ino
     FROM distlock_leases",
    "DROP TABLE distlock_leases",
    "ALTER TABLE distlock_leases_2 RENAME TO distlock_leases",
]];

#[cfg(test)]
mod tests {
    #[test]
    fn there_is_one_upgrade_per_version_after_the_first() {
        assert_eq!(super::UPGRADES.len() as i64, super::SCHEMA_VERSION - 1);
    }

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
