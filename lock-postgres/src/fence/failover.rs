//! Failover: a promoted standby may lack the old primary's last commits.
//!
//! With asynchronous replication a standby can be behind when it is
//! promoted: lock rows and, worse, the fence sequence (logged 32 values
//! ahead in WAL) may be older than what the old primary handed out, so its
//! fences could repeat. A promotion starts a new *timeline* of the WAL,
//! which every server names: the table's `<table>_epoch` row records the
//! timeline its fences were last handed out on.
//!
//! Every new connection of the backend's own pool reads both before its
//! first statement. When they differ, the server is another incarnation
//! than the one the table's fences came from (a promoted standby, or a
//! point-in-time restore), and the connection, before anything else runs on
//! it, moves the sequence above the server's clock in microseconds (the
//! floor's transaction: grants wait meanwhile) and records the new
//! timeline. Every fence handed out on a server stays below its wall clock
//! in microseconds (fewer than a million grants a second), so fences keep
//! growing unless the promoted server's clock is behind the old primary's
//! by more than the failover took. That is the assumption, and the one
//! Redis's fences rest on after a lost counter.
//!
//! The backend also remembers the timeline it last worked on: when a new
//! connection finds another one, every lease it held may be gone (its row
//! unreplicated, or replicated with an older expiry), so their loss
//! signals fire at once (lockcore's [`Era`], one per backend), whichever
//! client raised the floor.
//!
//! With `failover_lock_delay`, the client that records the failover also
//! records when grants may resume (`grants_from`), every new connection
//! reads it, and a backend that saw the timeline change waits its own delay
//! from that moment: no lease of the old primary is still running when the
//! new one grants again.

use std::time::Duration;

use lockcore::backend::Era;
use sqlx::{Connection, PgConnection};

use crate::locks::sql::BEGIN;

/// The statements of one lock table's failover check.
#[derive(Debug)]
pub(crate) struct EpochSql {
    /// The recorded timeline (NULL before the first), the server's, and
    /// how long grants still wait after a failover (µs).
    read: String,
    /// `$1` the server's timeline, recorded if none was.
    record: String,
    /// Locks grants out: the sequence's floor transaction begins with it.
    lock_grants: String,
    /// The recorded timeline, locked.
    locked: String,
    /// Moves the sequence above the server's clock in µs.
    raise: String,
    /// `$1` the new timeline, `$2` the lock delay (µs).
    update: String,
}

/// The server's WAL timeline: the first 8 hex digits of its WAL file
/// names (a standby, in recovery, has none: the query fails there).
const TIMELINE: &str = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)";

impl EpochSql {
    /// `epoch` and `seq` are quoted, qualified names; `lock_grants` the
    /// statement that locks grants out.
    pub(crate) fn new(epoch: &str, seq: &str, lock_grants: &str) -> EpochSql {
        EpochSql {
            read: format!(
                "SELECT (SELECT timeline FROM {epoch} WHERE id), {TIMELINE},
                        COALESCE((SELECT (extract(epoch FROM GREATEST(grants_from, now) - now)
                                          * 1000000)::bigint
                                    FROM {epoch}, (SELECT clock_timestamp() AS now) t
                                   WHERE id), 0)"
            ),
            record: format!(
                "INSERT INTO {epoch} (id, timeline) VALUES (true, $1) ON CONFLICT (id) DO NOTHING"
            ),
            lock_grants: lock_grants.to_owned(),
            locked: format!("SELECT timeline FROM {epoch} WHERE id FOR UPDATE"),
            // `seq` holds only identifier characters and double quotes.
            raise: format!(
                "SELECT setval('{seq}'::regclass, GREATEST(
                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                    nextval('{seq}'::regclass)))"
            ),
            update: format!(
                "UPDATE {epoch} SET timeline = $1, seen_at = clock_timestamp(),
                        grants_from = GREATEST(grants_from,
                                               clock_timestamp() + $2 * interval '1 microsecond')
                  WHERE id"
            ),
        }
    }
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The timeline the table's fences came from.
    Same,
    /// The first look at this table: recorded.
    First,
    /// Another timeline: the sequence was moved to `floor`.
    Failover {
        from: String,
        to: String,
        floor: i64,
    },
}

/// What a new connection found.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) seen: Seen,
    /// The server's timeline.
    pub(crate) timeline: String,
    /// How long grants still wait after a failover with a lock delay.
    pub(crate) grants_wait: Duration,
}

/// Runs the check on a new connection, before its first statement:
/// records the timeline, or after a failover raises the fence floor above
/// the server's clock and starts the lock delay `lock_delay` (waiting at
/// most `lock_timeout` for grants to pause).
pub(crate) async fn check(
    conn: &mut PgConnection,
    sql: &EpochSql,
    lock_timeout: Duration,
    lock_delay: Duration,
) -> Result<Checked, sqlx::Error> {
    let (recorded, timeline, wait_us): (Option<String>, String, i64) =
        sqlx::query_as(&sql.read).fetch_one(&mut *conn).await?;
    let grants_wait = Duration::from_micros(u64::try_from(wait_us).unwrap_or(0));
    let checked = |seen, timeline, grants_wait| Checked {
        seen,
        timeline,
        grants_wait,
    };
    match recorded {
        Some(recorded) if recorded == timeline => {
            return Ok(checked(Seen::Same, timeline, grants_wait));
        }
        None => {
            sqlx::query(&sql.record)
                .bind(&timeline)
                .execute(&mut *conn)
                .await?;
            return Ok(checked(Seen::First, timeline, grants_wait));
        }
        Some(_) => {}
    }
    let begin = format!(
        "{BEGIN}; SET LOCAL lock_timeout = '{}ms'; {}",
        lock_timeout.as_millis().max(1),
        sql.lock_grants
    );
    let mut tx = conn.begin_with(begin).await?;
    let recorded: Option<String> = sqlx::query_scalar(&sql.locked)
        .fetch_optional(&mut *tx)
        .await?;
    let seen = match recorded {
        Some(from) if from != timeline => {
            let floor: i64 = sqlx::query_scalar(&sql.raise).fetch_one(&mut *tx).await?;
            sqlx::query(&sql.update)
                .bind(&timeline)
                .bind(i64::try_from(lock_delay.as_micros()).unwrap_or(i64::MAX))
                .execute(&mut *tx)
                .await?;
            Seen::Failover {
                from,
                to: timeline.clone(),
                floor,
            }
        }
        // Another client raised it meanwhile.
        _ => Seen::Same,
    };
    tx.commit().await?;
    let grants_wait = match seen {
        Seen::Failover { .. } => grants_wait.max(lock_delay),
        _ => grants_wait,
    };
    Ok(checked(seen, timeline, grants_wait))
}

/// What a new connection runs before its first statement: the check, the
/// era's end when the timeline changed, and the lock delay.
#[derive(Debug)]
pub(crate) struct OnConnect {
    pub(crate) sql: EpochSql,
    pub(crate) era: std::sync::Arc<Era>,
    /// How long the floor's transaction waits for grants to pause.
    pub(crate) lock_timeout: Duration,
    /// No grant for this long after a failover (`failover_lock_delay`).
    pub(crate) lock_delay: Option<Duration>,
    /// The lock table, for the log.
    pub(crate) table: String,
}

impl OnConnect {
    pub(crate) async fn run(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let delay = self.lock_delay.unwrap_or_default();
        let checked = check(conn, &self.sql, self.lock_timeout, delay).await?;
        if let Seen::Failover { from, to, floor } = &checked.seen {
            tracing::warn!(
                table = %self.table, %from, %to, %floor, lock_delay = ?self.lock_delay,
                "the server is on another timeline than the one the fences came from (a failover \
                 or a restore): fences now start above the server's clock in microseconds"
            );
        }
        self.era.hold_grants(checked.grants_wait);
        if self.era.saw(&checked.timeline) {
            // Whoever recorded the failover, this backend's old leases may
            // still be running somewhere: its own delay counts from now.
            self.era.hold_grants(delay);
            tracing::warn!(
                table = %self.table, timeline = %checked.timeline,
                "a new connection reached a server on another timeline: every lease held before is lost"
            );
        }
        Ok(())
    }
}
