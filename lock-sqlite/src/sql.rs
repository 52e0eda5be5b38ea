//! The schema and every statement. Names, owners and labels are only ever
//! bind parameters.

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

/// Every row of one lock or semaphore.
pub(crate) const ROWS: &str = "
SELECT slot, permits, owner, fence, label, boot_id, expires_at, presence_dev, presence_ino
FROM distlock_leases WHERE kind = ?1 AND name = ?2 ORDER BY slot";

/// The next fence; no row once the counter is at `i64::MAX` (SQLite would
/// turn `last + 1` into a float).
pub(crate) const NEXT_FENCE: &str = "UPDATE distlock_fence SET last = last + 1 WHERE id = 1 AND last < 9223372036854775807 RETURNING last";

/// The last fence handed out (or the floor).
pub(crate) const LAST_FENCE: &str = "SELECT last FROM distlock_fence WHERE id = 1";

/// Grants a slot (replacing an expired or dead holder's row).
pub(crate) const GRANT: &str = "
INSERT OR REPLACE INTO distlock_leases
    (kind, name, slot, permits, owner, fence, label, boot_id, expires_at, presence_dev, presence_ino)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

/// Deletes the row of one slot whose holder is gone (expired or dead).
pub(crate) const DROP_SLOT: &str =
    "DELETE FROM distlock_leases WHERE kind = ?1 AND name = ?2 AND slot = ?3 AND fence = ?4";

/// Extends leases still held by their owner and fence, in this boot,
/// unexpired: `?1` is a JSON array of `[expires_at, kind, name, slot, owner,
/// fence]`, one per lease, each checked on its own row. Returns the fence
/// (unique per grant) and new expiry of each row renewed. One statement for
/// a batch, not one per lease: at 10,000 leases, statements (not rows) are
/// what a renewal costs.
pub(crate) const RENEW: &str = "
UPDATE distlock_leases AS l SET expires_at = r.value ->> 0
FROM json_each(?1) AS r
WHERE l.kind = r.value ->> 1 AND l.name = r.value ->> 2 AND l.slot = r.value ->> 3
  AND l.owner = r.value ->> 4 AND l.fence = r.value ->> 5
  AND l.boot_id = ?2 AND l.expires_at > ?3
RETURNING kind, name, slot, owner, fence, expires_at";

/// Deletes this owner's row of a slot; the caller judges whether it was live.
pub(crate) const RELEASE: &str = "
DELETE FROM distlock_leases
WHERE kind = ?1 AND name = ?2 AND slot = ?3 AND owner = ?4 AND fence = ?5
RETURNING boot_id, expires_at, presence_dev, presence_ino";

/// Raises the counter to at least `?1`.
pub(crate) const RAISE_FLOOR: &str = "UPDATE distlock_fence SET last = max(last, ?1) WHERE id = 1";

/// Rows of an earlier boot or past their expiry, for the sweep at connect.
pub(crate) const STALE: &str =
    "SELECT kind, name, slot, fence FROM distlock_leases WHERE boot_id != ?1 OR expires_at <= ?2";

/// Whether this owner still holds `fence` (for checking an eviction notice).
pub(crate) const HOLDS: &str =
    "SELECT boot_id, expires_at FROM distlock_leases WHERE fence = ?1 AND owner = ?2";

/// The expiry of the row with this fence, if any (for releasing presence files).
pub(crate) const EXPIRY_OF: &str =
    "SELECT boot_id, expires_at FROM distlock_leases WHERE fence = ?1";

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
