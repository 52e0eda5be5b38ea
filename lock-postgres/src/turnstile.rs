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
//! The waiter holding the turnstile tries the lease at once, and, if it is
//! held, waits for it as any waiter does (NOTIFY, the holder's expiry,
//! re-checks). The lease it gets keeps the turnstile (the session keeps the
//! advisory lock, idle, no transaction open) while the lease is held, and
//! `release` runs on that connection: once the release has committed, the
//! connection lets go of the advisory lock (in the background: the caller
//! has its answer after one round trip), which lets the next waiter in, and
//! that waiter finds the lock free. A hand-off costs the next waiter's own
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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinHandle;

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
    /// (settings, not connection options, which some poolers refuse).
    setup: &'static str,
}

struct Shared {
    /// Connections whose last transaction ended cleanly, for reuse.
    idle: Mutex<Vec<PgConnection>>,
    op_timeout: Duration,
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
                op_timeout,
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
                 SET default_transaction_isolation = 'read committed';"
            } else {
                "SET statement_timeout = 0; SET lock_timeout = 0; \
                 SET default_transaction_isolation = 'read committed';"
            },
        }
    }

    /// Whether this instance may use turnstiles at all.
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// A place in the server's queue for `key`, on a connection of its own;
    /// `signal` is notified when the turn comes (or the place is lost).
    /// `None` when no turnstile connection can be had (all in use, or
    /// connecting failed): the caller then waits without.
    pub(crate) async fn enter(&self, key: i64, signal: Arc<Notify>) -> Option<Ticket> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        let idle = self.shared.idle().pop();
        // A new connection is set up in the same round trip as it queues.
        let (mut conn, setup) = match idle {
            Some(conn) => (conn, ""),
            None => {
                let connecting = PgConnection::connect_with(&self.options);
                match tokio::time::timeout(self.shared.op_timeout, connecting).await {
                    Ok(Ok(conn)) => (conn, self.setup),
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
        // `key` is an integer, safe to inline.
        let sql = format!("{setup} SELECT pg_advisory_lock({key})");
        let (sender, turn) = oneshot::channel();
        let queued = tokio::spawn(async move {
            // A bare string runs as a simple query: several statements.
            let result = conn.execute(sql.as_str()).await.map(drop);
            let _ = sender.send((conn, result));
            signal.notify_one();
        });
        Some(Ticket {
            state: State::Queued { queued, turn },
            shared: self.shared.clone(),
            permit: Some(permit),
        })
    }
}

impl fmt::Debug for Turnstiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turnstiles")
            .field("capacity", &self.capacity)
            .field(
                "in_use",
                &(self.capacity - self.permits.available_permits()),
            )
            .field("idle", &self.shared.idle().len())
            .finish()
    }
}

impl Shared {
    // Updates are single vector operations; a panic cannot leave them torn.
    fn idle(&self) -> MutexGuard<'_, Vec<PgConnection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets go of the turnstile (the session's advisory locks) and keeps
    /// the connection for the next waiter; any doubt closes it, which lets
    /// go just as well. Idle connections never outnumber the permits: one
    /// is only opened when none is idle.
    async fn leave(&self, mut conn: PgConnection) {
        let unlock = conn.execute("SELECT pg_advisory_unlock_all()");
        if let Ok(Ok(_)) = tokio::time::timeout(self.op_timeout, unlock).await {
            self.idle().push(conn);
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

/// What the queueing task hands back: its connection, and whether the
/// advisory lock was granted on it.
type Queued = (PgConnection, Result<(), sqlx::Error>);

enum State {
    /// In the server's queue: the task waits for the advisory lock.
    Queued {
        queued: JoinHandle<()>,
        turn: oneshot::Receiver<Queued>,
    },
    /// Holding the turnstile: the connection is idle, its session holding
    /// the advisory lock.
    Holding(PgConnection),
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
/// Dropped while queued, it closes its connection (the server then drops
/// the waiter); dropped while holding, it lets go in the background (or
/// closes the connection when there is no runtime), so the next waiter
/// goes on.
pub(crate) struct Ticket {
    state: State,
    shared: Arc<Shared>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Ticket {
    /// Whether this ticket's turn has come, without waiting.
    pub(crate) fn turn(&mut self) -> Turn {
        let State::Queued { turn, .. } = &mut self.state else {
            return match self.state {
                State::Holding(_) => Turn::Mine,
                _ => Turn::Lost(sqlx::Error::Protocol("the turnstile was left".into())),
            };
        };
        match turn.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => Turn::Waiting,
            Ok((conn, Ok(()))) => {
                self.state = State::Holding(conn);
                Turn::Mine
            }
            Ok((_closed, Err(error))) => {
                self.state = State::Left;
                Turn::Lost(error)
            }
            Err(oneshot::error::TryRecvError::Closed) => {
                self.state = State::Left;
                Turn::Lost(sqlx::Error::WorkerCrashed)
            }
        }
    }

    /// The connection of a held turnstile.
    pub(crate) fn connection(&mut self) -> Option<&mut PgConnection> {
        match &mut self.state {
            State::Holding(conn) => Some(conn),
            _ => None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, State::Left) {
            // Queued: stopping the task drops its request and closes its
            // connection (and a connection already handed back, unread,
            // closes with the receiver).
            State::Queued { queued, .. } => queued.abort(),
            State::Holding(conn) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let (shared, permit) = (self.shared.clone(), self.permit.take());
                    runtime.spawn(async move {
                        shared.leave(conn).await;
                        drop(permit);
                    });
                }
                // Without a runtime the connection closes here, which ends
                // its session and the lock with it.
            }
            State::Left => {}
        }
    }
}
