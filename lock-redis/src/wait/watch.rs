//! Watches (`LockBackend::watch`): a wake-up at the next release of a
//! lock, a permit or a reader-writer share, through this instance's
//! subscription.

use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::wait::Wakeup;
use tokio::time::Instant;

use super::WATCH;
use crate::connection::client::Client;
use crate::connection::script::prepare;
use crate::locks::value::remaining;

/// How long a watch's registration in the store lasts; the watch wakes up
/// (spuriously) before it lapses, so the caller re-arms it.
const WATCH_LINGER: Duration = Duration::from_secs(60);

impl Client {
    /// A wake-up for a change of `key` (a lock key, a semaphore's slots, a
    /// reader-writer lock's shares): registered locally, then in the
    /// store's watcher set `watchers`, so the next release publishes to
    /// this instance. Also completes when the first expiry in the sorted
    /// sets `expiring` passes (for a lock, none: when its key expires),
    /// which sends no message, and before the registration lapses.
    pub(crate) async fn watch(
        &self,
        key: &str,
        watchers: &str,
        expiring: &[&str],
    ) -> Result<Wakeup, LockError> {
        let mut changed = self.notifier.watch_key(key).await?;
        let mut call = prepare(&WATCH);
        call.0.key(key).key(watchers);
        for zset in expiring {
            call.0.key(*zset);
        }
        call.0
            .arg(self.notifier.channel())
            .arg(WATCH_LINGER.as_millis() as u64);
        let sent_at = Instant::now();
        let (expires_in,): (i64,) = self.invoke("watch", &call).await?;
        let lapses = sent_at + WATCH_LINGER - self.op_timeout.min(WATCH_LINGER / 2);
        let until = match remaining(expires_in) {
            Some(left) => (sent_at + left + Duration::from_millis(1)).min(lapses),
            None => lapses,
        };
        Ok(Box::pin(async move {
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }))
    }
}
