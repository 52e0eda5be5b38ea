//! Turnstiles: waiters of a name queue in PostgreSQL's lock manager, first
//! come, first served, and only the first of them asks for the lease.
//!
//! A waiting `acquire` first waits its turn among the waiters of the same
//! name in *this* backend instance (a FIFO mutex per name, no I/O), so an
//! instance sends one waiter per name to the server at a time. That waiter
//! opens a transaction on a connection of its own and calls
//! `pg_advisory_xact_lock(key)`, where `key` hashes the table and the name:
//! the call blocks in the server's lock queue, which is FIFO and in memory,
//! so queueing writes nothing and polls nothing.
//!
//! The waiter holding the turnstile tries the lease at once, and, if it is
//! held, waits for it as any waiter does (NOTIFY, the holder's expiry,
//! re-checks). The lease it gets keeps the turnstile: the transaction stays
//! open, idle, while the lease is held, and `release` runs in it, so the
//! `COMMIT` that frees the row is the very one that lets the next waiter
//! in, and that waiter finds the lock free. A hand-off costs the next
//! waiter's own attempt, with no notification and no herd. The turnstile
//! also ends (rolled back) when a renewal finds the lease gone, or when the
//! lease is dropped.
//!
//! The turnstile only orders waiters; it never grants anything: the lease
//! row, taken by its atomic statement, stays the only authority. So every
//! way a turnstile can go wrong costs order or latency, never safety:
//!
//! - two names whose keys collide (or an application's own advisory lock on
//!   the same key) make their waiters queue in one line;
//! - a turnstile holder that hangs (a stopped process, a partition) keeps
//!   its transaction open until the server notices;
//! - so a queued waiter looks at the lease soon after queueing, then at
//!   the holder's expiry (and at least every re-check interval), and takes
//!   it itself once it has been free or expired for a moment (50 ms: nobody
//!   is taking it). A stalled holder costs its waiters its TTL plus that
//!   moment and a round trip; a turnstile squatter at most about a re-check
//!   interval once the lease is free; never a stall;
//! - a lost turnstile connection, or no connection to spare (at most
//!   `turnstiles` per instance), means waiting without: LISTEN/NOTIFY and
//!   re-checks, unordered; a release whose turnstile connection broke runs
//!   on its own.
//!
//! Leaving the queue early (deadline, cancellation, the stale take above)
//! closes the connection: the server drops a waiter whose client is gone
//! within `client_connection_check_interval` (set to 1 s on PostgreSQL 14
//! and later); older servers keep the dead session queued until its turn,
//! then end it at once, passing the turnstile on.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor};
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The first PostgreSQL version with `client_connection_check_interval`.
const CONNECTION_CHECK_SINCE: i32 = 140_000;

/// The turnstiles of one backend instance.
pub(crate) struct Turnstiles {
    shared: Arc<Shared>,
    options: PgConnectOptions,
    /// One per turnstile connection, in use or idle.
    permits: Arc<Semaphore>,
    capacity: usize,
    /// Starts the queueing transaction: `SET LOCAL`s, not connection
    /// options, which PgBouncer refuses and would leak across clients.
    begin: &'static str,
}

struct Shared {
    /// Connections whose last transaction ended cleanly, for reuse.
    idle: Mutex<Vec<PgConnection>>,
    /// The local line of each name with waiters.
    lines: Mutex<HashMap<String, Line>>,
    op_timeout: Duration,
}

struct Line {
    turn: Arc<tokio::sync::Mutex<()>>,
    waiting: usize,
}

impl Turnstiles {
    pub(crate) fn new(
        options: PgConnectOptions,
        capacity: u32,
        server_version: i32,
        op_timeout: Duration,
    ) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        Turnstiles {
            shared: Arc::new(Shared {
                idle: Mutex::new(Vec::new()),
                lines: Mutex::new(HashMap::new()),
                op_timeout,
            }),
            options,
            permits: Arc::new(Semaphore::new(capacity)),
            capacity,
            // The wait is bounded by the caller's deadline, not by server
            // defaults meant for queries; a waiter whose client is gone
            // leaves the queue within a second where the server can tell.
            // READ COMMITTED: a release in this transaction must see the
            // lease's current row, not the snapshot of the queueing.
            begin: if server_version >= CONNECTION_CHECK_SINCE {
                "BEGIN ISOLATION LEVEL READ COMMITTED; \
                 SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0; \
                 SET LOCAL client_connection_check_interval = 1000;"
            } else {
                "BEGIN ISOLATION LEVEL READ COMMITTED; \
                 SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0;"
            },
        }
    }

    /// Waits until every earlier waiter of `name` in this instance is done
    /// waiting.
    pub(crate) async fn local_turn(&self, name: &str) -> LocalTurn {
        let place = Place::new(&self.shared, name);
        let turn = place.turn.clone().lock_owned().await;
        LocalTurn {
            _turn: turn,
            _place: place,
        }
    }

    /// A place in the server's queue for `key`, sent when the ticket is
    /// first waited on; `None` when no turnstile connection can be had
    /// (all in use, or connecting failed): the caller then waits without.
    pub(crate) async fn enter(&self, key: i64) -> Option<Ticket> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        let idle = self.shared.idle().pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => {
                let connecting = PgConnection::connect_with(&self.options);
                match tokio::time::timeout(self.shared.op_timeout, connecting).await {
                    Ok(Ok(conn)) => conn,
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "no turnstile connection; waiting without one");
                        return None;
                    }
                    Err(_) => {
                        tracing::debug!("turnstile connection timed out; waiting without one");
                        return None;
                    }
                }
            }
        };
        // One round trip: the transaction and the wait in the server's
        // queue. `key` is an integer, safe to inline.
        let sql = format!("{} SELECT pg_advisory_xact_lock({key})", self.begin);
        let queued: Queued = Box::pin(async move {
            // A bare string runs as a simple query: several statements.
            let result = conn.execute(sql.as_str()).await.map(drop);
            (conn, result)
        });
        Some(Ticket {
            state: State::Queued(queued),
            shared: self.shared.clone(),
            permit: Some(permit),
        })
    }

    /// `acquire` calls of this instance in progress (queued locally or
    /// waiting their turn at the server).
    pub(crate) fn waiting(&self) -> usize {
        self.shared.lines().values().map(|l| l.waiting).sum()
    }
}

impl fmt::Debug for Turnstiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turnstiles")
            .field("capacity", &self.capacity)
            .field("idle", &self.shared.idle().len())
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl Shared {
    // Updates are single map or vector operations; a panic cannot leave
    // them torn.
    fn idle(&self) -> MutexGuard<'_, Vec<PgConnection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lines(&self) -> MutexGuard<'_, HashMap<String, Line>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the turnstile transaction (releasing the advisory lock) and
    /// keeps the connection for the next waiter; any doubt closes it, which
    /// ends the transaction just as well. Idle connections never outnumber
    /// the permits: one is only opened when none is idle.
    async fn leave(&self, mut conn: PgConnection) {
        let rollback = conn.execute("ROLLBACK");
        if let Ok(Ok(_)) = tokio::time::timeout(self.op_timeout, rollback).await {
            self.idle().push(conn);
        }
    }
}

/// This instance's turn for a name; dropping it lets the next local waiter go.
pub(crate) struct LocalTurn {
    // Field order is drop order: unlock, then leave the line.
    _turn: OwnedMutexGuard<()>,
    _place: Place,
}

/// A waiter's membership of its name's local line; the line goes away with
/// its last member, so memory follows the waiters, not the names.
struct Place {
    shared: Arc<Shared>,
    name: String,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Place {
    fn new(shared: &Arc<Shared>, name: &str) -> Self {
        let turn = {
            let mut lines = shared.lines();
            let line = lines.entry(name.to_owned()).or_insert_with(|| Line {
                turn: Arc::new(tokio::sync::Mutex::new(())),
                waiting: 0,
            });
            line.waiting += 1;
            line.turn.clone()
        };
        Place {
            shared: shared.clone(),
            name: name.to_owned(),
            turn,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut lines = self.shared.lines();
        if let Some(line) = lines.get_mut(&self.name) {
            line.waiting -= 1;
            if line.waiting == 0 {
                lines.remove(&self.name);
            }
        }
    }
}

/// A turnstile kept by the lease it let in, until that lease is released:
/// lease clones share it, and the last one dropped ends it too.
#[derive(Default)]
pub(crate) struct HeldTurnstile(Mutex<Option<Ticket>>);

impl HeldTurnstile {
    /// Keeps `ticket` (a lease gets at most one).
    pub(crate) fn keep(&self, ticket: Ticket) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(ticket);
    }

    /// The ticket, unless already taken; dropping it lets the next waiter
    /// in (in the background).
    pub(crate) fn take(&self) -> Option<Ticket> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The queueing request; it owns its connection and hands it back.
type Queued = Pin<Box<dyn Future<Output = (PgConnection, Result<(), sqlx::Error>)> + Send>>;

enum State {
    /// In the server's queue (or not yet sent).
    Queued(Queued),
    /// Holding the turnstile: the connection is idle in its transaction.
    Holding(PgConnection),
    Left,
}

/// A waiter's place at a turnstile; dropping it is how a waiter leaves.
/// Dropped while queued, it closes its connection (the server then drops
/// the waiter); dropped while holding, it rolls back in the background (or
/// closes the connection when there is no runtime), so the next waiter
/// goes on.
pub(crate) struct Ticket {
    state: State,
    shared: Arc<Shared>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Ticket {
    /// Waits for this ticket's turn until `until`: `Ok(true)` once it holds
    /// the turnstile, `Ok(false)` while still queued. An error means the
    /// turnstile is lost (connection gone, statement cancelled); the ticket
    /// is then spent.
    pub(crate) async fn wait_until(&mut self, until: Instant) -> Result<bool, sqlx::Error> {
        let queued = match &mut self.state {
            State::Queued(queued) => queued,
            State::Holding(_) => return Ok(true),
            State::Left => return Err(sqlx::Error::Protocol("the turnstile was left".into())),
        };
        match tokio::time::timeout_at(until, queued.as_mut()).await {
            Err(_) => Ok(false),
            Ok((conn, Ok(()))) => {
                self.state = State::Holding(conn);
                Ok(true)
            }
            Ok((_closed, Err(error))) => {
                self.state = State::Left;
                Err(error)
            }
        }
    }

    /// The connection of a held turnstile, inside its transaction.
    pub(crate) fn connection(&mut self) -> Option<&mut PgConnection> {
        match &mut self.state {
            State::Holding(conn) => Some(conn),
            _ => None,
        }
    }

    /// Commits the turnstile's transaction: what ran in it takes effect,
    /// and the next waiter's turn begins, at the same instant. Keeps the
    /// connection; on error it is closed (which rolls back).
    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        if let State::Holding(mut conn) = std::mem::replace(&mut self.state, State::Left) {
            conn.execute("COMMIT").await?;
            self.shared.idle().push(conn);
        }
        Ok(())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let State::Holding(conn) = std::mem::replace(&mut self.state, State::Left) else {
            // Queued: dropping the request closes its connection.
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (shared, permit) = (self.shared.clone(), self.permit.take());
            runtime.spawn(async move {
                shared.leave(conn).await;
                drop(permit);
            });
        }
        // Without a runtime the connection closes here, which ends its
        // transaction and the lock with it.
    }
}
