//! The client of one lock file: connecting (the checks of `probe.rs`, the
//! two pools, the presence directory and the inotify instance), the
//! transaction every write runs in, and the checks every operation makes
//! first (closed? files replaced?). What connect checks in the file is in
//! `startup.rs`, the schema it creates or upgrades in `schema.rs`, closing
//! in `closing.rs`, the files' identities in `files.rs`. The operations
//! themselves live in their roles (`locks.rs`, `permits.rs`, `rw.rs`,
//! `fence.rs`, `wait.rs`), as `impl Client` blocks.

mod closing;
pub(crate) mod files;
pub(crate) mod probe;
mod schema;
mod startup;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{CancellationToken, Cleanups};
use sqlx::sqlite::SqlitePool;
use sqlx::{Sqlite, Transaction};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::config::SqliteConfig;
use crate::error::{self, BACKEND, shown};
use crate::locks::clock::HostClock;
use crate::locks::held::{Closed, Grants};
use crate::locks::presence::Presence;
use crate::rw::intent::Intents;
use crate::wait::inotify::Doorbells;
use files::FileSet;

/// The client of one lock file.
#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) writer: SqlitePool,
    pub(crate) reader: SqlitePool,
    pub(crate) clock: HostClock,
    pub(crate) presence: Option<Presence>,
    pub(crate) bells: Option<Doorbells>,
    /// What it granted, and whether it is closed.
    pub(crate) grants: Grants,
    /// The intents of its waiting writers.
    pub(crate) intents: Intents,
    /// The lock file and its companions as opened.
    files: FileSet,
    path: PathBuf,
    /// The bound on one whole operation.
    pub(crate) limit: Duration,
    /// Work it owes the store (undoing a grant cut short), which `close`
    /// finishes.
    pub(crate) cleanups: Cleanups,
    /// Ends its own background tasks.
    stop: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Held by `close` while it runs; `true` once it has.
    closing: tokio::sync::Mutex<bool>,
    pub(crate) me: Weak<Client>,
}

/// A write transaction on the lock file.
pub(crate) type Tx = Transaction<'static, Sqlite>;

/// What a client is made of, opened by [`Client::connect`].
struct Parts {
    writer: SqlitePool,
    reader: SqlitePool,
    clock: HostClock,
    presence: Option<Presence>,
    bells: Option<(Doorbells, mpsc::UnboundedReceiver<u64>)>,
    path: PathBuf,
    op_timeout: Duration,
}

impl Client {
    /// Opens the lock file `config` names (creating it 0600), checks it,
    /// and sweeps what dead or expired holders left.
    pub(crate) async fn connect(config: SqliteConfig) -> Result<Arc<Client>, LockError> {
        let clock = HostClock::new()?;
        let timeout = config.op_timeout();
        let path = probe::check_path(config.path())?;
        probe::check_existing(&path, timeout).await?;
        probe::create_private(&path)?;
        let writer = probe::pool(&path, timeout, 1).await?;
        if let Err(e) = probe::prepare(&writer, &path).await {
            writer.close().await;
            return Err(e);
        }
        let reader = match probe::pool(&path, timeout, 2).await {
            Ok(reader) => reader,
            Err(e) => {
                writer.close().await;
                return Err(e);
            }
        };
        let presence = Presence::open(&path)
            .map_err(|e| {
                tracing::warn!(path = %shown(&path), error = %e,
                    "no presence directory: holders that die are freed by their TTL only, waiters poll")
            })
            .ok();
        let bells = match &presence {
            Some(_) => Doorbells::new()
                .map_err(|e| tracing::warn!(error = %e, "no inotify instance: waiters poll, evicted holders learn at their next renewal"))
                .ok(),
            None => None,
        };
        let client = Client::new(Parts {
            writer,
            reader,
            clock,
            presence,
            bells,
            path,
            op_timeout: timeout,
        });
        let ready = match client.sweep().await {
            Ok(()) => client.refuse_holders_beyond_the_counter().await,
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            client.close().await;
            return Err(e);
        }
        Ok(client)
    }

    fn new(parts: Parts) -> Arc<Client> {
        let (bells, touched) = parts.bells.unzip();
        let client = Arc::new_cyclic(|me| Client {
            writer: parts.writer,
            reader: parts.reader,
            clock: parts.clock,
            presence: parts.presence,
            bells,
            grants: Grants::default(),
            intents: Intents::default(),
            files: FileSet::record(&parts.path),
            path: parts.path,
            // Waiting for the pool, then for the file's write lock.
            limit: parts.op_timeout * 2 + Duration::from_secs(1),
            cleanups: Cleanups::new(),
            stop: CancellationToken::new(),
            tasks: Mutex::default(),
            closing: tokio::sync::Mutex::new(false),
            me: me.clone(),
        });
        if let Some(touched) = touched {
            let task = tokio::spawn(crate::wait::check_touched(
                Arc::downgrade(&client),
                touched,
                client.stop.clone(),
            ));
            client.tasks().push(task);
        }
        client
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether waiters are woken by the kernel and holders told of evictions.
    pub(crate) fn notifies(&self) -> bool {
        self.bells.is_some()
    }

    /// Refuses work once closed.
    pub(crate) fn open(&self) -> Result<(), LockError> {
        match self.grants.closed() {
            None => Ok(()),
            Some(Closed::ByCall) => Err(LockError::unavailable(
                BACKEND,
                "this client was closed; connect a new one",
            )),
            Some(Closed::Replaced(what)) => Err(self.replaced_error(&what)),
        }
    }

    /// Checks that the files are still the ones this client opened; if not,
    /// closes it (see `files.rs`).
    fn check_files(&self) -> Result<(), LockError> {
        match self.files.replaced() {
            None => Ok(()),
            Some(what) => Err(self.replaced(what)),
        }
    }

    /// The file's write lock, on the files this client opened.
    pub(crate) async fn begin(&self) -> Result<Tx, LockError> {
        let tx = self
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(error::map)?;
        self.check_files()?;
        Ok(tx)
    }

    /// A reader connection, on the files this client opened.
    pub(crate) async fn read(&self) -> Result<sqlx::pool::PoolConnection<Sqlite>, LockError> {
        let conn = self.reader.acquire().await.map_err(error::map)?;
        self.check_files()?;
        Ok(conn)
    }
}

impl Drop for Client {
    /// A client dropped unclosed still ends its own tasks (its connections
    /// close with their pools; its leases run to their deadlines).
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
