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
//! signals fire at once ([`Era::end`]), whichever client raised the floor.

use std::sync::Mutex;
use std::time::Duration;

use lockcore::backend::CancellationToken;
use sqlx::{Connection, PgConnection};

use crate::locks::sql::BEGIN;

/// The statements of one lock table's failover check.
#[derive(Debug)]
pub(crate) struct EpochSql {
    /// The recorded timeline (NULL before the first) and the server's.
    read: String,
    /// `$1` the server's timeline, recorded if none was.
    record: String,
    /// Locks grants out: the sequence's floor transaction begins with it.
    lock_grants: String,
    /// The recorded timeline, locked.
    locked: String,
    /// Moves the sequence above the server's clock in µs.
    raise: String,
    /// `$1` the new timeline.
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
            read: format!("SELECT (SELECT timeline FROM {epoch} WHERE id), {TIMELINE}"),
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
                "UPDATE {epoch} SET timeline = $1, seen_at = clock_timestamp() WHERE id"
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

/// Runs the check on a new connection, before its first statement:
/// records the timeline, or after a failover raises the fence floor above
/// the server's clock (waiting at most `lock_timeout` for grants to pause).
pub(crate) async fn check(
    conn: &mut PgConnection,
    sql: &EpochSql,
    lock_timeout: Duration,
) -> Result<(Seen, String), sqlx::Error> {
    let (recorded, timeline): (Option<String>, String) =
        sqlx::query_as(&sql.read).fetch_one(&mut *conn).await?;
    match recorded {
        Some(recorded) if recorded == timeline => return Ok((Seen::Same, timeline)),
        None => {
            sqlx::query(&sql.record)
                .bind(&timeline)
                .execute(&mut *conn)
                .await?;
            return Ok((Seen::First, timeline));
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
    Ok((seen, timeline))
}

/// The leases of one server timeline: each lease's loss signal is a child
/// of the current era's token, and a new timeline ends the era.
#[derive(Debug)]
pub(crate) struct Era {
    closing: CancellationToken,
    state: Mutex<EraState>,
}

#[derive(Debug)]
struct EraState {
    token: CancellationToken,
    /// The timeline this backend last saw, once it saw one.
    timeline: Option<String>,
}

impl Era {
    /// The first era; `closing` (the backend's) ends every era.
    pub(crate) fn new(closing: CancellationToken) -> Era {
        Era {
            state: Mutex::new(EraState {
                token: closing.child_token(),
                timeline: None,
            }),
            closing,
        }
    }

    /// A loss signal for a lease granted from now on.
    pub(crate) fn loss_signal(&self) -> CancellationToken {
        self.lock().token.child_token()
    }

    /// A connection saw `timeline`: when it is not the one this backend
    /// saw before, every lease granted before is lost (`true`).
    pub(crate) fn saw(&self, timeline: &str) -> bool {
        let mut state = self.lock();
        let changed = state.timeline.as_deref().is_some_and(|t| t != timeline);
        if changed {
            state.token.cancel();
            state.token = self.closing.child_token();
        }
        state.timeline = Some(timeline.to_owned());
        changed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EraState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a new connection runs before its first statement: the check, and
/// the era's end when the timeline changed.
#[derive(Debug)]
pub(crate) struct OnConnect {
    pub(crate) sql: EpochSql,
    pub(crate) era: std::sync::Arc<Era>,
    /// How long the floor's transaction waits for grants to pause.
    pub(crate) lock_timeout: Duration,
    /// The lock table, for the log.
    pub(crate) table: String,
}

impl OnConnect {
    pub(crate) async fn run(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let (seen, timeline) = check(conn, &self.sql, self.lock_timeout).await?;
        if let Seen::Failover { from, to, floor } = &seen {
            tracing::warn!(
                table = %self.table, %from, %to, %floor,
                "the server is on another timeline than the one the fences came from (a failover \
                 or a restore): fences now start above the server's clock in microseconds"
            );
        }
        if self.era.saw(&timeline) {
            tracing::warn!(
                table = %self.table, %timeline,
                "a new connection reached a server on another timeline: every lease held before is lost"
            );
        }
        Ok(())
    }
}
