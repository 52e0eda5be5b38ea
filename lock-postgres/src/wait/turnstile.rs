//! Turnstiles: waiters of a name queue in PostgreSQL's lock manager, first
//! come, first served, and only the first of them asks for the lease.
//!
//! The first local waiter of a name (see `wait.rs`) calls
//! `pg_advisory_lock(key)` on a connection of its own, where `key` hashes
//! the table and the name: the call blocks in the server's lock queue,
//! which is FIFO and in memory, so queueing writes nothing and polls
//! nothing. A task drives the queued call and signals the waiter when its
//! turn comes.
//!
//! A waiter's place in the queue asks for the lease too: the queued
//! statement is `pg_temp.distlock_turn` (see `Sql::turn`), which takes the
//! lease in the server process the moment the turn comes, on a snapshot
//! taken after it, and answers with the acquire's verdict. A hand-off then
//! costs the release's commit, the server waking the next process, and the
//! next acquire's commit: no round trip to the waiting client and back in
//! between. The grant is an ordinary attempt by the waiter (its own owner
//! token, its lease counted from before the statement was sent); one that
//! no waiter takes (it gave up meanwhile) is freed on the same connection,
//! owner-checked, before the turnstile is let go. A session that cannot
//! create the temporary function (no TEMP privilege) queues with a plain
//! `pg_advisory_lock`, and its waiter asks for the lease once in.
//!
//! The waiter holding the turnstile without a lease (the queued acquire
//! found it held) waits for it as any waiter does (NOTIFY, the holder's
//! expiry, re-checks). The lease it gets keeps the turnstile (the session keeps the
//! advisory lock, idle, no transaction open) while the lease is held, and
//! `release` runs on that connection and passes the turnstile on in the
//! same statement, at its commit (the release's transaction takes the key
//! over from the session; see `locks/sql.rs`): the next waiter is let in
//! once the release is durable and visible, with no round trip after it,
//! and finds the lock free. A hand-off costs the next waiter's own
//! attempt, with no notification and no herd. The turnstile also ends when a
//! renewal finds the lease gone, or when the lease is dropped.
//!
//! The turnstile only orders waiters; it never grants anything: the lease
//! row, taken by its atomic statement, stays the only authority. So every
//! way a turnstile can go wrong costs order or latency, never safety:
//!
//! - two names whose keys collide (or an application's own advisory lock on
//!   the same key) make their waiters queue in one line;
//! - a turnstile holder that hangs (a stopped process, a partition) keeps
//!   its session until the server notices; `wait.rs` takes the lease past
//!   it once the lease has been free or expired for a moment;
//! - a lost turnstile connection, or no connection to spare (at most
//!   `turnstiles` per instance), means waiting without: LISTEN/NOTIFY and
//!   re-checks, unordered; a release whose turnstile connection broke runs
//!   on its own.
//!
//! Leaving the queue early (deadline, cancellation, the take past a stalled
//! holder) closes the connection: the server drops a waiter whose client is
//! gone within `client_connection_check_interval` (set to 1 s on
//! PostgreSQL 14 and later); older servers keep the dead session queued
//! until its turn, then end it at once, passing the turnstile on. The
//! locks are session locks, so turnstile connections must reach the server
//! itself or a session-mode pool, not a transaction-mode PgBouncer.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use lockcore::backend::{CancellationToken, Cleanups};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor, Row};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

use crate::connection::Pool;
use crate::fence::failover::OnConnect;
use crate::locks::GrantRow;
use crate::locks::sql::Sql;

/// The first PostgreSQL version with `client_connection_check_interval`.
const CONNECTION_CHECK_SINCE: i32 = 140_000;

/// The turnstiles of one backend instance.
pub(crate) struct Turnstiles {
    shared: Arc<Shared>,
    options: PgConnectOptions,
    /// One per turnstile connection, in use or idle.
    permits: Arc<Semaphore>,
    capacity: usize,
    /// Prepares a new connection's session before it first queues
    /// (settings, not connection options, which some poolers refuse), and
    /// reads its process id.
    setup: &'static str,
    /// The failover check every new connection runs before it grants.
    on_connect: Arc<OnConnect>,
    /// Creates the session's `pg_temp.distlock_turn`.
    turn_function: String,
}

/// What a waiter asks for when its turn comes, in the statement that
/// queues it: the lease of `name` for `owner`.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    pub(crate) name: String,
    pub(crate) owner: uuid::Uuid,
    pub(crate) ttl_us: i64,
    pub(crate) label: String,
    /// The name's watch key (a grant given back notifies its waiters).
    pub(crate) watch: i64,
}

/// A turnstile connection and its server process id (to cancel its wait),
/// with its permit while in use (so idle and used connections together
/// never outnumber the permits).
struct Session {
    conn: PgConnection,
    pid: i32,
    permit: Option<OwnedSemaphorePermit>,
    /// Whether the session has `pg_temp.distlock_turn`.
    turns: bool,
    /// A grant its last turn made that no lease took yet: freed before the
    /// session is let go or reused.
    granted: Option<Ask>,
}

/// How a session's wait in the queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// It got the turn.
    Turn,
    /// The server answered with an error (cancelled): the connection is
    /// fine, but the session may hold the turnstile (a cancel that struck
    /// the acquire after the turn came).
    Refused,
    /// The connection broke, or the answer did not come.
    Broken,
    /// It got the turn, and a statement on its connection has passed the
    /// turn on since (a release, at its commit).
    PassedOn,
}

impl Fate {
    fn of<T>(result: &Result<T, sqlx::Error>) -> Fate {
        match result {
            Ok(_) => Fate::Turn,
            Err(error) => Fate::failed(error),
        }
    }

    fn failed(error: &sqlx::Error) -> Fate {
        match error {
            sqlx::Error::Database(_) => Fate::Refused,
            _ => Fate::Broken,
        }
    }
}

struct Shared {
    /// Connections whose last transaction ended cleanly, for reuse.
    idle: Mutex<Vec<Session>>,
    /// The turnstiles kept by leases, for `close`.
    kept: Mutex<Vec<Weak<Mutex<Option<Ticket>>>>>,
    op_timeout: Duration,
    /// Where a waiter that gives up cancels its queued wait.
    pool: Pool,
    /// Leaving a turnstile (queued or held) is a clean-up the client owes.
    cleanups: Cleanups,
    /// The queued acquire (`Sql::turn`).
    turn: &'static str,
    /// Frees a grant nobody took (`Sql::forget`), and the channel it
    /// notifies.
    forget: String,
    channel: String,
    /// The backend's: cancelled when it closes, which ends every wait.
    closing: CancellationToken,
}

impl Turnstiles {
    /// `sql`, the backend's statements; `on_connect`, the failover check.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        options: PgConnectOptions,
        capacity: u32,
        server_version: i32,
        op_timeout: Duration,
        (sql, on_connect): (&Sql, Arc<OnConnect>),
        pool: Pool,
        cleanups: Cleanups,
        closing: CancellationToken,
    ) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        Turnstiles {
            shared: Arc::new(Shared {
                idle: Mutex::new(Vec::new()),
                kept: Mutex::new(Vec::new()),
                op_timeout,
                pool,
                cleanups,
                closing,
                turn: sql.turn,
                forget: sql.forget.clone(),
                channel: sql.channel.clone(),
            }),
            options,
            permits: Arc::new(Semaphore::new(capacity)),
            capacity,
            // The wait is bounded by the caller's deadline, not by server
            // defaults meant for queries; a waiter whose client is gone
            // leaves the queue within a second where the server can tell.
            // The release that runs here later is pinned to READ COMMITTED
            // like every statement of this crate.
            setup: if server_version >= CONNECTION_CHECK_SINCE {
                "SET statement_timeout = 0; SET lock_timeout = 0; \
                 SET client_connection_check_interval = 1000; \
                 SET default_transaction_isolation = 'read committed'; \
                 SELECT pg_backend_pid();"
            } else {
                "SET statement_timeout = 0; SET lock_timeout = 0; \
                 SET default_transaction_isolation = 'read committed'; \
                 SELECT pg_backend_pid();"
            },
            on_connect,
            turn_function: sql.turn_function.clone(),
        }
    }

    /// Whether this instance may use turnstiles at all.
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// A place in the server's queue for `key`, on a connection of its own,
    /// asking for the lease `ask` when the turn comes (if the session can);
    /// `signal` is notified when the turn comes (or the place is lost).
    /// `None` when no turnstile connection can be had (all in use,
    /// connecting failed, or the backend closed): the caller then waits
    /// without.
    pub(crate) async fn enter(
        &self,
        key: i64,
        ask: Option<Ask>,
        signal: Arc<Notify>,
    ) -> Option<Ticket> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        let idle = self.shared.idle().pop();
        let mut session = match idle {
            Some(session) => session,
            None => match tokio::time::timeout(self.shared.op_timeout, self.connect()).await {
                Ok(Ok(session)) => session,
                Ok(Err(error)) => {
                    tracing::debug!(%error, "no turnstile connection; waiting without one");
                    return None;
                }
                Err(_) => {
                    tracing::debug!("turnstile connection timed out; waiting without one");
                    return None;
                }
            },
        };
        session.permit = Some(permit);
        // Given up by the waiter (its ticket dropped) or by closing.
        let gave_up = self.shared.closing.child_token();
        let (sender, turn) = oneshot::channel();
        let queued = Shared::queue(
            self.shared.clone(),
            session,
            (key, ask),
            gave_up.clone(),
            sender,
            signal,
        );
        if !self.shared.cleanups.spawn(queued) {
            return None;
        }
        Some(Ticket {
            state: State::Queued(turn),
            answer: None,
            shared: self.shared.clone(),
            gave_up,
        })
    }

    /// A new turnstile connection, set up and checked for a failover (it
    /// grants), with its process id.
    async fn connect(&self) -> Result<Session, sqlx::Error> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        // A bare string runs as a simple query: several statements.
        let row = conn.fetch_one(self.setup).await?;
        let pid = row.try_get(0)?;
        self.on_connect.run(&mut conn).await?;
        let turns = match conn.execute(self.turn_function.as_str()).await {
            Ok(_) => true,
            Err(sqlx::Error::Database(error)) => {
                tracing::debug!(%error, "no temporary function in a turnstile session; its waiters ask for the lease once in");
                false
            }
            Err(error) => return Err(error),
        };
        Ok(Session {
            conn,
            pid,
            permit: None,
            turns,
            granted: None,
        })
    }

    /// Closes every turnstile connection: those kept by leases (their
    /// turnstiles pass on as their sessions end) and the idle ones, each
    /// within `limit`; no turnstile is entered afterwards. Queued waits end
    /// with the backend's `closing` signal, as clean-ups.
    pub(crate) async fn close(&self, limit: Duration) {
        self.permits.close();
        let kept = std::mem::take(&mut *self.shared.kept());
        let mut sessions: Vec<Session> = kept
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|held| held.lock().unwrap_or_else(|p| p.into_inner()).take())
            .filter_map(Ticket::into_session)
            .collect();
        sessions.append(&mut self.shared.idle());
        let closing = sessions.into_iter().map(|s| s.conn.close());
        let _ = tokio::time::timeout(limit, futures_util::future::join_all(closing)).await;
    }
}

impl fmt::Debug for Turnstiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turnstiles")
            .field("capacity", &self.capacity)
            .field(
                "in_use",
                &(self
                    .capacity
                    .saturating_sub(self.permits.available_permits())),
            )
            .field("idle", &self.shared.idle().len())
            .finish()
    }
}

impl Shared {
    // Updates are single vector operations; a panic cannot leave them torn.
    fn idle(&self) -> MutexGuard<'_, Vec<Session>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kept(&self) -> MutexGuard<'_, Vec<Weak<Mutex<Option<Ticket>>>>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One waiter's place in the server's queue: `pg_temp.distlock_turn`
    /// asking for `ask` (or a plain `pg_advisory_lock(key)`) on `session`,
    /// its outcome handed to the ticket (and `signal` notified). Given up
    /// before its turn, the wait is cancelled on the server at once (not
    /// when the server notices a closed connection), and a turn that came
    /// meanwhile is let go, with the grant it made.
    async fn queue(
        shared: Arc<Shared>,
        mut session: Session,
        (key, ask): (i64, Option<Ask>),
        gave_up: CancellationToken,
        sender: oneshot::Sender<Queued>,
        signal: Arc<Notify>,
    ) {
        let ask = ask.filter(|_| session.turns);
        let pid = session.pid;
        let result = {
            let conn = &mut session.conn;
            let queued = async {
                match &ask {
                    Some(ask) => sqlx::query_as::<_, GrantRow>(shared.turn)
                        .bind(ask.name.as_str())
                        .bind(ask.owner)
                        .bind(ask.ttl_us)
                        .bind(key)
                        .bind(ask.label.as_str())
                        .fetch_all(conn)
                        .await
                        .map(Some),
                    // `key` is an integer, safe to inline.
                    None => conn
                        .execute(format!("SELECT pg_advisory_lock({key})").as_str())
                        .await
                        .map(|_| None),
                }
            };
            tokio::pin!(queued);
            tokio::select! {
                result = &mut queued => result,
                _ = gave_up.cancelled() => {
                    shared.cancel(pid).await;
                    match tokio::time::timeout(shared.op_timeout, queued).await {
                        Ok(result) => result,
                        // No answer: dropping the connection ends the wait
                        // (and rolls back an acquire still running).
                        Err(_) => return,
                    }
                }
            }
        };
        if let Ok(Some(rows)) = &result
            && rows.iter().any(|(fence, _)| fence.is_some())
        {
            session.granted = ask;
        }
        if gave_up.is_cancelled() {
            return shared.reuse(session, Fate::of(&result)).await;
        }
        match sender.send((session, result)) {
            Ok(()) => signal.notify_one(),
            // The ticket went meanwhile.
            Err((session, result)) => shared.reuse(session, Fate::of(&result)).await,
        }
    }

    /// Cancels the wait of the turnstile session `pid` if it still waits
    /// for an advisory lock (so a session that ended and whose process id
    /// went to another is not touched).
    async fn cancel(&self, pid: i32) {
        let cancelled = async {
            let mut op = self
                .pool
                .checkout("leaving a turnstile", self.op_timeout)
                .await?;
            op.run(|c| {
                sqlx::query(
                    "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
                      WHERE pid = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                )
                .bind(pid)
                .execute(c)
            })
            .await
        };
        if let Err(error) = cancelled.await {
            tracing::debug!(%error, "cancelling a turnstile wait failed; closing its connection instead");
        }
    }

    /// A session whose wait ended and that no waiter takes: free the grant
    /// its turn made for nobody, then let go of the turnstile it may hold;
    /// keep it as it is once a release passed the turnstile on.
    async fn reuse(&self, mut session: Session, fate: Fate) {
        if let Some(ask) = session.granted.take()
            && !self.give_back(&mut session, &ask).await
        {
            // In doubt: closing the connection lets go of the turnstile,
            // and the grant expires.
            return;
        }
        match fate {
            Fate::Turn | Fate::Refused => self.leave(session).await,
            Fate::PassedOn => self.keep(session).await,
            Fate::Broken => {} // dropping the connection is all
        }
    }

    /// Frees the grant `ask` got (owner-checked: it is that attempt's
    /// alone) on `session`, notifying the name's waiters: whether the
    /// server answered.
    async fn give_back(&self, session: &mut Session, ask: &Ask) -> bool {
        let forget = sqlx::query_scalar::<_, i64>(&self.forget)
            .bind(ask.name.as_str())
            .bind(ask.owner)
            .bind(&self.channel)
            .bind(ask.watch)
            .fetch_one(&mut session.conn);
        match tokio::time::timeout(self.op_timeout, forget).await {
            Ok(Ok(_)) => true,
            Ok(Err(error)) => {
                tracing::debug!(lock = %ask.name, %error, "freeing a grant nobody took failed; it expires");
                false
            }
            Err(_) => false,
        }
    }

    /// Lets go of the turnstile (the session's advisory locks) and keeps
    /// the connection for the next waiter; any doubt closes it, which lets
    /// go just as well. Idle connections never outnumber the permits: one
    /// is only opened when none is idle.
    async fn leave(&self, mut session: Session) {
        let unlock = session.conn.execute("SELECT pg_advisory_unlock_all()");
        if let Ok(Ok(_)) = tokio::time::timeout(self.op_timeout, unlock).await {
            self.keep(session).await;
        }
    }

    /// Keeps an idle session for the next waiter, or closes it once the
    /// backend is closing.
    async fn keep(&self, mut session: Session) {
        if self.closing.is_cancelled() {
            let _ = tokio::time::timeout(self.op_timeout, session.conn.close()).await;
        } else {
            session.permit = None;
            self.idle().push(session);
        }
    }

    /// Hands `session` to [`reuse`](Self::reuse) in the background, as a
    /// clean-up of the client.
    fn reuse_later(self: &Arc<Self>, session: Session, fate: Fate) {
        let shared = self.clone();
        // Without a runtime the connection closes here, which ends its
        // session and its advisory locks with it.
        self.cleanups
            .spawn(async move { shared.reuse(session, fate).await });
    }
}

/// A turnstile kept by the lease it let in, until that lease is released:
/// lease clones share it, and the last one dropped ends it too.
#[derive(Default)]
pub(crate) struct HeldTurnstile(Arc<Mutex<Option<Ticket>>>);

impl HeldTurnstile {
    /// Keeps `ticket` (a lease gets at most one), where closing the
    /// backend finds it.
    pub(crate) fn keep(&self, ticket: Ticket) {
        let shared = ticket.shared.clone();
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(ticket);
        let mut kept = shared.kept();
        kept.retain(|held| held.strong_count() > 0);
        kept.push(Arc::downgrade(&self.0));
    }

    /// The ticket, unless already taken; dropping it lets the next waiter
    /// in (in the background).
    pub(crate) fn take(&self) -> Option<Ticket> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// What the queueing task hands back: its session, and whether the
/// advisory lock was granted on it, with the acquire's rows if it asked.
type Queued = (Session, Result<Option<Vec<GrantRow>>, sqlx::Error>);

enum State {
    /// In the server's queue: the task waits for the advisory lock.
    Queued(oneshot::Receiver<Queued>),
    /// Holding the turnstile: the connection is idle, its session holding
    /// the advisory lock.
    Holding(Session),
    Left,
}

/// Where a ticket stands.
pub(crate) enum Turn {
    /// Still queued.
    Waiting,
    /// This ticket holds the turnstile.
    Mine,
    /// The place is lost (connection gone, statement cancelled); the
    /// ticket is spent.
    Lost(sqlx::Error),
}

/// A waiter's place at a turnstile; dropping it is how a waiter leaves.
/// Dropped while queued, its wait is cancelled on the server; dropped
/// while holding, it lets go; both in the background, as clean-ups of the
/// client (without a runtime the connection closes, which lets go too), so
/// the next waiter goes on.
pub(crate) struct Ticket {
    state: State,
    /// The acquire's rows, when the queued statement asked for the lease.
    answer: Option<Vec<GrantRow>>,
    shared: Arc<Shared>,
    gave_up: CancellationToken,
}

impl Ticket {
    /// Whether this ticket's turn has come, without waiting.
    pub(crate) fn turn(&mut self) -> Turn {
        let State::Queued(turn) = &mut self.state else {
            return match self.state {
                State::Holding(_) => Turn::Mine,
                _ => Turn::Lost(sqlx::Error::Protocol("the turnstile was left".into())),
            };
        };
        match turn.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => Turn::Waiting,
            Ok((session, Ok(answer))) => {
                self.state = State::Holding(session);
                self.answer = answer;
                Turn::Mine
            }
            Ok((session, Err(error))) => {
                self.state = State::Left;
                self.shared.reuse_later(session, Fate::failed(&error));
                Turn::Lost(error)
            }
            Err(oneshot::error::TryRecvError::Closed) => {
                self.state = State::Left;
                Turn::Lost(sqlx::Error::WorkerCrashed)
            }
        }
    }

    /// The rows of the acquire the turn ran, if it asked for the lease:
    /// taken once, and a grant among them is then the caller's to keep or
    /// free.
    pub(crate) fn answer(&mut self) -> Option<Vec<GrantRow>> {
        let answer = self.answer.take()?;
        if let State::Holding(session) = &mut self.state {
            session.granted = None;
        }
        Some(answer)
    }

    /// The connection of a held turnstile.
    pub(crate) fn connection(&mut self) -> Option<&mut PgConnection> {
        match &mut self.state {
            State::Holding(session) => Some(&mut session.conn),
            _ => None,
        }
    }

    /// Spends a held turnstile that a statement on its connection passed
    /// on: the connection is kept for the next waiter, with nothing more
    /// to send.
    pub(crate) fn passed_on(mut self) {
        if let State::Holding(session) = std::mem::replace(&mut self.state, State::Left) {
            self.shared.reuse_later(session, Fate::PassedOn);
        }
    }

    /// The session of a held turnstile, taken out (to be closed).
    fn into_session(mut self) -> Option<Session> {
        match std::mem::replace(&mut self.state, State::Left) {
            State::Holding(session) => Some(session),
            _ => None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gave_up.cancel();
        match std::mem::replace(&mut self.state, State::Left) {
            // Queued: the task cancels the wait (the ticket gave up); a
            // turn already handed back, unread, is let go here.
            State::Queued(mut turn) => {
                if let Ok((session, result)) = turn.try_recv() {
                    self.shared.reuse_later(session, Fate::of(&result));
                }
            }
            State::Holding(session) => self.shared.reuse_later(session, Fate::Turn),
            State::Left => {}
        }
    }
}
