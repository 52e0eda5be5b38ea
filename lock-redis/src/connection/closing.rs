//! Closing a client: calls refused once it closes, acquires and waits
//! tracked so that the clean-ups they leave behind are seen, and `close`
//! itself, step by step (see `LockBackend::close`).

use std::time::Duration;

use lockcore::LockError;

use super::client::Client;
use super::commands;

impl Client {
    /// Refuses every call once the client is closing.
    pub(crate) fn open(&self) -> Result<(), LockError> {
        if self.closing.is_cancelled() {
            return Err(commands::closed());
        }
        Ok(())
    }

    /// An acquire or a wait (`work`), tracked until it ends, so that
    /// `close` sees the clean-up it may leave behind. It ends with
    /// [`LockError::Unavailable`] as soon as the client closes: a grant it
    /// was about to get is undone, as for a lost reply.
    pub(crate) async fn acquiring<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        self.open()?;
        self.acquires
            .track_future(async {
                tokio::select! {
                    biased;
                    _ = self.closing.cancelled() => Err(commands::closed()),
                    done = work => done,
                }
            })
            .await
    }

    /// How long `close` waits for the clean-ups it owes the store: an
    /// attempt in flight, the longest pause between two attempts (1 s),
    /// and one more attempt.
    fn cleanup_limit(&self) -> Duration {
        self.op_timeout * 2 + Duration::from_secs(1)
    }

    /// Closes the client (see `LockBackend::close`): every lease lost and
    /// every wait ended, the acquires in flight answered (for at most the
    /// operation timeout), the clean-ups it owes the store finished (for at
    /// most [`cleanup_limit`](Self::cleanup_limit)), then its subscription
    /// ended, its tasks awaited and its command connection closed.
    /// Idempotent.
    pub(crate) async fn close(&self) {
        self.closing.cancel();
        self.acquires.close();
        if tokio::time::timeout(self.op_timeout, self.acquires.wait())
            .await
            .is_err()
        {
            tracing::debug!(endpoint = %self.endpoint, "redis acquires still in flight at close");
        }
        if !self.cleanups.finish(self.cleanup_limit()).await {
            tracing::warn!(
                endpoint = %self.endpoint,
                pending = self.cleanups.pending(),
                "redis clean-ups unfinished at close; what they would undo expires with its TTL"
            );
        }
        self.notifier.shutdown();
        self.tasks.close();
        if tokio::time::timeout(self.op_timeout, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(endpoint = %self.endpoint, "redis background tasks still running after close");
        }
        self.commands.close().await;
    }
}
