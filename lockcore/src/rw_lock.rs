//! `RwLock`: readers share a name, a writer holds it alone, and a waiting
//! writer goes first.

use std::time::Duration;

use crate::backend::Kind;
use crate::locker::Ask;
use crate::request::Access;
use crate::{Holder, LockError, LockGuard, LockName, Locker};

/// A reader-writer lock: any number of readers at once, or one writer
/// alone. Every backend that declares
/// [`Capabilities::rw_locks`](crate::Capabilities::rw_locks) keeps these
/// rules in the store, one atomic operation per grant:
///
/// - **Readers share, a writer excludes everyone.** A read is granted while
///   no writer holds the name; a write only while nobody holds it.
/// - **Writer-preferring.** A writer that waits ([`write`](Self::write),
///   [`write_timeout`](Self::write_timeout)) leaves its intent in the store,
///   and no reader is granted while it is there. So a waiting writer is
///   granted as soon as the holders it found are gone (released, or expired
///   after their TTL), whatever stream of readers comes after it. The
///   intent goes when the writer is granted or gives up (timeout, cancel,
///   a dropped future), and lapses within the writer's TTL if its process
///   dies. [`try_write`](Self::try_write) waits for nothing, and leaves no
///   intent.
/// - **One fence counter per name.** Every grant, read or write, has its
///   own fencing token, larger than every token of that name before it. A
///   writer's token is larger than that of every read before it, and a read
///   that began before the latest write has a smaller token than that
///   write: [`FencedRwResource`](crate::FencedRwResource) refuses both a
///   stale writer and a read that began before the latest write.
/// - **Every share is a lease** of its own, renewed by the locker's renewer
///   and lost like a lock ([`LockGuard::lost`]): a crashed reader frees its
///   share within its TTL (at once where the store sees the process die).
///
/// The reader-writer lock of a name is apart from the lock and the
/// semaphore of that name.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lockcore::{Access, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let prices = locker.rw_lock("prices")?;
/// let a = prices.read().await?;
/// let b = prices.read().await?; // readers share
/// assert_eq!(a.access(), Some(Access::Read));
/// assert!(prices.try_write().await?.is_none());
/// let last_read = b.fencing_token();
/// a.release().await?;
/// b.release().await?;
/// let w = prices.write().await?;
/// assert!(w.fencing_token() > last_read); // one counter for reads and writes
/// assert!(prices.try_read().await?.is_none());
/// # w.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    locker: Locker,
    name: LockName,
}

impl RwLock {
    pub(crate) fn new(locker: Locker, name: LockName) -> Self {
        RwLock { locker, name }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// One attempt at a read share, no waiting: `Ok(None)` while a writer
    /// holds the name or waits for it.
    ///
    /// # Errors
    /// As [`Locker::try_acquire`]; [`LockError::Unsupported`] where the
    /// backend keeps no reader-writer locks.
    pub async fn try_read(&self) -> Result<Option<LockGuard>, LockError> {
        self.try_take(Access::Read).await
    }

    /// Waits (up to the locker's max wait) for a read share.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    pub async fn read(&self) -> Result<LockGuard, LockError> {
        self.read_timeout(self.locker.get_max_wait()).await
    }

    /// Waits up to `wait` for a read share.
    ///
    /// # Errors
    /// As [`Locker::acquire_timeout`].
    pub async fn read_timeout(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.take(Access::Read, wait).await
    }

    /// One attempt at the write, no waiting and no intent left behind:
    /// `Ok(None)` while anyone holds the name.
    ///
    /// # Errors
    /// As [`try_read`](Self::try_read).
    pub async fn try_write(&self) -> Result<Option<LockGuard>, LockError> {
        self.try_take(Access::Write).await
    }

    /// Waits (up to the locker's max wait) for the write; new readers wait
    /// behind it meanwhile.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    pub async fn write(&self) -> Result<LockGuard, LockError> {
        self.write_timeout(self.locker.get_max_wait()).await
    }

    /// Waits up to `wait` for the write.
    ///
    /// # Errors
    /// As [`Locker::acquire_timeout`].
    pub async fn write_timeout(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.take(Access::Write, wait).await
    }

    /// Who holds the name now: every reader, or the writer, each with its
    /// [`access`](Holder::access).
    ///
    /// # Errors
    /// A store error.
    pub async fn holders(&self) -> Result<Vec<Holder>, LockError> {
        self.locker
            .backend()
            .holders(&self.name, Kind::ReadWrite)
            .await
    }

    async fn try_take(&self, access: Access) -> Result<Option<LockGuard>, LockError> {
        self.locker
            .try_take(self.name.clone(), Ask::Share(access))
            .await
    }

    async fn take(&self, access: Access, wait: Duration) -> Result<LockGuard, LockError> {
        self.locker
            .take(self.name.clone(), wait, Ask::Share(access))
            .await
    }
}
