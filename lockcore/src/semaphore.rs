//! `Semaphore`: at most N holders at once, each with a fenced slot.

use std::time::Duration;

use crate::backend::Kind;
use crate::locker::Ask;
use crate::{Holder, LockError, LockGuard, LockName, Locker};

/// A counting semaphore: at most `permits` holders of one name at once.
///
/// Each permit is a *slot* (0 to `permits - 1`) with its own fencing token,
/// strictly increasing per slot, so a paused permit holder whose slot was
/// granted again is refused by the resource exactly like a stale lock holder
/// (see [`FencedSlots`](crate::FencedSlots)). Permits are leases like locks:
/// they renew themselves, expire when their holder dies, and fire
/// [`LockGuard::lost`] when lost; [`LockGuard::slot`] says which slot a guard
/// holds. Every holder of one name must agree on the number of permits: a
/// request with another number, while permits are held, fails with
/// [`LockError::PermitsMismatch`] instead of over-granting.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lockcore::{Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let uploads = locker.semaphore("uploads", 2)?;
/// let a = uploads.acquire().await?;
/// let b = uploads.acquire().await?;
/// assert!(uploads.try_acquire().await?.is_none()); // both permits taken
/// assert_ne!(a.slot(), b.slot());
/// a.release().await?;
/// assert!(uploads.try_acquire().await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    locker: Locker,
    name: LockName,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(locker: Locker, name: LockName, permits: u32) -> Result<Self, LockError> {
        crate::support::check_permits(&name, permits)?;
        Ok(Semaphore {
            locker,
            name,
            permits,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// How many holders it allows at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// One attempt, no waiting: `Ok(None)` when every permit is taken.
    ///
    /// # Errors
    /// As [`Locker::try_acquire`], and [`LockError::PermitsMismatch`].
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        self.locker
            .try_take(self.name.clone(), Ask::Permit(self.permits))
            .await
    }

    /// Waits (up to the locker's max wait) for a permit.
    ///
    /// # Errors
    /// As [`Locker::acquire`], and [`LockError::PermitsMismatch`].
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_timeout(self.locker.get_max_wait()).await
    }

    /// Waits up to `wait` for a permit.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.locker
            .take(self.name.clone(), wait, Ask::Permit(self.permits))
            .await
    }

    /// Who holds permits now, one [`Holder`] per taken slot.
    ///
    /// # Errors
    /// A store error.
    pub async fn holders(&self) -> Result<Vec<Holder>, LockError> {
        self.locker
            .backend()
            .holders(&self.name, Kind::Semaphore)
            .await
    }
}
