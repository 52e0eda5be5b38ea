//! Every SQL statement the backend runs, built once per backend from the
//! validated, quoted identifiers. Lock names, owners, fences and TTLs are
//! always bind parameters.
//!
//! Expiry is judged with `clock_timestamp()` (the server's clock at the
//! moment the row is examined), never `now()` (the transaction start) and
//! never the client's clock. Released rows are kept with `owner = NULL` and
//! `expires_at = '-infinity'`, so a name's row (and its last fence) outlives
//! its holders; fences come from one sequence that is never reset.

use crate::ident::Ident;

/// The sequence of a lock table is `<table>` + this.
pub(crate) const SEQUENCE_SUFFIX: &str = "_fence_seq";

/// The resource-side fencing table created next to the lock table.
pub(crate) const RESOURCE_FENCE_TABLE: &str = "resource_fence";

/// Remaining lease time in whole microseconds, at least 1 (the row was
/// live when selected; a later clock read must not make it look free).
/// Released rows (`-infinity`) are guarded: PostgreSQL cannot subtract
/// infinite timestamps.
const REMAINING_US: &str = "CASE WHEN expires_at = '-infinity' THEN 1
    ELSE GREATEST((extract(epoch FROM (expires_at - clock_timestamp())) * 1000000)::bigint, 1) END";

/// Starts every transaction this crate opens: READ COMMITTED whatever the
/// server's default, so each statement sees what committed before it began.
/// Under REPEATABLE READ or SERIALIZABLE a release in a long turnstile
/// transaction would judge the lease on that transaction's first snapshot
/// (and miss it), and contended acquires would fail to serialize.
pub(crate) const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Run on every session the backend opens, for its single statements.
pub(crate) const PIN_ISOLATION: &str = "SET default_transaction_isolation = 'read committed'";

/// The statements of one lock table.
#[derive(Debug)]
pub(crate) struct Sql {
    /// `$1` name, `$2` owner, `$3` TTL µs, `$4` minimum time free in µs
    /// (0: any free row) → `(fence, remaining_us)`: `(Some, None)`
    /// acquired; `(None, Some)` held; no row: held by a grant this
    /// statement's snapshot cannot see yet, or free for less than `$4`.
    pub(crate) acquire: String,
    /// `$1` name, `$2` owner, `$3` fence, `$4` TTL µs → rows affected.
    pub(crate) renew: String,
    /// `$1` name, `$2` owner, `$3` fence, `$4` channel → released count.
    pub(crate) release: String,
    /// `$1` name, `$2` owner, `$3` channel → freed count: frees a grant
    /// whose fence is unknown (an acquire whose reply was lost); the owner
    /// token is unique to that one attempt.
    pub(crate) forget: String,
    /// `$1` names, `$2` owners, `$3` fences (arrays) → the owners of those
    /// grants that are no longer live.
    pub(crate) gone: String,
    /// `$1` name → `(fence, owner, remaining_us)` of a live holder.
    pub(crate) inspect: String,
    /// `$1` name → the live holder, row-locked until commit.
    pub(crate) force_select: String,
    /// `$1` name: free the row and move its fence past the evicted grant.
    pub(crate) force_free: String,
    /// `$1` channel, `$2` payload.
    pub(crate) notify: &'static str,
    /// Server facts checked at connect; `$1`, `$2`, `$3` the regclass texts
    /// of table, sequence and resource-fence table.
    pub(crate) probe: &'static str,
    /// The NOTIFY channel of this table (payload: a freed name).
    pub(crate) channel: String,
    /// The NOTIFY channel of evictions (payload: `fence owner name`).
    pub(crate) evict_channel: String,
    /// `"schema"."table"` and friends, as text for `to_regclass`.
    pub(crate) table_regclass: String,
    pub(crate) sequence_regclass: String,
    pub(crate) resource_fence_regclass: String,
    pub(crate) schema: Ident,
    pub(crate) ddl: Ddl,
}

/// Schema creation, run under a transaction-scoped advisory lock so
/// concurrent first uses do not race on the catalog.
#[derive(Debug)]
pub(crate) struct Ddl {
    /// `$1` key text → serialises creators.
    pub(crate) lock: &'static str,
    /// `$1` schema name → whether it exists.
    pub(crate) schema_exists: &'static str,
    pub(crate) create_schema: String,
    pub(crate) create_sequence: String,
    pub(crate) create_table: String,
    /// Starts a re-created sequence above every fence left in the table,
    /// so an operator who dropped the sequence cannot make fences go back.
    pub(crate) resync_sequence: String,
    pub(crate) create_resource_fence: String,
}

impl Sql {
    pub(crate) fn new(schema: &Ident, table: &Ident, sequence: &Ident) -> Sql {
        let t = format!("{}.{}", schema.quoted(), table.quoted());
        let seq = format!("{}.{}", schema.quoted(), sequence.quoted());
        let resource_fence = format!(
            "{}.{}",
            schema.quoted(),
            Ident::new("table", RESOURCE_FENCE_TABLE, Ident::MAX_BYTES)
                .expect("constant identifier")
                .quoted()
        );
        // `seq` holds only identifier characters and double quotes, so it
        // is safe inside a single-quoted literal.
        let nextval = format!("nextval('{seq}'::regclass)");
        let ttl = "$3 * interval '1 microsecond'";
        // One statement, three exclusive paths, decided on the row itself:
        // - `live`: the snapshot shows a live holder: report it, write nothing
        //   (no row lock, no transaction id, so no WAL flush at commit);
        // - `taken`: the row is free or expired: lock it (skipping it if
        //   another transaction holds it, i.e. a contender is taking it right
        //   now), re-check the expiry under the lock, take it;
        // - `inserted`: the name has no row yet: insert one, and if a
        //   concurrent insert won, do nothing.
        // Contenders that lose write nothing, so a herd woken by one release
        // costs one WAL flush (the winner's), not one per contender.
        //
        // `$4` (µs, normally 0) asks for a row that has been free for at
        // least that long (released: since `updated_at`; expired: since
        // `expires_at`): a waiter stuck in the turnstile queue uses it to
        // take a lease nobody else is taking, without racing a live
        // attempter. With 0 the condition is skipped entirely, so a server
        // clock stepped backwards cannot delay an ordinary acquire.
        let stale =
            "($4 = 0 OR CASE WHEN expires_at = '-infinity' THEN updated_at ELSE expires_at END
                       <= clock_timestamp() - $4 * interval '1 microsecond')";
        let stale_l = stale
            .replace("expires_at", "l.expires_at")
            .replace("updated_at", "l.updated_at");
        let acquire = format!(
            "WITH live AS (
                SELECT expires_at FROM {t}
                 WHERE name = $1 AND expires_at > clock_timestamp()
            ), free AS (
                SELECT name FROM {t}
                 WHERE name = $1 AND expires_at <= clock_timestamp() AND {stale}
                   FOR UPDATE SKIP LOCKED
            ), taken AS (
                UPDATE {t} AS l
                   SET owner = $2, fence = {nextval},
                       expires_at = clock_timestamp() + {ttl},
                       updated_at = clock_timestamp()
                  FROM free
                 WHERE l.name = free.name AND l.expires_at <= clock_timestamp()
                   AND {stale_l}
                RETURNING l.fence
            ), inserted AS (
                INSERT INTO {t} (name, owner, fence, expires_at, updated_at)
                SELECT $1, $2, {nextval}, clock_timestamp() + {ttl}, clock_timestamp()
                 WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name = $1)
                ON CONFLICT (name) DO NOTHING
                RETURNING fence
            )
            SELECT fence, NULL::bigint AS remaining_us FROM taken
            UNION ALL
            SELECT fence, NULL FROM inserted
            UNION ALL
            SELECT NULL, {REMAINING_US} FROM live"
        );
        let renew = format!(
            "UPDATE {t}
                SET expires_at = clock_timestamp() + $4 * interval '1 microsecond',
                    updated_at = clock_timestamp()
              WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()"
        );
        let release = format!(
            "WITH released AS (
                UPDATE {t}
                   SET owner = NULL, expires_at = '-infinity', updated_at = clock_timestamp()
                 WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()
                RETURNING name
            )
            SELECT count(*) FROM (SELECT pg_notify($4, name) FROM released) notified"
        );
        let forget = format!(
            "WITH freed AS (
                UPDATE {t}
                   SET owner = NULL, expires_at = '-infinity', updated_at = clock_timestamp()
                 WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()
                RETURNING name
            )
            SELECT count(*) FROM (SELECT pg_notify($3, name) FROM freed) notified"
        );
        let gone = format!(
            "SELECT r.owner FROM unnest($1::text[], $2::uuid[], $3::bigint[]) AS r(name, owner, fence)
              WHERE NOT EXISTS (
                SELECT 1 FROM {t} l
                 WHERE l.name = r.name AND l.owner = r.owner AND l.fence = r.fence
                   AND l.expires_at > clock_timestamp())"
        );
        let inspect = format!(
            "SELECT fence, owner, {REMAINING_US} FROM {t}
              WHERE name = $1 AND expires_at > clock_timestamp()"
        );
        let force_select = format!(
            "SELECT fence, owner, {REMAINING_US} FROM {t}
              WHERE name = $1 AND expires_at > clock_timestamp() FOR UPDATE"
        );
        let force_free = format!(
            "UPDATE {t}
                SET owner = NULL, expires_at = '-infinity', fence = {nextval},
                    updated_at = clock_timestamp()
              WHERE name = $1"
        );
        let ddl = Ddl {
            lock: "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            schema_exists: "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            create_schema: format!("CREATE SCHEMA IF NOT EXISTS {}", schema.quoted()),
            create_sequence: format!(
                "CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE"
            ),
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    name       text COLLATE \"C\" PRIMARY KEY,
                    owner      uuid,
                    fence      bigint NOT NULL CHECK (fence > 0),
                    expires_at timestamptz NOT NULL,
                    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
                )"
            ),
            resync_sequence: format!(
                "SELECT setval('{seq}'::regclass, max(fence)) FROM {t} HAVING max(fence) IS NOT NULL"
            ),
            create_resource_fence: crate::fence::create_table_sql(&resource_fence),
        };
        Sql {
            acquire,
            renew,
            release,
            forget,
            gone,
            inspect,
            force_select,
            force_free,
            notify: "SELECT pg_notify($1, $2)",
            probe: "SELECT current_setting('server_version_num')::int4,
                           current_setting('server_encoding'),
                           current_setting('fsync'),
                           current_setting('synchronous_commit'),
                           current_setting('default_transaction_isolation'),
                           to_regclass($1) IS NOT NULL
                             AND to_regclass($2) IS NOT NULL
                             AND to_regclass($3) IS NOT NULL",
            channel: channel("distlock", schema, table),
            evict_channel: channel("distlock-evict", schema, table),
            table_regclass: t,
            sequence_regclass: seq,
            resource_fence_regclass: resource_fence,
            schema: schema.clone(),
            ddl,
        }
    }
}

/// The NOTIFY channel of a table: readable when it fits PostgreSQL's
/// 63-byte identifier limit, hashed otherwise. Two tables sharing a channel
/// would only cost spurious wake-ups.
fn channel(prefix: &str, schema: &Ident, table: &Ident) -> String {
    let readable = format!("{prefix}:{}.{}", schema.as_str(), table.as_str());
    if readable.len() <= Ident::MAX_BYTES {
        return readable;
    }
    format!("{prefix}:{:016x}", fnv1a(readable.as_bytes()))
}

/// The advisory-lock key of a name's turnstile (see `turnstile.rs`): the
/// table and the name, hashed into PostgreSQL's 64-bit advisory key space.
/// Two names may share a key; that only makes their waiters queue in one
/// line (and the stale check keeps that from stalling anyone), it never
/// grants a lease: the lease row stays the only authority.
pub(crate) fn turnstile_key(table_regclass: &str, name: &str) -> i64 {
    let mut bytes = Vec::with_capacity(table_regclass.len() + 1 + name.len());
    bytes.extend_from_slice(table_regclass.as_bytes());
    bytes.push(0); // neither part contains NUL: the pair is unambiguous
    bytes.extend_from_slice(name.as_bytes());
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
        let sql = Sql::new(&ident("public"), &ident("t"), &ident("t_fence_seq"));
        assert_ne!(sql.channel, sql.evict_channel);
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
    }

    #[test]
    fn identifiers_are_quoted_everywhere() {
        let sql = Sql::new(&ident("Sch"), &ident("select"), &ident("select_fence_seq"));
        for text in [
            &sql.acquire,
            &sql.renew,
            &sql.release,
            &sql.inspect,
            &sql.force_free,
        ] {
            assert!(text.contains("\"Sch\".\"select\""), "{text}");
        }
        assert!(
            sql.acquire
                .contains("nextval('\"Sch\".\"select_fence_seq\"'::regclass)")
        );
    }
}
