//! [`LockBackend::watch`](lockcore::LockBackend::watch) and
//! [`watch_permits`](lockcore::LockBackend::watch_permits) and `watch_rw`: wake-ups for
//! waiters outside this client's lines, on the shared watch stream.

use lockcore::backend::wait::Wakeup;
use lockcore::{LockError, LockName};

use crate::connection::client::Inner;
use crate::keys::Keys;
use crate::wait::hub::Events;

impl Inner {
    pub(crate) async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        // Subscribe first, then read the holder: its delete cannot be missed.
        let mut deletes = self
            .hub
            .subscribe(&self.keys.queue(name), Events::Deletes)
            .await?;
        let Some((kv, revision)) = self.head(name).await? else {
            return Ok(Some(Box::pin(async {})));
        };
        let holder = kv.key().to_vec();
        Ok(Some(Box::pin(async move {
            // Also wakes when the watch is gone: the caller looks again.
            while let Some(deleted) = deletes.next().await {
                // Deletes up to the read are of earlier grants of that key.
                if deleted.key == holder && deleted.revision > revision {
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
