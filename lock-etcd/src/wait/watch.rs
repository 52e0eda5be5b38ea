//! [`LockBackend::watch`](lockcore::LockBackend::watch) and
//! [`watch_permits`](lockcore::LockBackend::watch_permits) and `watch_rw`: wake-ups for
//! waiters outside this client's lines, on the shared watch stream.

use lockcore::backend::wait::Wakeup;
use lockcore::{LockError, LockName};

use crate::connection::client::Inner;
use crate::keys::Keys;
use crate::wait::hub::Events;

impl Inner {
    /// Wakes on the holder's delete; for a name free at the read, on any
    /// delete after it (whoever took the name since has let go): the
    /// caller's next attempt takes a name free now, so a wake-up that fired
    /// at once would only repeat it (a multi-lock waiting for another of
    /// its names would loop).
    pub(crate) async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        // Subscribe first, then read the holder: its delete cannot be missed.
        let mut deletes = self
            .hub
            .subscribe(&self.keys.queue(name), Events::Deletes)
            .await?;
        let (head, revision) = self.head(name).await?;
        let holder = head.map(|kv| kv.key().to_vec());
        Ok(Some(Box::pin(async move {
            // Also wakes when the watch is gone: the caller looks again.
            while let Some(deleted) = deletes.next().await {
                // Deletes up to the read are of earlier grants.
                if deleted.revision > revision && holder.as_ref().is_none_or(|h| *h == deleted.key)
                {
                    return;
                }
            }
        })))
    }

    pub(crate) async fn watch_permits(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        // Subscribed before the caller's next attempt: any slot freed after
        // it wakes the waiter; a slot free right now, the attempt takes.
        let slots = Keys::slots(&self.keys.semaphore(name));
        let mut deletes = self.hub.subscribe(&slots, Events::Deletes).await?;
        Ok(Some(Box::pin(async move {
            // Also wakes when the watch is gone: the caller looks again.
            let _ = deletes.next().await;
        })))
    }

    pub(crate) async fn watch_rw(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        // Any delete may admit a waiter: a grant released or expired, a
        // writer's intent removed. What is admitted right now, the attempt
        // takes.
        let keys = self.keys.rw(name);
        let mut deletes = self.hub.subscribe(keys.base(), Events::Deletes).await?;
        Ok(Some(Box::pin(async move {
            // Also wakes when the watch is gone: the caller looks again.
            let _ = deletes.next().await;
        })))
    }
}
