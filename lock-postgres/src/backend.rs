//! `PostgresBackend`: connect, close, and the `LockBackend` impl (each
//! method delegating to the client, the waiter or the listener).

pub mod testing;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lockcore::backend::wait::{self, LocalLine, WaitPolicy, Wakeup};
use lockcore::backend::{
    CancellationToken, Cleanups, Era, Kind, LockRequest, Polling, Ttl, async_trait,
};
use lockcore::{
    Attempt, AttemptEach, Capabilities, ExpiryClock, Fairness, FencingToken, Holder, Lease,
    LockBackend, LockError, LockName, ReleaseOutcome,
};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::{PostgresConfig, Server, Source};
use crate::connection::{Client, Facts, Pool};
use crate::error::BACKEND;
use crate::fence::ResourceFence;
use crate::fence::failover::{EpochSql, OnConnect};
use crate::keys;
use crate::keys::schema::{Ddl, RESOURCE_FENCE_TABLE};
use crate::locks::Take;
use crate::locks::sql::Sql;
use crate::rw;
use crate::wait::notify::Wakeups;
use crate::wait::turnstile::Turnstiles;
use crate::wait::{EXPIRY_SLACK, listener};

/// Eviction notices travel as a NOTIFY to the holder's listener connection:
/// one hop after the eviction commits.
const EVICTION_NOTICE: Duration = Duration::from_millis(100);

/// Locks in a PostgreSQL table, fenced by a sequence, with waiters queued
/// first come, first served in the server's lock manager and woken by
/// LISTEN/NOTIFY; semaphores and reader-writer locks in tables beside it,
/// fenced by the same sequence. See the crate docs for the design and its
/// guarantees.
///
/// Clones share one connection pool and one listener: to model separate
/// processes, connect several backends.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Arc<Client>,
    caps: Capabilities,
    server: String,
    connect_timeout: Duration,
    turnstiles: Turnstiles,
    /// One waiter per name of this instance waits on the server.
    line: LocalLine,
    /// Waiting `acquire` calls, in the local line or beyond.
    waiting: Arc<AtomicUsize>,
    resource_fence: ResourceFence,
    /// What [`PostgresBackend::client`] hands out: the caller's pool, or
    /// one made on first use with `options`.
    caller_pool: OnceLock<PgPool>,
    options: PgConnectOptions,
    /// Held by `close` for its whole run; `true` once it has closed.
    closed: tokio::sync::Mutex<bool>,
}

impl Drop for Inner {
    /// A dropped backend can renew nothing: its leases count as lost.
    fn drop(&mut self) {
        self.client.closing.cancel();
    }
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
        let ddl = Ddl::new(&schema, &table, &sequence);
        let sql = Sql::new(&schema, &table, &ddl);
        let resource_fence = ResourceFence::new(schema.as_str(), RESOURCE_FENCE_TABLE)?;
        let (op_timeout, connect_timeout) = (config.op_timeout, config.connect_timeout);
        let closing = CancellationToken::new();
        let era = Arc::new(Era::new(closing.clone()));
        let on_connect = Arc::new(OnConnect {
            sql: EpochSql::new(&ddl.epoch, &ddl.sequence, &sql.lock_grants),
            era: era.clone(),
            lock_timeout: op_timeout,
            lock_delay: config.failover_lock_delay,
            table: ddl.table.clone(),
        });
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
                let (facts, first) =
                    Facts::first_connection(&options, &ddl, connect_timeout, &server).await?;
                let pool = Pool::own(options.clone(), config.pool_size, first, on_connect.clone());
                (pool, options, facts)
            }
            Source::Pool(pool) => {
                let options: PgConnectOptions = (*pool.connect_options()).clone();
                let server = Server(&options).to_string();
                let facts = Facts::of_pool(&pool, &ddl, op_timeout, &server).await?;
                (Pool::Caller(pool), options, facts)
            }
        };
        let server = Server(&options).to_string();
        facts.check(&server)?;
        if !facts.objects_exist {
            if !config.create_schema {
                return Err(LockError::config(format!(
                    "{server}: {} or its companions are missing, or were made by an older version (without the label columns or the reader-writer tables), and create_schema is off; run the DDL of the lock-postgres README or turn create_schema on",
                    ddl.table
                )));
            }
            // Part of connecting, and slower than a lock operation.
            let limit = op_timeout.max(connect_timeout);
            let mut op = pool.checkout("schema creation", limit).await?;
            op.run(|c| ddl.create(c)).await?;
        }
        // The connection opened above (or one of the caller's pool) ran
        // before the table was sure to exist: checked now. A caller's pool
        // is checked here only (README, "Failover to a standby").
        let mut op = pool
            .checkout("failover check", op_timeout.max(connect_timeout))
            .await?;
        op.run(|c| on_connect.run(c)).await?;
        drop(op);
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
            .fence_durability(facts.durability(&server))
            .failover(facts.failover(config.failover_lock_delay))
            .notifications(true)
            .semaphores(true)
            .rw_locks(true)
            .sets_remaining(true)
            .atomic_multi(true)
            .fence_floor(true)
            // The fence sequence is a bigint (`NO CYCLE`): it ends there.
            .max_fence(i64::MAX.unsigned_abs())
            .fairness(if config.turnstiles > 0 {
                Fairness::Fifo
            } else {
                Fairness::None
            });
        let cleanups = Cleanups::new();
        let turnstiles = Turnstiles::new(
            options.clone(),
            config.turnstiles,
            facts.version,
            op_timeout,
            (&sql, on_connect.clone()),
            pool.clone(),
            cleanups.clone(),
            closing.clone(),
        );
        let caller_pool = OnceLock::new();
        if let Pool::Caller(pool) = &pool {
            let _ = caller_pool.set(pool.clone());
        }
        let wakeups = Wakeups::new(
            listener::Config {
                options: options.clone(),
                channel: sql.channel.clone(),
                evict_channel: sql.evict_channel.clone(),
                table: sql.table.clone(),
                connect_timeout: op_timeout,
                pool: pool.clone(),
                gone: sql.gone.clone(),
            },
            era.clone(),
        );
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                client: Arc::new(Client {
                    cleanups,
                    closing,
                    era,
                    pool,
                    sql,
                    op_timeout,
                    wakeups,
                    intents: rw::Intents::default(),
                }),
                caps,
                server,
                connect_timeout,
                turnstiles,
                line: LocalLine::new(),
                waiting: Arc::default(),
                resource_fence,
                caller_pool,
                options,
                closed: tokio::sync::Mutex::new(false),
            }),
        })
    }

    /// `Unavailable` once closed, for every operation.
    fn open(&self) -> Result<(), LockError> {
        if self.inner.client.closing.is_cancelled() {
            return Err(LockError::unavailable(BACKEND, "this client was closed"));
        }
        Ok(())
    }

    /// The lock table, schema-qualified and quoted.
    pub fn table(&self) -> &str {
        &self.inner.client.sql.table
    }

    /// The resource fence table `connect` created next to the lock table
    /// (`<schema>.resource_fence`), for [`ResourceFence::write`].
    pub fn resource_fence(&self) -> ResourceFence {
        self.inner.resource_fence.clone()
    }

    /// Deletes the rows of names that have been free for at least
    /// `older_than`, and returns how many. Released rows are kept so a
    /// name's row outlives its holders; call this from a periodic job when
    /// names are many and short-lived (a lock row a grant is taking right
    /// now is left for the next purge). Reader-writer holders and writer
    /// intents that expired at least `older_than` ago go too (released ones
    /// are deleted at once). Fences stay monotonic regardless: they come
    /// from the sequence, not the row.
    ///
    /// # Errors
    /// A store error; [`LockError::InvalidTimeout`] for an age that does not fit.
    pub async fn purge_free(&self, older_than: Duration) -> Result<u64, LockError> {
        self.open()?;
        self.inner.client.purge_free(older_than).await
    }

    /// The store's own client: a sqlx pool on this backend's server, for
    /// the caller's own statements (such as [`fenced_write`](crate::fenced_write)
    /// in the transaction that writes the protected data). With
    /// [`from_pool`](Self::from_pool) it is that pool; otherwise a pool made
    /// on the first call with the backend's connect options (server,
    /// credentials, TLS), at most `pool_size` connections, each opened when
    /// first needed. The backend's own statements never use it. `close`
    /// closes a pool made here, never the caller's.
    pub fn client(&self) -> PgPool {
        let inner = &self.inner;
        inner
            .caller_pool
            .get_or_init(|| {
                PgPoolOptions::new()
                    .max_connections(inner.client.pool.size())
                    .acquire_timeout(inner.client.op_timeout)
                    .connect_lazy_with(inner.options.clone())
            })
            .clone()
    }
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let client = &self.inner.client;
        f.debug_struct("PostgresBackend")
            .field("server", &self.inner.server)
            .field("table", &client.sql.table)
            .field("pool_size", &client.pool.size())
            .field("op_timeout", &client.op_timeout)
            .field("connect_timeout", &self.inner.connect_timeout)
            .field("wakeups", &client.wakeups)
            .field("turnstiles", &self.inner.turnstiles)
            .field("waiting", &self.inner.waiting.load(Ordering::Relaxed))
            .field("closed", &client.closing.is_cancelled())
            .finish()
    }
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    /// Never waits, never queues: a free lock is taken whoever waits for
    /// it. A permit: one short transaction under the semaphore's advisory
    /// lock takes the lowest free slot below `permits` (or `PermitsMismatch`
    /// when live holders agreed on another count). A reader-writer share:
    /// one short transaction under the name's advisory lock, leaving no
    /// writer's intent.
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.open()?;
        let client = &self.inner.client;
        match (request.kind(), request.permits(), request.access()) {
            (Kind::Lock, ..) => client.acquire(request, Take::Any).await,
            (Kind::Semaphore, Some(permits), _) => {
                client.try_acquire_permit(request, permits).await
            }
            (Kind::ReadWrite, _, Some(access)) => client.try_share(request, access, None).await,
            (kind, ..) => Err(kind.unsupported(BACKEND)),
        }
    }

    /// Every lock or none, in one short transaction: the acquire statement
    /// per name, in name order, committed or rolled back (`locks/each.rs`).
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        self.open()?;
        self.inner.client.try_acquire_each(requests).await
    }

    /// One statement for the whole batch (`unnest` of names, owners,
    /// fences and TTLs), each lease owner-, fence- and liveness-checked:
    /// locks, permits and reader-writer shares alike.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if let Err(closed) = self.open() {
            return leases.iter().map(|_| Err(closed.clone())).collect();
        }
        self.inner.client.renew_many(leases).await
    }

    /// A renewal by `remaining` instead of the lease's TTL: the renewal
    /// statement sets `expires_at` to exactly `clock_timestamp()` +
    /// `remaining` (a slot's expiry alike), owner-, fence- and
    /// liveness-checked in the same statement.
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        self.renew(&lease.clone().with_ttl(remaining)).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.open()?;
        self.inner.client.release(lease).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.open()?;
        match kind {
            Kind::Lock => Ok(self.inner.client.inspect(name).await?.into_iter().collect()),
            Kind::Semaphore => self.inner.client.inspect_permits(name).await,
            Kind::ReadWrite => self.inner.client.inspect_shares(name).await,
            kind => Err(kind.unsupported(BACKEND)),
        }
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.open()?;
        self.inner.client.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.open()?;
        let topic = match kind {
            Kind::Lock => keys::lock_topic(name.as_str()),
            Kind::Semaphore => keys::permits_topic(name.as_str()),
            Kind::ReadWrite => keys::rw_topic(name.as_str()),
            kind => return Err(kind.unsupported(BACKEND)),
        };
        Ok(self.inner.client.wakeups.watch(topic).await)
    }

    /// Moves the fence sequence to at least `floor` while grants wait (see
    /// the crate docs: restoring from a backup).
    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.inner.caps.check_fence_floor(floor)?;
        self.open()?;
        self.inner.client.raise_fence_floor(floor).await
    }

    /// Closes this client (see [`LockBackend::close`]): every lease it
    /// granted is lost at once (loss signals fire) and every waiting
    /// `acquire` ends with `Unavailable`; the clean-ups it owes the store
    /// (undoing acquires and permit acquires whose reply was lost, leaving
    /// turnstile queues, letting go of turnstiles, removing waiting
    /// writers' intents) are finished within the operation timeout; then the listener, every turnstile connection and
    /// the own pool are closed (its operations in flight waited for, up to
    /// the operation timeout). A pool passed to `from_pool` is the caller's
    /// and stays open. Names it held stay taken until released or expired:
    /// release first (`Locker::close` does).
    async fn close(&self) -> Result<(), LockError> {
        let inner = &self.inner;
        let mut closed = inner.closed.lock().await;
        if *closed {
            return Ok(());
        }
        let client = &inner.client;
        let limit = client.op_timeout;
        client.closing.cancel();
        if !client.cleanups.finish(limit).await {
            tracing::warn!(
                pending = client.cleanups.pending(),
                "clean-ups unfinished at close; what they would undo expires with its TTL"
            );
        }
        // Writers whose wait the closing ended may not have handed their
        // intents to the clean-ups yet.
        client.leave_intents().await;
        client.wakeups.close(inner.connect_timeout).await;
        inner.turnstiles.close(limit).await;
        client.pool.close(limit).await;
        if let (Some(made), Pool::Own(_)) = (inner.caller_pool.get(), &client.pool) {
            made.close().await;
        }
        *closed = true;
        tracing::debug!(server = %inner.server, "closed");
        Ok(())
    }

    /// A lock waits in line (see the crate docs and `wait.rs`); a permit in
    /// lockcore's loop, woken by `watch`; a reader-writer share in
    /// lockcore's loop too, a writer leaving its intent meanwhile
    /// (`rw/wait.rs`).
    ///
    /// # Cancel safety
    /// Dropping the future leaves the local line and the server's queue
    /// (the queued connection is closed; a held turnstile is rolled back
    /// in the background), so the next waiter goes on; a writer's intent is
    /// removed in the background.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.open()?;
        let client = &self.inner.client;
        // Closing ends the wait: dropping it leaves the lines.
        let acquired = async {
            match (request.kind(), request.access()) {
                (Kind::Lock, _) => {
                    let inner = &self.inner;
                    let line = (&inner.line, &*inner.waiting);
                    crate::wait::in_line(client, &inner.turnstiles, line, request, wait).await
                }
                (Kind::ReadWrite, Some(access)) => rw::wait(client, request, access, wait).await,
                _ => wait::wait(wait, &mut Polling::new(self, request)).await,
            }
        };
        tokio::select! {
            acquired = acquired => acquired,
            _ = client.closing.cancelled() => self.open().map(|()| None),
        }
    }
}
