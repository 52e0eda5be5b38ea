//! The connections lock statements run on: the backend's own small pool,
//! or a caller's sqlx pool.
//!
//! The own pool is a stack of idle connections under a semaphore, and
//! costs nothing per operation beyond the statement itself. A sqlx pool
//! pings every connection it gets back (one more round trip per operation,
//! in a task of its own), which is why `connect` does not use one.
//!
//! A connection whose statement ended without the server's answer (timeout,
//! broken connection, or the caller dropping the operation mid-flight) is
//! in doubt and closed, never reused: its late reply would be taken for the
//! next statement's.
//!
//! Closing the own pool waits for the operations in flight, then closes
//! every connection; a caller's pool is left open (it is the caller's).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lockcore::LockError;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor, PgPool, Postgres};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error;
use crate::fence::failover::OnConnect;
use crate::locks::sql::PIN_ISOLATION;

/// Where lock statements get their connection.
#[derive(Clone)]
pub(crate) enum Pool {
    Own(Arc<Own>),
    Caller(PgPool),
}

pub(crate) struct Own {
    options: PgConnectOptions,
    /// Run on every new connection before its first statement.
    on_connect: Arc<OnConnect>,
    /// Connections whose last statement completed, for reuse.
    idle: Mutex<Vec<PgConnection>>,
    /// One per connection, idle or in use.
    permits: Arc<Semaphore>,
    size: u32,
}

impl Pool {
    /// A pool of at most `size` connections opened with `options` on
    /// demand, each pinned to READ COMMITTED and checked for a failover
    /// (`on_connect`), starting with `first` (the connection `connect`
    /// probed the server on, already pinned; `connect` checks it).
    pub(crate) fn own(
        options: PgConnectOptions,
        size: u32,
        first: PgConnection,
        on_connect: Arc<OnConnect>,
    ) -> Pool {
        Pool::Own(Arc::new(Own {
            options,
            on_connect,
            idle: Mutex::new(vec![first]),
            permits: Arc::new(Semaphore::new(size as usize)),
            size,
        }))
    }

    /// A connection for one operation, `what`, within `limit` (waiting for
    /// a free connection and connecting count against it).
    pub(crate) async fn checkout(
        &self,
        what: &'static str,
        limit: Duration,
    ) -> Result<Checkout, LockError> {
        let deadline = Instant::now() + limit;
        let conn = tokio::time::timeout_at(deadline, self.connection()).await;
        match conn {
            Ok(Ok(conn)) => Ok(Checkout {
                conn,
                deadline,
                limit,
                what,
                in_doubt: false,
            }),
            Ok(Err(e)) => Err(error::map(e)),
            Err(_) => Err(error::timed_out(what, limit)),
        }
    }

    async fn connection(&self) -> Result<Conn, sqlx::Error> {
        match self {
            Pool::Caller(pool) => Ok(Conn::Caller(pool.acquire().await?)),
            Pool::Own(own) => {
                let permit = own
                    .permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| sqlx::Error::PoolClosed)?;
                let idle = own.idle().pop();
                let conn = match idle {
                    Some(conn) => conn,
                    None => {
                        let mut conn = PgConnection::connect_with(&own.options).await?;
                        conn.execute(PIN_ISOLATION).await?;
                        own.on_connect.run(&mut conn).await?;
                        conn
                    }
                };
                Ok(Conn::Own {
                    conn: Some(conn),
                    pool: own.clone(),
                    _permit: permit,
                })
            }
        }
    }

    /// Closes the own pool: waits (up to `limit`) for the operations in
    /// flight to hand their connections back, refuses later checkouts, and
    /// closes every connection, each with a `Terminate`. A caller's pool
    /// stays open: only later checkouts are refused.
    pub(crate) async fn close(&self, limit: Duration) {
        let Pool::Own(own) = self else {
            return;
        };
        let deadline = Instant::now() + limit;
        // Every permit back: nothing is in flight any more.
        let all = own.permits.acquire_many(own.size);
        let _in_flight_done = tokio::time::timeout_at(deadline, all).await;
        own.permits.close();
        let idle = std::mem::take(&mut *own.idle());
        let closing = idle.into_iter().map(|conn| conn.close());
        let _ = tokio::time::timeout_at(deadline, futures_util::future::join_all(closing)).await;
    }

    /// Whether [`close`](Self::close) closed the own pool.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Pool::Own(own) => own.permits.is_closed(),
            Pool::Caller(_) => false,
        }
    }

    /// Connections the pool may open.
    pub(crate) fn size(&self) -> u32 {
        match self {
            Pool::Own(own) => own.size,
            Pool::Caller(pool) => pool.options().get_max_connections(),
        }
    }
}

impl Own {
    // Updates are single vector operations; a panic cannot leave it torn.
    fn idle(&self) -> MutexGuard<'_, Vec<PgConnection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

enum Conn {
    Own {
        conn: Option<PgConnection>,
        pool: Arc<Own>,
        _permit: OwnedSemaphorePermit,
    },
    Caller(PoolConnection<Postgres>),
}

/// One operation's connection.
pub(crate) struct Checkout {
    conn: Conn,
    deadline: Instant,
    limit: Duration,
    what: &'static str,
    in_doubt: bool,
}

impl Checkout {
    /// Runs one statement (or transaction) on the connection, until the
    /// operation's deadline.
    pub(crate) async fn run<'c, T, F>(
        &'c mut self,
        statement: impl FnOnce(&'c mut PgConnection) -> F,
    ) -> Result<T, LockError>
    where
        F: Future<Output = Result<T, sqlx::Error>> + 'c,
    {
        // In doubt until answered: dropped mid-flight, the connection closes.
        self.in_doubt = true;
        let conn = match &mut self.conn {
            Conn::Own { conn, .. } => conn.as_mut().expect("present until dropped"),
            Conn::Caller(conn) => &mut **conn,
        };
        match tokio::time::timeout_at(self.deadline, statement(conn)).await {
            Ok(Ok(value)) => {
                self.in_doubt = false;
                Ok(value)
            }
            Ok(Err(e)) => {
                // The server answered with an error: nothing was done, and
                // the connection is fine. Anything else: in doubt.
                self.in_doubt = !matches!(e, sqlx::Error::Database(_));
                Err(error::map(e))
            }
            Err(_) => Err(error::timed_out(self.what, self.limit)),
        }
    }

    /// Whether the last statement may have taken effect without its answer
    /// arriving.
    pub(crate) fn in_doubt(&self) -> bool {
        self.in_doubt
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        match &mut self.conn {
            Conn::Own { conn, pool, .. } => {
                if let Some(conn) = conn.take()
                    && !self.in_doubt
                    && !pool.permits.is_closed()
                {
                    pool.idle().push(conn);
                }
                // In doubt (or the pool closed meanwhile): dropping the
                // connection closes its socket.
            }
            Conn::Caller(conn) => {
                if self.in_doubt {
                    conn.close_on_drop();
                }
            }
        }
    }
}
