//! `PostgresBackend`: the lease table, as a `LockBackend`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{LockRequest, Moment, Polling, Ttl, WaitPolicy, Wakeup, async_trait};
use lockcore::{
    Attempt, Capabilities, ExpiryClock, Fairness, FenceDurability, FencingToken, Holder, Lease,
    LockBackend, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{Connection, Executor, PgPool, Postgres};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::{PostgresConfig, Server, Source};
use crate::error::{self, BACKEND};
use crate::notify::{Holding, Wakeups};
use crate::sql::{self, Sql};
use crate::turnstile::{HeldTurnstile, Turnstiles};

/// The oldest server this crate runs on (`hashtextextended`, `ON CONFLICT`).
const MIN_SERVER_VERSION: i32 = 110_000;

/// How long a lease must have been free (or expired) before a waiter
/// queued at its turnstile takes it past whoever holds the turnstile: a
/// holder that stopped renewing (paused, hung) keeps its turnstile until
/// the server notices, and a turnstile holder that waits for the lease
/// itself retries right at its expiry, well within this.
const TAKE_PAST_AFTER: Duration = Duration::from_millis(50);

/// How long after a lease's expiry a waiter queued behind a stalled
/// turnstile holder may still be waiting (beyond round trips): the wait
/// above, and one retry when its timer fired a little early.
const EXPIRY_SLACK: Duration = Duration::from_millis(100);

/// Eviction notices travel as a NOTIFY to the holder's listener connection:
/// one hop after the eviction commits.
const EVICTION_NOTICE: Duration = Duration::from_millis(100);

/// What a lease of this backend carries: the turnstile it keeps, and its
/// registration for eviction notices.
struct Held {
    turnstile: HeldTurnstile,
    eviction: Holding,
}

/// Locks in a PostgreSQL table, fenced by a sequence, with waiters queued
/// first come, first served in the server's lock manager and woken by
/// LISTEN/NOTIFY. See the crate docs for the design and its guarantees.
///
/// Clones share one connection pool and one listener: to model separate
/// processes, connect several backends.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    sql: Sql,
    connect_timeout: Duration,
    caps: Capabilities,
    op_timeout: Duration,
    server: String,
    wakeups: Wakeups,
    turnstiles: Turnstiles,
}

/// What the server said about itself at connect.
struct Facts {
    version: i32,
    encoding: String,
    fsync: String,
    synchronous_commit: String,
    default_isolation: String,
    objects_exist: bool,
}

impl PostgresBackend {
    /// Connects to the server `url` names (`postgres://user:password@host:port/db?sslmode=...`),
    /// creating the lock table and sequence if they are missing.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL or option,
    /// [`LockError::Unavailable`] when the server cannot be reached within the
    /// connect timeout (saying why: refused, no answer...), [`LockError::Store`]
    /// when it refuses us (authentication, a missing database, permissions,
    /// an unsupported server).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(PostgresConfig::from_url(url)?).await
    }

    /// Uses `pool` for lock statements (default table and schema); the
    /// listener opens one extra connection with the pool's connect options.
    /// The pool's sessions must run at READ COMMITTED (PostgreSQL's
    /// default); set it in the pool's `after_connect` if the server's
    /// default is stricter.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn from_pool(pool: PgPool) -> Result<Self, LockError> {
        Self::connect_with(PostgresConfig::from_pool(pool)).await
    }

    /// Connects with a full configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let (schema, table, sequence) = config.idents()?;
        let sql = Sql::new(&schema, &table, &sequence);
        let op_timeout = config.op_timeout;
        let connect_timeout = config.connect_timeout;
        let (pool, options, facts) = match config.source {
            Source::Options(options) => {
                let options = if options.get_application_name().is_none() {
                    options.application_name("distlock")
                } else {
                    *options
                };
                let server = Server(&options).to_string();
                // The first connection is opened here, not by the pool: the
                // pool retries a refused connection until its timeout and
                // then reports only that it timed out.
                let facts = probe_first(&options, &sql, connect_timeout, &server).await?;
                let pool = PgPoolOptions::new()
                    .max_connections(config.pool_size)
                    .min_connections(0)
                    .acquire_timeout(op_timeout)
                    // sqlx would otherwise ping before every statement: one
                    // round trip per lock operation for nothing; a dead
                    // connection fails the statement, which is retryable.
                    .test_before_acquire(false)
                    .after_connect(|conn, _| {
                        Box::pin(async move { conn.execute(sql::PIN_ISOLATION).await.map(drop) })
                    })
                    .connect_lazy_with(options.clone());
                (pool, options, facts)
            }
            Source::Pool(pool) => {
                let options: PgConnectOptions = (*pool.connect_options()).clone();
                let facts = timed("connect", op_timeout, async {
                    let mut conn = pool.acquire().await?;
                    probe(&mut conn, &sql).await
                })
                .await?;
                if facts.default_isolation != "read committed" {
                    return Err(LockError::config(format!(
                        "{}: the pool's sessions run at {}; lock statements need READ COMMITTED \
                         (run `{}` in the pool's after_connect)",
                        Server(&options),
                        facts.default_isolation.to_uppercase(),
                        sql::PIN_ISOLATION
                    )));
                }
                (pool, options, facts)
            }
        };
        let server = Server(&options).to_string();
        if facts.version < MIN_SERVER_VERSION {
            return Err(LockError::store(
                BACKEND,
                format!(
                    "{server} runs PostgreSQL {}; lock-postgres needs 11 or later",
                    facts.version
                ),
            ));
        }
        if facts.encoding != "UTF8" {
            return Err(LockError::config(format!(
                "{server}: the database encoding is {}; lock names are UTF-8, so the database must use UTF8",
                facts.encoding
            )));
        }
        if !facts.objects_exist {
            if !config.create_schema {
                return Err(LockError::config(format!(
                    "{server}: {} or {} is missing and create_schema is off; create them (see the lock-postgres README) or turn create_schema on",
                    sql.table_regclass, sql.sequence_regclass
                )));
            }
            timed("schema creation", op_timeout, create_schema(&pool, &sql)).await?;
        }
        let durability = if facts.fsync == "on" && facts.synchronous_commit != "off" {
            FenceDurability::Durable
        } else {
            tracing::warn!(
                %server, fsync = %facts.fsync, synchronous_commit = %facts.synchronous_commit,
                "PostgreSQL runs with relaxed durability: fencing tokens survive a server crash but may go back after an OS crash or power loss"
            );
            FenceDurability::Conditional(
                "the server runs with fsync or synchronous_commit off: fences survive a PostgreSQL crash, not an OS crash or power loss",
            )
        };
        let caps = Capabilities::new(BACKEND)
            .expiry_clock(ExpiryClock::StoreWallClock)
            .expiry_slack(EXPIRY_SLACK)
            .eviction_notice(Some(EVICTION_NOTICE))
            // Below ~10 ms a lease would be spent by one round trip plus the
            // drift margin before the caller could use it.
            .ttl_range(
                Duration::from_millis(10),
                Duration::from_secs(365 * 24 * 3600),
            )
            // timestamptz has microsecond resolution; TTLs are sent in µs.
            .ttl_granularity(Duration::from_micros(1))
            .fence_durability(durability)
            .notifications(true)
            .fairness(if config.turnstiles > 0 {
                Fairness::Fifo
            } else {
                Fairness::None
            });
        let turnstiles = Turnstiles::new(
            options.clone(),
            config.turnstiles,
            facts.version,
            op_timeout,
        );
        let wakeups = Wakeups::new(
            options,
            (sql.channel.clone(), sql.evict_channel.clone()),
            op_timeout,
            pool.clone(),
            sql.gone.clone(),
        );
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                pool,
                sql,
                connect_timeout,
                caps,
                op_timeout,
                server,
                wakeups,
                turnstiles,
            }),
        })
    }

    /// The pool lock statements run on; handy for [`fence_check`](crate::fence_check)
    /// transactions when the protected data lives in the same database.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The lock table, schema-qualified and quoted.
    pub fn table(&self) -> &str {
        &self.inner.sql.table_regclass
    }

    /// The NOTIFY channel waiters listen on.
    pub fn channel(&self) -> &str {
        &self.inner.sql.channel
    }

    /// Deletes the rows of names that have been free for at least
    /// `older_than`, and returns how many. Released rows are kept so a
    /// name's row outlives its holders; call this from a periodic job when
    /// names are many and short-lived. Fences stay monotonic regardless:
    /// they come from the sequence, not the row.
    ///
    /// # Errors
    /// A store error; [`LockError::InvalidTimeout`] for an age that does not fit.
    pub async fn purge_free(&self, older_than: Duration) -> Result<u64, LockError> {
        let micros = micros(older_than).ok_or_else(|| LockError::InvalidTimeout {
            timeout: older_than,
            reason: "the age does not fit PostgreSQL's interval".into(),
        })?;
        let sql = format!(
            "DELETE FROM {} WHERE expires_at <= clock_timestamp()
               AND updated_at < clock_timestamp() - $1 * interval '1 microsecond'",
            self.inner.sql.table_regclass
        );
        let mut op = self.checkout("purge").await?;
        let done = op
            .run(|c| sqlx::query(&sql).bind(micros).execute(c))
            .await?;
        Ok(done.rows_affected())
    }

    /// Waiting `acquire` calls of this instance (in its local line, at the
    /// turnstile, or waiting for the lease).
    pub fn waiting(&self) -> usize {
        self.inner.turnstiles.waiting()
    }

    /// The advisory-lock key waiters of `name` queue on (`pg_locks.objid`
    /// holds its low 32 bits, `classid` its high 32 bits, `objsubid` is 1):
    /// handy for seeing who waits, never needed to take a lock.
    pub fn turnstile_key(&self, name: &LockName) -> i64 {
        sql::turnstile_key(&self.inner.sql.table_regclass, name.as_str())
    }

    /// One attempt; with `free_for` > 0, only takes a row that has been
    /// free at least that long on the server's clock.
    async fn attempt(
        &self,
        name: &LockName,
        ttl: Ttl,
        free_for: Duration,
    ) -> Result<Attempt, LockError> {
        let ttl_us = micros(ttl.get()).ok_or_else(|| LockError::InvalidTtl {
            ttl: ttl.get(),
            reason: "does not fit PostgreSQL's interval".into(),
        })?;
        let free_for_us = micros(free_for).unwrap_or(i64::MAX);
        let owner = OwnerToken::new();
        // Counted from before the wait for a connection: the local deadline
        // may only be early.
        let sent_at = Moment::now();
        let mut op = self.checkout("acquire").await?;
        // Registered before it is sent: an eviction right after the grant
        // must find it.
        let pending = self.inner.wakeups.expect(name.as_str(), owner.as_uuid());
        let rows: Vec<(Option<i64>, Option<i64>)> = match op
            .run(|c| {
                sqlx::query_as(&self.inner.sql.acquire)
                    .bind(name.as_str())
                    .bind(owner.as_uuid())
                    .bind(ttl_us)
                    .bind(free_for_us)
                    .fetch_all(c)
            })
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                if op.in_doubt() {
                    self.forget_later(name, owner, sent_at.mono() + ttl.get());
                }
                return Err(e);
            }
        };
        // A grant row wins over a holder row: the holder seen by the
        // snapshot may have expired by the time the row was locked.
        if let Some(fence) = rows.iter().find_map(|(fence, _)| *fence) {
            let token = fence_token(fence)?;
            let (lost, eviction) = pending.granted(fence);
            return Ok(Attempt::Acquired(
                Lease::new(name.clone(), owner, token, ttl, sent_at)
                    .with_loss_signal(lost)
                    .with_extension(Held {
                        turnstile: HeldTurnstile::default(),
                        eviction,
                    }),
            ));
        }
        // No row: a contender is taking the lock right now, or took it after
        // this statement's snapshot (or it has not been free for `free_for`).
        Ok(Attempt::Held {
            expires_in: rows.iter().find_map(|(_, left)| left.map(from_micros)),
        })
    }

    /// A pooled connection for one operation, within its time limit.
    async fn checkout(&self, what: &'static str) -> Result<Checkout, LockError> {
        let limit = self.inner.op_timeout;
        let deadline = Instant::now() + limit;
        match tokio::time::timeout_at(deadline, self.inner.pool.acquire()).await {
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

    /// Frees, in the background, what the acquire by `owner` may have got
    /// when its reply was lost, so the name is not blocked for a whole TTL
    /// by a grant nobody will use. Owner-checked (the owner token belongs to
    /// that one attempt), so it never frees anyone else's grant. Retries
    /// until the server answers, `until` passes (by then the grant has
    /// expired) or the backend is dropped. An acquire still in flight when
    /// the cleanup runs can still grant later; that grant expires.
    fn forget_later(&self, name: &LockName, owner: OwnerToken, until: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        let name = name.clone();
        runtime.spawn(async move {
            let retry = lockcore::Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
            for attempt in 0_u32.. {
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let backend = PostgresBackend { inner };
                let outcome = match backend.checkout("cleanup").await {
                    Ok(mut op) => {
                        let sql = &backend.inner.sql;
                        op.run(|c| {
                            sqlx::query_scalar::<_, i64>(&sql.forget)
                                .bind(name.as_str())
                                .bind(owner.as_uuid())
                                .bind(&sql.channel)
                                .fetch_one(c)
                        })
                        .await
                    }
                    Err(e) => Err(e),
                };
                drop(backend);
                match outcome {
                    Ok(freed) => {
                        if freed > 0 {
                            tracing::debug!(lock = %name, "freed the grant of an acquire whose reply was lost");
                        }
                        return;
                    }
                    Err(e) if e.is_retryable() => {
                        let next = Instant::now() + retry.delay(attempt);
                        if next >= until {
                            return;
                        }
                        tokio::time::sleep_until(next).await;
                    }
                    Err(e) => {
                        tracing::debug!(lock = %name, error = %e, "could not free the grant of an acquire whose reply was lost; it expires");
                        return;
                    }
                }
            }
        });
    }
}

/// One operation's pooled connection. A statement that ends without the
/// server's answer (timeout, broken connection) leaves the connection in
/// doubt: it is closed, never pooled, since a late reply would be taken
/// for the next statement's.
struct Checkout {
    conn: PoolConnection<Postgres>,
    deadline: Instant,
    limit: Duration,
    what: &'static str,
    in_doubt: bool,
}

impl Checkout {
    /// Runs one statement (or transaction) on the connection, until the
    /// operation's deadline.
    async fn run<'c, T, F>(
        &'c mut self,
        statement: impl FnOnce(&'c mut PgConnection) -> F,
    ) -> Result<T, LockError>
    where
        F: Future<Output = Result<T, sqlx::Error>> + 'c,
    {
        let sent = statement(&mut self.conn);
        match tokio::time::timeout_at(self.deadline, sent).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                // The server answered with an error: nothing was done, and
                // the connection is fine. Anything else: in doubt.
                self.in_doubt = !matches!(e, sqlx::Error::Database(_));
                Err(error::map(e))
            }
            Err(_) => {
                self.in_doubt = true;
                Err(error::timed_out(self.what, self.limit))
            }
        }
    }

    /// Whether the last statement may have taken effect without its answer
    /// arriving.
    fn in_doubt(&self) -> bool {
        self.in_doubt
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if self.in_doubt {
            self.conn.close_on_drop();
        }
    }
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("server", &self.inner.server)
            .field("table", &self.inner.sql.table_regclass)
            .field(
                "pool_size",
                &self.inner.pool.options().get_max_connections(),
            )
            .field("op_timeout", &self.inner.op_timeout)
            .field("connect_timeout", &self.inner.connect_timeout)
            .field("wakeups", &self.inner.wakeups)
            .field("turnstiles", &self.inner.turnstiles)
            .finish()
    }
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    /// Never waits, never queues: a free lock is taken whoever waits for it.
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.attempt(request.name(), request.ttl(), Duration::ZERO)
            .await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let not_held = || LockError::NotHeld {
            name: lease.name().clone(),
        };
        // A lease whose fence or TTL this backend could never have issued
        // is not ours: NotHeld, without asking the server.
        let Some(fence) = db_fence(lease.fence()) else {
            return Err(not_held());
        };
        let ttl_us = micros(lease.ttl()).ok_or_else(not_held)?;
        let sent_at = Moment::now();
        let mut op = self.checkout("renew").await?;
        let done = op
            .run(|c| {
                sqlx::query(&self.inner.sql.renew)
                    .bind(lease.name().as_str())
                    .bind(lease.owner().as_uuid())
                    .bind(fence)
                    .bind(ttl_us)
                    .execute(c)
            })
            .await?;
        if done.rows_affected() == 1 {
            Ok(lease.renewed(sent_at))
        } else {
            end_turn(lease);
            Err(not_held())
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let Some(fence) = db_fence(lease.fence()) else {
            end_turn(lease);
            return Ok(ReleaseOutcome::NotHeld);
        };
        let release = || {
            sqlx::query_scalar::<_, i64>(&self.inner.sql.release)
                .bind(lease.name().as_str())
                .bind(lease.owner().as_uuid())
                .bind(fence)
                .bind(&self.inner.sql.channel)
        };
        let outcome = |released: i64| {
            if released == 1 {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            }
        };
        // A lease let in by a turnstile still holds it: release in the
        // turnstile's transaction, so the commit that frees the row is the
        // very one that lets the next waiter in, who finds it free.
        if let Some(mut ticket) = lease
            .extension::<Held>()
            .and_then(|held| held.turnstile.take())
            && let Some(conn) = ticket.connection()
        {
            match timed(
                "release",
                self.inner.op_timeout,
                release().fetch_one(&mut *conn),
            )
            .await
            {
                Ok(released) => {
                    // A lost COMMIT reply is a lost release reply: the lease
                    // may be free or not; the caller sees a retryable error.
                    timed("release", self.inner.op_timeout, ticket.commit()).await?;
                    forget_eviction(lease);
                    return Ok(outcome(released));
                }
                // Nothing was committed (the turnstile's connection broke, or
                // the server ended the session): dropping the ticket rolls
                // back, and the release runs on its own below.
                Err(error) => {
                    tracing::debug!(name = %lease.name(), %error, "release in the turnstile failed; releasing alone");
                }
            }
        }
        let mut op = self.checkout("release").await?;
        let released = op.run(|c| release().fetch_one(c)).await?;
        forget_eviction(lease);
        Ok(outcome(released))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let mut op = self.checkout("inspect").await?;
        let row: Option<(i64, Option<Uuid>, i64)> = op
            .run(|c| {
                sqlx::query_as(&self.inner.sql.inspect)
                    .bind(name.as_str())
                    .fetch_optional(c)
            })
            .await?;
        row.map(holder).transpose()
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let sql = &self.inner.sql;
        let mut op = self.checkout("force release").await?;
        op.run(|c| async move {
            let mut tx = c.begin_with(sql::BEGIN).await?;
            let row: Option<(i64, Option<Uuid>, i64)> = sqlx::query_as(&sql.force_select)
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            let row = row.filter(|(fence, _, _)| {
                expected.is_none_or(|expected| u64::try_from(*fence).ok() == Some(expected.get()))
            });
            if let Some((fence, owner, _)) = row {
                sqlx::query(&sql.force_free)
                    .bind(name.as_str())
                    .execute(&mut *tx)
                    .await?;
                // Waiters learn the name is free; the evicted holder (if
                // connected) that its grant is gone.
                sqlx::query(sql.notify)
                    .bind(&sql.channel)
                    .bind(name.as_str())
                    .execute(&mut *tx)
                    .await?;
                if let Some(owner) = owner {
                    sqlx::query(sql.notify)
                        .bind(&sql.evict_channel)
                        .bind(format!("{fence} {owner} {}", name.as_str()))
                        .execute(&mut *tx)
                        .await?;
                }
            }
            tx.commit().await?;
            Ok(row)
        })
        .await?
        .map(holder)
        .transpose()
    }

    async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        Ok(self.inner.wakeups.watch(name).await)
    }

    /// Waits in line (see the crate docs): behind this instance's earlier
    /// waiters of `name`, then in the server's queue at the name's
    /// turnstile. The turnstile holder alone asks for the lease (at once,
    /// then with lockcore's wait loop), and the lease it gets keeps the
    /// turnstile until it is released. Without a turnstile (turned off,
    /// none to spare, connection lost) the first local waiter runs
    /// lockcore's wait loop alone.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the local line and the server's queue
    /// (the queued connection is closed; a held turnstile is rolled back
    /// in the background), so the next waiter goes on.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let (name, ttl) = (request.name(), request.ttl());
        let turnstiles = &self.inner.turnstiles;
        let Ok(_turn) =
            tokio::time::timeout_at(wait.deadline, turnstiles.local_turn(name.as_str())).await
        else {
            return Ok(None);
        };
        let Some(mut ticket) = turnstiles.enter(self.turnstile_key(name)).await else {
            tracing::debug!(lock = %name, "no turnstile to spare; waiting without one");
            return lockcore::wait::wait(wait, &mut Polling::new(self, request)).await;
        };
        // While queued, look at the lease soon (to learn when it expires),
        // then at its expiry, and at least every re-check interval: if it
        // has been free or expired for TAKE_PAST_AFTER, whoever holds the
        // turnstile is not taking it (a holder that stopped renewing, a
        // hung waiter, a name whose key collides with ours); take it past
        // them. Dropping the ticket leaves the queue.
        let mut look_at = Instant::now() + TAKE_PAST_AFTER.min(wait.recheck);
        loop {
            match ticket.wait_until(look_at.min(wait.deadline)).await {
                Ok(true) => break,
                Ok(false) if Instant::now() >= wait.deadline => return Ok(None),
                Ok(false) => {
                    let next = match self.attempt(name, ttl, TAKE_PAST_AFTER).await {
                        Ok(Attempt::Acquired(lease)) => {
                            tracing::debug!(lock = %name, "the turnstile's holder left the lease free; took it past them");
                            return Ok(Some(lease));
                        }
                        // Just past the holder's expiry (by the server's count).
                        Ok(Attempt::Held {
                            expires_in: Some(left),
                        }) => left + TAKE_PAST_AFTER + Duration::from_millis(1),
                        // Free or expired, but not for long enough yet (or
                        // being taken right now): look again shortly.
                        Ok(Attempt::Held { expires_in: None }) => TAKE_PAST_AFTER / 2,
                        Err(e) if e.is_retryable() => wait.recheck,
                        Err(e) => return Err(e),
                    };
                    look_at = Instant::now() + next.min(wait.recheck);
                }
                Err(error) => {
                    tracing::debug!(lock = %name, %error, "turnstile connection lost; waiting without one");
                    return lockcore::wait::wait(wait, &mut Polling::new(self, request)).await;
                }
            }
        }
        // Our turn. Most often the lease was just released by the previous
        // turnstile holder (which held the turnstile until then): try at
        // once, before setting up wake-ups.
        let lease = match self.attempt(name, ttl, Duration::ZERO).await {
            Ok(Attempt::Acquired(lease)) => Some(lease),
            Ok(Attempt::Held { .. }) => {
                lockcore::wait::wait(wait, &mut Polling::new(self, request)).await?
            }
            Err(e) if e.is_retryable() => {
                lockcore::wait::wait(wait, &mut Polling::new(self, request)).await?
            }
            Err(e) => return Err(e),
        };
        // The lease keeps the turnstile until it is released (or renewing
        // finds it gone, or the lease is dropped): the next waiter's turn
        // begins exactly when this lease ends, and it finds it free.
        if let Some(held) = lease.as_ref().and_then(|l| l.extension::<Held>()) {
            held.turnstile.keep(ticket);
        }
        Ok(lease)
    }
}

async fn timed<T>(
    what: &str,
    limit: Duration,
    op: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(limit, op).await {
        Ok(result) => result.map_err(error::map),
        Err(_) => Err(error::timed_out(what, limit)),
    }
}

/// Opens one connection within `connect_timeout` and reads the server's
/// facts on it, so a server that cannot be reached or refuses us is
/// reported at once, with its cause.
async fn probe_first(
    options: &PgConnectOptions,
    sql: &Sql,
    connect_timeout: Duration,
    server: &str,
) -> Result<Facts, LockError> {
    let connected = tokio::time::timeout(connect_timeout, PgConnection::connect_with(options));
    let mut conn = match connected.await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(error::connecting(server, e)),
        Err(_) => {
            return Err(LockError::unavailable(
                BACKEND,
                format!(
                    "connecting to {server}: no connection within the connect timeout {connect_timeout:?}"
                ),
            ));
        }
    };
    let facts = timed("connect", connect_timeout, probe(&mut conn, sql)).await;
    // Close in the background: a server that answered the probe can be
    // trusted to take a Terminate, but the caller need not wait for it.
    tokio::spawn(async move {
        let _ = tokio::time::timeout(connect_timeout, conn.close()).await;
    });
    facts
}

async fn probe(conn: &mut PgConnection, sql: &Sql) -> Result<Facts, sqlx::Error> {
    let (version, encoding, fsync, synchronous_commit, default_isolation, objects_exist): (
        i32,
        String,
        String,
        String,
        String,
        bool,
    ) = sqlx::query_as(sql.probe)
        .bind(&sql.table_regclass)
        .bind(&sql.sequence_regclass)
        .bind(&sql.resource_fence_regclass)
        .fetch_one(conn)
        .await?;
    Ok(Facts {
        version,
        encoding,
        fsync,
        synchronous_commit,
        default_isolation,
        objects_exist,
    })
}

/// Creates what is missing, serialised by an advisory lock so concurrent
/// first uses cannot race on the catalog.
async fn create_schema(pool: &PgPool, sql: &Sql) -> Result<(), sqlx::Error> {
    let ddl = &sql.ddl;
    let mut tx = pool.begin_with(sql::BEGIN).await?;
    sqlx::query(ddl.lock)
        .bind(format!("distlock ddl {}", sql.table_regclass))
        .execute(&mut *tx)
        .await?;
    // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when
    // the schema exists; only try it when it is missing.
    let schema_exists: bool = sqlx::query_scalar(ddl.schema_exists)
        .bind(sql.schema.as_str())
        .fetch_one(&mut *tx)
        .await?;
    if !schema_exists {
        sqlx::query(&ddl.create_schema).execute(&mut *tx).await?;
    }
    let sequence_existed: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&sql.sequence_regclass)
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query(&ddl.create_sequence).execute(&mut *tx).await?;
    sqlx::query(&ddl.create_table).execute(&mut *tx).await?;
    if !sequence_existed {
        sqlx::query(&ddl.resync_sequence).execute(&mut *tx).await?;
    }
    sqlx::query(&ddl.create_resource_fence)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Passes on the turnstile `lease` holds, if any (see `acquire`).
fn end_turn(lease: &Lease) {
    drop(
        lease
            .extension::<Held>()
            .and_then(|held| held.turnstile.take()),
    );
}

/// Stops watching for the eviction of a lease that was released.
fn forget_eviction(lease: &Lease) {
    if let Some(held) = lease.extension::<Held>() {
        held.eviction.forget();
    }
}

fn holder((fence, owner, remaining): (i64, Option<Uuid>, i64)) -> Result<Holder, LockError> {
    Ok(Holder::new(
        fence_token(fence)?,
        owner.map(OwnerToken::from_uuid),
        Some(from_micros(remaining)),
    ))
}

fn fence_token(value: i64) -> Result<FencingToken, LockError> {
    u64::try_from(value)
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| {
            error::corrupt(format!(
                "the lock table holds fence {value}, not a positive number"
            ))
        })
}

/// The fence as stored, if it could be one of ours (sequences stay below
/// `i64::MAX`).
fn db_fence(fence: FencingToken) -> Option<i64> {
    i64::try_from(fence.get()).ok()
}

fn micros(d: Duration) -> Option<i64> {
    i64::try_from(d.as_micros()).ok()
}

fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}
