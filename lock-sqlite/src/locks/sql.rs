//! The statements of leases (locks, permit slots, reader-writer holders,
//! and writers' intents, which are judged and removed as leases are) and of
//! the sweep at connect. Names, owners and labels are only ever bind parameters; the
//! tables they read are in `keys.rs`.

/// Every row of one kind of one name (a lock, a semaphore, the holders or
/// the intents of a reader-writer lock).
pub(crate) const ROWS: &str = "
SELECT slot, permits, owner, fence, label, boot_id, expires_at, presence_dev, presence_ino, access
FROM distlock_leases WHERE kind = ?1 AND name = ?2 ORDER BY slot";

/// Grants a slot (replacing an expired or dead holder's row).
pub(crate) const GRANT: &str = "
INSERT OR REPLACE INTO distlock_leases
    (kind, name, slot, permits, owner, fence, label, boot_id, expires_at, presence_dev, presence_ino,
     access)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

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

/// Rows of an earlier boot or past their expiry, for the sweep at connect.
pub(crate) const STALE: &str =
    "SELECT kind, name, slot, fence FROM distlock_leases WHERE boot_id != ?1 OR expires_at <= ?2";

/// Whether this owner still holds `fence` (for checking an eviction notice).
pub(crate) const HOLDS: &str =
    "SELECT boot_id, expires_at FROM distlock_leases WHERE fence = ?1 AND owner = ?2";

/// The expiry of the row with this fence, if any (for releasing presence files).
pub(crate) const EXPIRY_OF: &str =
    "SELECT boot_id, expires_at FROM distlock_leases WHERE fence = ?1";

/// Sets the expiry of a lease still held by its owner and fence, in this
/// boot, unexpired, to exactly `?1`, and unlinks its presence file: from
/// here only that expiry (or a release, an eviction) frees it, not its
/// holder's death. Returns the new expiry when it was held.
pub(crate) const SET_REMAINING: &str = "
UPDATE distlock_leases SET expires_at = ?1, presence_dev = NULL, presence_ino = NULL
WHERE kind = ?2 AND name = ?3 AND slot = ?4 AND owner = ?5 AND fence = ?6
  AND boot_id = ?7 AND expires_at > ?8
RETURNING expires_at";
