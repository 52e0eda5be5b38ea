//! The statements of reader-writer locks, on the holders table (`<table>_rw`,
//! one row per holder) and the writer intents table (`<table>_rw_intent`),
//! built once per backend from the quoted, qualified names. Renewing them
//! is part of the lock table's batch renewal (`locks/sql.rs`), as are the
//! fence floor's lock and `purge_free`.

use crate::locks::sql::{RELEASE_COMMITS_ASYNC, REMAINING_US, notifying};

/// The statements of one lock table's reader-writer locks.
#[derive(Debug)]
pub(crate) struct RwSql {
    /// `$1` name, `$2` owner, `$3` access (`read`/`write`), `$4` TTL µs,
    /// `$5` label, `$6` the waiting writer's intent (`NULL`: none) → one row
    /// `(fence, remaining_us)`: the fence when granted, else the time until
    /// the first of what keeps this request out may end. Run under the
    /// name's advisory lock (`keys::rw_key`) in a transaction of its own,
    /// so the statement's snapshot, taken after the lock, sees every grant
    /// and intent before it.
    pub(crate) take: String,
    /// `$1` name, `$2` owner, `$3` fence, `$4` channel, `$5` payload, `$6`
    /// watch key → released count.
    pub(crate) release: String,
    /// `$1` name, `$2` owner, `$3` channel, `$4` payload, `$5` watch key →
    /// freed count: removes the grant of an acquire whose reply was lost
    /// (the owner token is unique to that one attempt).
    pub(crate) forget: String,
    /// `$1` name, `$2` intent, `$3` channel, `$4` payload, `$5` watch key →
    /// removed count: a writer that stopped waiting leaves its intent.
    pub(crate) leave: String,
    /// `$1` name → `(owner, access, fence, remaining_us, label)` of each
    /// live holder, by fence.
    pub(crate) inspect: String,
}

impl RwSql {
    /// `rw` and `intents` are the quoted, qualified tables; `nextval` draws
    /// a fence from the lock table's sequence.
    pub(crate) fn new(rw: &str, intents: &str, nextval: &str) -> RwSql {
        let ttl = "clock_timestamp() + $4 * interval '1 microsecond'";
        // One look (the statement's snapshot) at the holders this request
        // depends on (a read: the writers; a write: everyone) and at the
        // other writers' live intents, then one of two exclusive paths:
        // - kept out (a live one among them, or for a read a live intent):
        //   nothing of the holders is written; a waiting writer leaves (or
        //   refreshes) its intent, expiring with its TTL;
        // - admitted: those holders are row-locked and judged again on
        //   their latest versions (renewals do not take the advisory lock:
        //   one that found its lease live but commits after the snapshot
        //   is waited for and seen, never taken for an expiry); still none
        //   live, expired holders are swept, the grant inserted with a
        //   fence from the sequence, and the writer's own intent removed.
        // Expired intents of others are swept either way. Grants of one
        // name never run at once (the advisory lock), so no contender can
        // slip in between the look and the insert.
        let take = format!(
            "WITH seen AS (
                SELECT expires_at FROM {rw}
                 WHERE name = $1 AND ($3 = 'write' OR access = 'write')
            ), waiting AS (
                SELECT expires_at FROM {intents}
                 WHERE name = $1 AND intent IS DISTINCT FROM $6
                   AND expires_at > clock_timestamp()
            ), free AS (
                SELECT NOT EXISTS (SELECT 1 FROM seen WHERE expires_at > clock_timestamp())
                       AND ($3 = 'write' OR NOT EXISTS (SELECT 1 FROM waiting)) AS yes
            ), confirmed AS (
                SELECT expires_at FROM {rw}
                 WHERE name = $1 AND ($3 = 'write' OR access = 'write') AND (SELECT yes FROM free)
                   FOR UPDATE
            ), admit AS (
                SELECT (SELECT yes FROM free)
                       AND NOT EXISTS (SELECT 1 FROM confirmed WHERE expires_at > clock_timestamp())
                       AS ok
            ), swept AS (
                DELETE FROM {rw}
                 WHERE name = $1 AND expires_at <= clock_timestamp() AND (SELECT ok FROM admit)
            ), taken AS (
                INSERT INTO {rw} (name, owner, access, fence, expires_at, updated_at, label)
                SELECT $1, $2, $3, {nextval}, {ttl}, clock_timestamp(), $5
                  FROM admit WHERE ok
                RETURNING fence
            ), left_line AS (
                DELETE FROM {intents}
                 WHERE name = $1
                   AND (intent = $6 AND (SELECT ok FROM admit)
                        OR intent IS DISTINCT FROM $6 AND expires_at <= clock_timestamp())
            ), intent AS (
                INSERT INTO {intents} AS i (name, intent, expires_at)
                SELECT $1, $6, {ttl} FROM admit WHERE NOT ok AND $6 IS NOT NULL
                ON CONFLICT (name, intent) DO UPDATE SET expires_at = EXCLUDED.expires_at
            )
            SELECT (SELECT fence FROM taken),
                   (SELECT CASE WHEN count(*) > 0 THEN GREATEST(
                               (extract(epoch FROM (min(at) - clock_timestamp())) * 1000000)::bigint,
                               1) END
                      FROM (SELECT expires_at AS at FROM seen UNION ALL SELECT expires_at FROM confirmed
                            UNION ALL SELECT expires_at FROM waiting WHERE $3 = 'read') blockers
                     WHERE at > clock_timestamp())"
        );
        // Releases delete the row: a share is one grant, never taken over,
        // and the fence lives in the sequence.
        let release = notifying(
            &format!(
                "DELETE FROM {rw}
                  WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()
                        {RELEASE_COMMITS_ASYNC}
                 RETURNING name"
            ),
            ("$4", "$5", "$6"),
        );
        let forget = notifying(
            &format!(
                "DELETE FROM {rw} WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()
                 RETURNING name"
            ),
            ("$3", "$4", "$5"),
        );
        let leave = notifying(
            &format!("DELETE FROM {intents} WHERE name = $1 AND intent = $2 RETURNING name"),
            ("$3", "$4", "$5"),
        );
        let inspect = format!(
            "SELECT owner, access, fence, {REMAINING_US}, label FROM {rw}
              WHERE name = $1 AND expires_at > clock_timestamp() ORDER BY fence"
        );
        RwSql {
            take,
            release,
            forget,
            leave,
            inspect,
        }
    }
}
