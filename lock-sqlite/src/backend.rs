//! `SqliteBackend`: its constructors, and the `LockBackend` implementation,
//! which hands each call to the role that serves it.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::wait::{self, LocalLine, WaitPolicy, Wakeup};
use lockcore::backend::{Kind, LockRequest, Polling, Ttl, async_trait};
use lockcore::{
    Access, Attempt, AttemptEach, Capabilities, ExpiryClock, Fairness, FenceDurability,
    FencingToken, Holder, Lease, LockBackend, LockError, LockName, ReleaseOutcome,
};

use crate::config::SqliteConfig;
use crate::connection::Client;
use crate::error::{BACKEND, shown};
use crate::keys::Kind as Table;
use crate::rw::intent::WriterWaits;

/// How soon a holder in any process of the host learns of its eviction: the
/// kernel delivers the presence file's change at once; this bounds the
/// holder's own check of the row.
const EVICTION_NOTICE: Duration = Duration::from_millis(100);

/// Locks in a SQLite file that every process of one host shares.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lock_sqlite::SqliteBackend;
/// use lockcore::Locker;
///
/// let backend = SqliteBackend::connect("sqlite:///var/lib/app/locks.db").await?;
/// let guard = Locker::new(backend).acquire("nightly").await?;
/// // ... pass guard.fencing_token() to what you write ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteBackend {
    client: Arc<Client>,
    /// One waiter per name (and per semaphore) of this instance waits on the
    /// file at a time: a release wakes one task, not every waiter. Readers
    /// and writers of a reader-writer lock wait without a line: readers
    /// that share are all let in at once, and a writer's intent is in the
    /// file as soon as it waits.
    locks_line: LocalLine,
    permits_line: LocalLine,
}

impl SqliteBackend {
    /// Connects to the lock file a `sqlite://PATH` URL names (see
    /// [`SqliteConfig`]), creating it (mode 0600) if it does not exist.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL, an in-memory database, a
    /// missing directory, a network, cluster or FUSE file system, a file
    /// with more than one name or that is a mount point, a read-only file,
    /// a file that is not a SQLite database or belongs to another program;
    /// [`LockError::Unavailable`] while a process still holds a grant the
    /// file's fence counter has not reached (it was restored under running
    /// clients); a store error otherwise.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(url.parse()?).await
    }

    /// Connects with explicit settings.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(config: SqliteConfig) -> Result<Self, LockError> {
        Ok(SqliteBackend {
            client: Client::connect(config).await?,
            locks_line: LocalLine::new(),
            permits_line: LocalLine::new(),
        })
    }

    /// Connects with explicit settings (the old name of
    /// [`connect_with`](Self::connect_with)).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    #[deprecated(note = "use connect_with()")]
    pub async fn with_config(config: SqliteConfig) -> Result<Self, LockError> {
        Self::connect_with(config).await
    }

    /// The lock file's absolute path.
    pub fn path(&self) -> &Path {
        self.client.path()
    }
}

impl fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &shown(self.path()))
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockBackend for SqliteBackend {
    fn capabilities(&self) -> Capabilities {
        let notifies = self.client.notifies();
        Capabilities::new(BACKEND)
            .ttl_range(
                Duration::from_millis(1),
                Duration::from_secs(365 * 24 * 3600),
            )
            .fence_durability(FenceDurability::Durable)
            .fairness(Fairness::None)
            .notifications(notifies)
            .expiry_clock(ExpiryClock::HostBootClock)
            .eviction_notice(notifies.then_some(EVICTION_NOTICE))
            .semaphores(true)
            .rw_locks(true)
            .fence_floor(true)
            .sets_remaining(true)
            // Every lock of a batch or none, in one `BEGIN IMMEDIATE`.
            .atomic_multi(true)
            // One SQLite INTEGER counter per file.
            .max_fence(i64::MAX as u64)
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        match (request.kind(), request.permits(), request.access()) {
            (Kind::Lock, _, _) => self.client.try_grant(Table::Lock, request, 1).await,
            (Kind::Semaphore, Some(permits), _) => {
                self.client.try_grant_permit(request, permits).await
            }
            (Kind::ReadWrite, _, Some(access)) => self.client.try_grant_rw(request, access).await,
            (kind, _, _) => Err(kind.unsupported(BACKEND)),
        }
    }

    /// Every lock of `requests` or none, in one `BEGIN IMMEDIATE`
    /// transaction: each granted as `try_acquire` grants it alone (its own
    /// fence, presence file, undo if cut short); the file keeps no waiting
    /// line for a batch to barge past.
    async fn try_acquire_each(&self, requests: &[LockRequest]) -> Result<AttemptEach, LockError> {
        self.client.try_grant_each(requests).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.client.renew_many(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.client.release(lease).await
    }

    /// The row's expiry becomes exactly now + `remaining` on the host's boot
    /// clock, owner- and fence-checked; its presence file is let go and
    /// this client forgets it, so from here the lease outlives this process
    /// and this client's close (only its expiry, a release or an eviction
    /// frees it).
    async fn set_remaining(&self, lease: &Lease, remaining: Ttl) -> Result<Lease, LockError> {
        self.client.set_remaining(lease, remaining).await
    }

    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        match kind {
            Kind::Lock => self.client.holders(Table::Lock, name).await,
            Kind::Semaphore => self.client.permit_holders(name).await,
            Kind::ReadWrite => self.client.holders(Table::Rw, name).await,
            kind => Err(kind.unsupported(BACKEND)),
        }
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.client.evict(name, expected).await
    }

    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.client.watch(table(kind)?, name).await
    }

    /// The one wait loop, behind this instance's earlier waiters of `name`
    /// (locks and permits each in their own line). A writer of a
    /// reader-writer lock waits with its intent in the file (see
    /// `rw/intent.rs`), a reader as a plain waiter.
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let line = match (table(request.kind())?, request.access()) {
            (Table::Lock, _) => &self.locks_line,
            (Table::Permit, _) => &self.permits_line,
            (_, Some(Access::Write)) => {
                return wait::wait(wait, &mut WriterWaits::new(&self.client, request)).await;
            }
            _ => return wait::wait(wait, &mut Polling::new(self, request)).await,
        };
        let turn = line.turn(request.name());
        let Ok(_turn) = tokio::time::timeout_at(wait.deadline, turn).await else {
            return Ok(None);
        };
        wait::wait(wait, &mut Polling::new(self, request)).await
    }

    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.capabilities().check_fence_floor(floor)?;
        self.client.raise_fence_floor(floor).await
    }

    /// Closes this client (every clone of it) and returns once it is
    /// closed: every lease it granted is lost first (its loss signal fires,
    /// so no guard reads "held"), an acquire cut short during its commit is
    /// undone, what it still held is released (its presence files closed
    /// and removed: other processes take the names at once, woken), then
    /// its connections, inotify instance and files are closed. Later calls
    /// fail with [`LockError::Unavailable`]. Idempotent.
    ///
    /// Dropping the last clone instead closes the connections but keeps
    /// the leases it granted to their deadlines, as their guards expect.
    async fn close(&self) -> Result<(), LockError> {
        self.client.close().await;
        Ok(())
    }
}

/// `connect` must stay callable from `#[async_trait]` methods (factories,
/// frameworks): its future must be `Send` for every lifetime, which some
/// sqlx calls (`raw_sql`) break. This only has to compile.
/// The namespace of the lease table a kind is kept in.
fn table(kind: Kind) -> Result<Table, LockError> {
    match kind {
        Kind::Lock => Ok(Table::Lock),
        Kind::Semaphore => Ok(Table::Permit),
        Kind::ReadWrite => Ok(Table::Rw),
        kind => Err(kind.unsupported(BACKEND)),
    }
}

#[cfg(test)]
mod send_check {
    use super::*;

    #[allow(dead_code)] // only has to compile
    #[async_trait]
    trait Connects {
        async fn connect(&self) -> Result<SqliteBackend, LockError>;
    }

    #[async_trait]
    impl Connects for String {
        async fn connect(&self) -> Result<SqliteBackend, LockError> {
            SqliteBackend::connect(self).await
        }
    }
}
