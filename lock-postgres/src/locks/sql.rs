//! Every SQL statement the backend runs, built once per backend from the
//! validated, quoted identifiers. Lock names, owners, fences and TTLs are
//! always bind parameters.
//!
//! It lives with the locks, whose statements are most of it, and holds the
//! permits' and the fence floor's statements too, and the reader-writer
//! locks' (`rw/sql.rs`): one set, built once.
//!
//! Expiry is judged with `clock_timestamp()` (the server's clock at the
//! moment the row is examined), never `now()` (the transaction start) and
//! never the client's clock. Released rows are kept with `owner = NULL` and
//! `expires_at = '-infinity'`, so a name's row (and its last fence) outlives
//! its holders; fences come from one sequence that is never reset.

use crate::keys;
use crate::keys::ident::Ident;
use crate::keys::schema::Ddl;
use crate::rw::sql::RwSql;

/// Remaining lease time in whole microseconds, at least 1 (the row was
/// live when selected; a later clock read must not make it look free).
/// Released rows (`-infinity`) are guarded: PostgreSQL cannot subtract
/// infinite timestamps.
pub(crate) const REMAINING_US: &str = "CASE WHEN expires_at = '-infinity' THEN 1
    ELSE GREATEST((extract(epoch FROM (expires_at - clock_timestamp())) * 1000000)::bigint, 1) END";

/// The last condition of a release's `UPDATE` (or `DELETE`): the release's
/// transaction commits without waiting for its WAL flush
/// (`synchronous_commit = off` for that transaction alone). Nothing rests
/// on a release being durable: it draws no fence, and a release lost in a
/// crash of the server leaves the lease to expire, as a lost reply or a
/// crashed holder does. Every grant still commits durably, and WAL is
/// flushed in order, so the grant that follows a release (the next
/// waiter's) makes both durable with one flush: a hand-off costs one.
pub(crate) const RELEASE_COMMITS_ASYNC: &str =
    "AND set_config('synchronous_commit', 'off', true) IS NOT NULL";

/// The label of the row's grant (`NULL` when written for another grant).
const LABEL: &str = "CASE WHEN label_owner = owner THEN label END";

/// `changed` (a data-modifying statement returning a row per change) in
/// a statement that counts the changes and notifies waiters of them, only
/// when some wait: a waiter's listener holds the topic's watch key shared,
/// so taking it here fails. Taken, it is held to this statement's commit,
/// so a waiter that registers meanwhile waits for the commit and then sees
/// the change. (Every NOTIFY serializes its transaction's commit with all
/// other notifying commits of the server.) `(channel, payload, key)` are
/// the SQL expressions of the channel, the payload and the watch key.
pub(crate) fn notifying(changed: &str, notify: (&str, &str, &str)) -> String {
    notifying_after("", changed, notify, "")
}

/// [`notifying`], with the common table expressions `before` (each
/// `name AS (...), `) ahead of the change, and `also` (`, expression`)
/// after the count.
fn notifying_after(
    before: &str,
    changed: &str,
    (channel, payload, key): (&str, &str, &str),
    also: &str,
) -> String {
    format!(
        "WITH {before}changed AS (
            {changed}
        )
        SELECT count(*){also} FROM (
            SELECT CASE WHEN pg_try_advisory_xact_lock({key}) THEN NULL
                        ELSE pg_notify({channel}, {payload}) END
              FROM changed
        ) notified"
    )
}

/// The common table expression `pass` (column `passed`), which passes the
/// turnstile `key` this session holds on at the commit of the statement's
/// transaction, not before: the transaction takes the key too (granted at
/// once to the session already holding it), then the session lets go of
/// its own hold. The next waiter's `pg_advisory_lock` returns once the
/// transaction's locks go, after its commit is flushed and visible.
/// `passed` is false (the turnstile left as it was) if the session did not
/// hold it.
fn passing_turnstile(key: &str) -> String {
    format!(
        "pass AS (
            SELECT CASE WHEN pg_try_advisory_xact_lock({key}) THEN pg_advisory_unlock({key})
                        ELSE false END AS passed
        ), "
    )
}

/// Starts every transaction this crate opens: READ COMMITTED whatever the
/// server's default, so each statement sees what committed before it began.
/// Under REPEATABLE READ or SERIALIZABLE a release in a long turnstile
/// transaction would judge the lease on that transaction's first snapshot
/// (and miss it), and contended acquires would fail to serialize.
pub(crate) const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// `BEGIN` and the transaction-scoped advisory lock `key` in one round
/// trip: grants of one semaphore or reader-writer lock take their name's
/// key, so each one's snapshot, taken after the lock, sees every grant
/// before it. (`key` is an integer, safe to inline.)
pub(crate) fn begin_locked(key: i64) -> String {
    format!("{BEGIN}; SELECT pg_advisory_xact_lock({key})")
}

/// Run on every session the backend opens, for its single statements.
pub(crate) const PIN_ISOLATION: &str = "SET default_transaction_isolation = 'read committed'";

/// The statements of one lock table.
#[derive(Debug)]
pub(crate) struct Sql {
    /// `$1` name, `$2` owner, `$3` TTL µs, `$4` minimum time free in µs
    /// (0: any free row), `$5` gated, `$6` turnstile key, `$7` label → `(fence,
    /// remaining_us)`: `(Some, None)` acquired; `(None, Some)` held; no
    /// row: held by a grant this statement's snapshot cannot see yet, free
    /// for less than `$4`, or (gated) free with waiters in line.
    pub(crate) acquire: String,
    /// Creates, in a turnstile session, `pg_temp.distlock_turn`: its
    /// parameters are `acquire`'s, and it queues for the turnstile `$6`
    /// (`pg_advisory_lock`), then runs `acquire` at once, on a snapshot
    /// taken after its turn came (each statement of a volatile function
    /// takes its own). Temporary: the session's own, gone with it, and no
    /// schema change.
    pub(crate) turn_function: String,
    /// `$1` name, `$2` owner, `$3` TTL µs, `$4` turnstile key, `$5` label
    /// → `acquire`'s rows, once the turn came: `distlock_turn` for any
    /// free row.
    pub(crate) turn: &'static str,
    /// `$1` names (array) → `(name, remaining_us)` of the live holder among
    /// them that expires last, if any: a multi-lock's look before it
    /// writes anything.
    pub(crate) held: String,
    /// `$1` names, `$2` owners, `$3` fences, `$4` TTLs µs, `$5` slots
    /// (`NULL` but for a permit), `$6` whether a reader-writer share
    /// (arrays) → the 1-based positions of the leases renewed.
    pub(crate) renew_many: String,
    /// `$1` name, `$2` owner, `$3` fence, `$4` channel, `$5` watch key →
    /// released count.
    pub(crate) release: String,
    /// `release` on the connection of the turnstile the lease kept, `$6`
    /// its key → `(released count, passed)`: the turnstile passes on at
    /// the release's commit, with no statement after it.
    pub(crate) release_passing: String,
    /// `$1` name, `$2` owner, `$3` channel, `$4` watch key → freed count: frees a grant
    /// whose fence is unknown (an acquire whose reply was lost); the owner
    /// token is unique to that one attempt.
    pub(crate) forget: String,
    /// `$1` names, `$2` owners, `$3` fences (arrays) → the owners of those
    /// grants that are no longer live.
    pub(crate) gone: String,
    /// `$1` name → `(fence, owner, remaining_us, label)` of a live holder.
    pub(crate) inspect: String,
    /// `$1` name → the live holder, row-locked until commit.
    pub(crate) force_select: String,
    /// `$1` name: free the row and move its fence past the evicted grant.
    pub(crate) force_free: String,
    /// `$1` age in µs → rows deleted: rows free for at least that long.
    pub(crate) purge_free: String,
    /// `$1` name, `$2` owner, `$3` permits, `$4` TTL µs, `$5` label → one
    /// row `(slot, fence, existing, remaining_us)`: a slot and fence when
    /// granted; else `existing`, the count the holders agreed on when it is
    /// not `$3`; else the time until the first holder's expiry. Run under
    /// the semaphore's advisory lock (`keys::permits_key`), in a
    /// transaction of its own: this statement's snapshot, taken after the
    /// lock, sees every grant before it.
    pub(crate) permit_take: String,
    /// `$1` name, `$2` slot, `$3` owner, `$4` fence, `$5` channel, `$6`
    /// payload, `$7` watch key → released count.
    pub(crate) permit_release: String,
    /// `$1` name, `$2` owner, `$3` channel, `$4` payload, `$5` watch key →
    /// freed count: frees the slot of a permit acquire whose reply was lost
    /// (the owner token is unique to that one attempt).
    pub(crate) permit_forget: String,
    /// `$1` name → `(slot, fence, owner, remaining_us, label)` of each live
    /// holder, by slot.
    pub(crate) permit_inspect: String,
    /// Locks the tables of grants against them (every `nextval` runs in a
    /// statement writing one of them: locks, permits, reader-writer
    /// holders) until the transaction commits; reads go on.
    pub(crate) lock_grants: String,
    /// `$1` floor: moves the sequence to at least the floor (`nextval`,
    /// then `setval` to the larger), under `lock_grants`.
    pub(crate) floor: String,
    /// `$1` channel, `$2` payload.
    pub(crate) notify: &'static str,
    /// The NOTIFY channel of this table (payload: a freed name).
    pub(crate) channel: String,
    /// The NOTIFY channel of evictions (payload: `fence owner name`).
    pub(crate) evict_channel: String,
    /// `"schema"."table"`, as text for `to_regclass` and keys.
    pub(crate) table: String,
    /// Reader-writer locks' statements (`rw/sql.rs`).
    pub(crate) rw: RwSql,
}

impl Sql {
    /// The statements of `schema.table`, whose objects `ddl` names.
    pub(crate) fn new(schema: &Ident, table: &Ident, ddl: &Ddl) -> Sql {
        let (t, seq, p, rw) = (&ddl.table, &ddl.sequence, &ddl.permits, &ddl.rw);
        // `seq` holds only identifier characters and double quotes, so it
        // is safe inside a single-quoted literal.
        let nextval = format!("nextval('{seq}'::regclass)");
        let ttl = "$3 * interval '1 microsecond'";
        // One statement, one look at the row (`cur`, the statement's
        // snapshot, judged live or not once), then one of two exclusive
        // paths:
        // - the row is live: report the holder's remaining time, write
        //   nothing (no row lock, no transaction id, so no WAL flush);
        // - free, expired or missing: `UPDATE` the row if it exists, under
        //   its row lock, if it is (still) free or expired, judged on the
        //   row's latest version (a renewal that commits meanwhile is seen);
        //   only when that updated nothing, `INSERT` it for a new name, `ON
        //   CONFLICT DO NOTHING`: of two first acquires of a name one inserts,
        //   the other finds the row and gets no grant. (An existing row the
        //   update did not take is found in the index, and nothing written;
        //   one a purge deleted meanwhile counts as missing.) A contender
        //   that loses either race gets no grant and leaves the row as is.
        // The update comes first because it is the common case and the
        // cheaper one: an `ON CONFLICT DO UPDATE` on an existing row locks
        // it (a WAL record) and then updates it (another); the plain `UPDATE`
        // writes one. Its fence (`nextval` in the `SET`) is drawn again when
        // the row lock waited for a newer version, so it is above every
        // fence that version carries.
        //
        // `$4` (µs, normally 0) asks for a row that has been free for at
        // least that long (released: since `updated_at`; expired: since
        // `expires_at`): a waiter stuck in the turnstile queue uses it to
        // take a lease nobody else is taking, without racing a live
        // attempter. With 0 the condition is skipped entirely, so a server
        // clock stepped backwards cannot delay an ordinary acquire.
        //
        // `$5` (the gate) makes a free lock go to whoever is in line first:
        // with it, the statement takes the row only if the name's turnstile
        // (`$6`, see `keys::turnstile_key`) is free, i.e. nobody waits in
        // line; a waiting `acquire` asks this way before queueing. (`go` is
        // read by both paths and evaluated once.)
        let acquire = format!(
            "WITH cur AS (
                SELECT expires_at, expires_at > clock_timestamp() AS live FROM {t} WHERE name = $1
            ), go AS (
                SELECT CASE
                         WHEN EXISTS (SELECT 1 FROM cur WHERE live) THEN false
                         WHEN $5 THEN pg_try_advisory_xact_lock($6)
                         ELSE true
                       END AS ok
            ), updated AS (
                UPDATE {t} AS l
                   SET owner = $2, fence = {nextval}, expires_at = clock_timestamp() + {ttl},
                       updated_at = clock_timestamp(), label = $7, label_owner = $2
                 WHERE l.name = $1 AND (SELECT ok FROM go)
                   AND l.expires_at <= clock_timestamp()
                   AND ($4 = 0 OR CASE WHEN l.expires_at = '-infinity' THEN l.updated_at
                                       ELSE l.expires_at END
                                  <= clock_timestamp() - $4 * interval '1 microsecond')
                RETURNING l.fence
            ), inserted AS (
                INSERT INTO {t} (name, owner, fence, expires_at, updated_at, label, label_owner)
                SELECT $1, $2, {nextval}, clock_timestamp() + {ttl}, clock_timestamp(), $7, $2
                 WHERE (SELECT ok FROM go) AND NOT EXISTS (SELECT 1 FROM updated)
                ON CONFLICT (name) DO NOTHING
                RETURNING fence
            )
            SELECT fence, NULL::bigint AS remaining_us FROM updated
            UNION ALL
            SELECT fence, NULL FROM inserted
            UNION ALL
            SELECT NULL, {REMAINING_US} FROM cur WHERE live"
        );
        // `$distlock$` cannot occur in the statement: identifiers are
        // letters, digits and underscores.
        let turn_function = format!(
            "CREATE OR REPLACE FUNCTION pg_temp.distlock_turn(
                 text, uuid, bigint, bigint, boolean, bigint, text)
             RETURNS TABLE (fence bigint, remaining_us bigint)
             LANGUAGE plpgsql VOLATILE AS $distlock$
             #variable_conflict use_column
             BEGIN
                 PERFORM pg_advisory_lock($6);
                 RETURN QUERY {acquire};
             END
             $distlock$"
        );
        // The one expiring last: the time before which not all are free.
        let held = format!(
            "SELECT name, {REMAINING_US} FROM {t}
              WHERE name = ANY($1::text[]) AND expires_at > clock_timestamp()
              ORDER BY expires_at DESC LIMIT 1"
        );
        // Each lease is owner-, fence- and liveness-checked on its own row,
        // in one statement for the whole batch.
        let renew_many = format!(
            "WITH r AS (
                SELECT * FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::bigint[], $5::int4[],
                                     $6::bool[])
                       WITH ORDINALITY AS r(name, owner, fence, ttl_us, slot, rw, i)
            ), locks AS (
                UPDATE {t} AS l
                   SET expires_at = clock_timestamp() + r.ttl_us * interval '1 microsecond',
                       updated_at = clock_timestamp()
                  FROM r
                 WHERE r.slot IS NULL AND NOT r.rw AND l.name = r.name AND l.owner = r.owner
                   AND l.fence = r.fence AND l.expires_at > clock_timestamp()
                RETURNING r.i
            ), permits AS (
                UPDATE {p} AS q
                   SET expires_at = clock_timestamp() + r.ttl_us * interval '1 microsecond',
                       updated_at = clock_timestamp()
                  FROM r
                 WHERE r.slot IS NOT NULL AND q.name = r.name AND q.slot = r.slot
                   AND q.owner = r.owner AND q.fence = r.fence
                   AND q.expires_at > clock_timestamp()
                RETURNING r.i
            ), shares AS (
                UPDATE {rw} AS w
                   SET expires_at = clock_timestamp() + r.ttl_us * interval '1 microsecond',
                       updated_at = clock_timestamp()
                  FROM r
                 WHERE r.rw AND w.name = r.name AND w.owner = r.owner AND w.fence = r.fence
                   AND w.expires_at > clock_timestamp()
                RETURNING r.i
            )
            SELECT i FROM locks UNION ALL SELECT i FROM permits UNION ALL SELECT i FROM shares"
        );
        // Releases notify only when somebody waits (see `notifying`).
        let freed = |after: &str| {
            format!(
                "UPDATE {t}
                    SET owner = NULL, expires_at = '-infinity', updated_at = clock_timestamp()
                  WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()
                        {after} {RELEASE_COMMITS_ASYNC}
                 RETURNING name"
            )
        };
        let release = notifying(&freed(""), ("$4", "name", "$5"));
        // The turnstile is passed before the row is touched (the update
        // waits for `pass`), so a release that waits for the row lock
        // shows that the next waiter still waits for its commit.
        let release_passing = notifying_after(
            &passing_turnstile("$6"),
            &freed("AND (SELECT passed FROM pass) IS NOT NULL"),
            ("$4", "name", "$5"),
            ", (SELECT passed FROM pass)",
        );
        let forget = notifying(
            &format!(
                "UPDATE {t}
                    SET owner = NULL, expires_at = '-infinity', updated_at = clock_timestamp()
                  WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()
                 RETURNING name"
            ),
            ("$3", "name", "$4"),
        );
        let gone = format!(
            "SELECT r.owner FROM unnest($1::text[], $2::uuid[], $3::bigint[]) AS r(name, owner, fence)
              WHERE NOT EXISTS (
                SELECT 1 FROM {t} l
                 WHERE l.name = r.name AND l.owner = r.owner AND l.fence = r.fence
                   AND l.expires_at > clock_timestamp())"
        );
        // A label is shown only with the grant that wrote it: a version
        // without labels takes rows without touching them.
        let inspect = format!(
            "SELECT fence, owner, {REMAINING_US}, {LABEL} FROM {t}
              WHERE name = $1 AND expires_at > clock_timestamp()"
        );
        let force_select = format!(
            "SELECT fence, owner, {REMAINING_US}, {LABEL} FROM {t}
              WHERE name = $1 AND expires_at > clock_timestamp() FOR UPDATE"
        );
        let force_free = format!(
            "UPDATE {t}
                SET owner = NULL, expires_at = '-infinity', fence = {nextval},
                    updated_at = clock_timestamp()
              WHERE name = $1"
        );
        // Reader-writer holders and intents are deleted when they end;
        // what is left expired (a crashed holder, a dead writer). Lock rows
        // a grant has locked are left for the next purge: a multi-lock's
        // transaction locks its rows in name order, and a purge waiting for
        // one while holding another could deadlock with it.
        let ri = &ddl.rw_intent;
        let purge_free = format!(
            "WITH locks AS (
                DELETE FROM {t} WHERE name IN (
                    SELECT name FROM {t} WHERE expires_at <= clock_timestamp()
                       AND updated_at < clock_timestamp() - $1 * interval '1 microsecond'
                       FOR UPDATE SKIP LOCKED)
                RETURNING 1
            ), permits AS (
                DELETE FROM {p} WHERE expires_at <= clock_timestamp()
                   AND updated_at < clock_timestamp() - $1 * interval '1 microsecond'
                RETURNING 1
            ), shares AS (
                DELETE FROM {rw}
                 WHERE expires_at <= clock_timestamp() - $1 * interval '1 microsecond'
                RETURNING 1
            ), intents AS (
                DELETE FROM {ri}
                 WHERE expires_at <= clock_timestamp() - $1 * interval '1 microsecond'
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM locks) + (SELECT count(*) FROM permits)
                 + (SELECT count(*) FROM shares) + (SELECT count(*) FROM intents)"
        );
        // The lowest free slot below `$3`, unless a live holder agreed on
        // another count; a slot row is taken under its lock if it is (still)
        // free, judged on its latest version, or inserted.
        let permit_take = format!(
            "WITH live AS (
                SELECT slot, permits, expires_at FROM {p}
                 WHERE name = $1 AND expires_at > clock_timestamp()
            ), other AS (
                SELECT permits FROM live WHERE permits <> $3 LIMIT 1
            ), free AS (
                SELECT s AS slot FROM generate_series(0, $3 - 1) AS s
                 WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.slot = s)
                   AND NOT EXISTS (SELECT 1 FROM other)
                 ORDER BY s LIMIT 1
            ), taken AS (
                INSERT INTO {p} AS q (name, slot, permits, owner, fence, expires_at, updated_at, label)
                SELECT $1, slot, $3, $2, {nextval}, clock_timestamp() + $4 * interval '1 microsecond',
                       clock_timestamp(), $5
                  FROM free
                ON CONFLICT (name, slot) DO UPDATE
                   SET permits = EXCLUDED.permits, owner = EXCLUDED.owner, fence = EXCLUDED.fence,
                       expires_at = clock_timestamp() + $4 * interval '1 microsecond',
                       updated_at = clock_timestamp(), label = EXCLUDED.label
                 WHERE q.expires_at <= clock_timestamp()
                RETURNING q.slot, q.fence
            )
            SELECT (SELECT slot FROM taken), (SELECT fence FROM taken),
                   (SELECT permits FROM other),
                   (SELECT GREATEST((extract(epoch FROM (min(expires_at) - clock_timestamp()))
                                     * 1000000)::bigint, 1) FROM live)"
        );
        let permit_release = notifying(
            &format!(
                "UPDATE {p}
                    SET owner = NULL, expires_at = '-infinity', updated_at = clock_timestamp()
                  WHERE name = $1 AND slot = $2 AND owner = $3 AND fence = $4
                    AND expires_at > clock_timestamp() {RELEASE_COMMITS_ASYNC}
                 RETURNING name"
            ),
            ("$5", "$6", "$7"),
        );
        let permit_forget = notifying(
            &format!(
                "UPDATE {p}
                    SET owner = NULL, expires_at = '-infinity', updated_at = clock_timestamp()
                  WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()
                 RETURNING name"
            ),
            ("$3", "$4", "$5"),
        );
        let permit_inspect = format!(
            "SELECT slot, fence, owner, {REMAINING_US}, label FROM {p}
              WHERE name = $1 AND expires_at > clock_timestamp() ORDER BY slot"
        );
        let lock_grants = format!("LOCK TABLE {t}, {p}, {rw} IN EXCLUSIVE MODE");
        let floor =
            format!("SELECT setval('{seq}'::regclass, GREATEST($1, nextval('{seq}'::regclass)))");
        Sql {
            acquire,
            turn_function,
            turn: "SELECT fence, remaining_us FROM pg_temp.distlock_turn($1, $2, $3, 0, false, $4, $5)",
            held,
            renew_many,
            release,
            release_passing,
            forget,
            gone,
            inspect,
            force_select,
            force_free,
            purge_free,
            permit_take,
            permit_release,
            permit_forget,
            permit_inspect,
            lock_grants,
            floor,
            notify: "SELECT pg_notify($1, $2)",
            channel: keys::channel("distlock", schema, table),
            evict_channel: keys::channel("distlock-evict", schema, table),
            table: t.to_owned(),
            rw: RwSql::new(rw, &ddl.rw_intent, &nextval),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(s: &str) -> Ident {
        Ident::new("x", s, 63).unwrap()
    }

    #[test]
    fn identifiers_are_quoted_everywhere() {
        let (schema, table) = (ident("Sch"), ident("select"));
        let sql = Sql::new(
            &schema,
            &table,
            &Ddl::new(&schema, &table, &ident("select_fence_seq")),
        );
        for text in [
            &sql.acquire,
            &sql.held,
            &sql.renew_many,
            &sql.release,
            &sql.inspect,
            &sql.force_free,
        ] {
            assert!(text.contains("\"Sch\".\"select\""), "{text}");
        }
        for text in [&sql.rw.take, &sql.rw.release, &sql.lock_grants] {
            assert!(text.contains("\"Sch\".\"select_rw\""), "{text}");
        }
        assert!(sql.rw.take.contains("\"Sch\".\"select_rw_intent\""));
        assert!(
            sql.rw
                .take
                .contains("nextval('\"Sch\".\"select_fence_seq\"'::regclass)")
        );
        assert!(
            sql.acquire
                .contains("nextval('\"Sch\".\"select_fence_seq\"'::regclass)")
        );
        assert_ne!(sql.channel, sql.evict_channel);
    }
}
