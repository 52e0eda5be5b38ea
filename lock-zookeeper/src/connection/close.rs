//! Closing a client, and what dropping the last handle of one does.
//!
//! A process calls `close` right before it exits (a CLI that timed out, a
//! worker on SIGTERM). Whatever the client left to background tasks would be
//! cut short, and its session would live on the servers until its timeout,
//! its nodes blocking others. So closing fires every lease's loss signal,
//! finishes the client's clean-ups, then closes the session (ZooKeeper
//! deletes its ephemeral nodes at once: held locks, and the queue nodes of
//! waiters) and waits for its tasks to end.

use std::time::Duration;

use lockcore::LockError;

use crate::connection::Client;

impl Client {
    /// How long each step of [`close`](Self::close) may take: the session
    /// timeout (what bounds every operation), at most 5 s.
    pub(crate) fn close_limit(&self) -> Duration {
        self.session_timeout().min(Duration::from_secs(5))
    }

    /// Closes the client and returns once it is closed (see
    /// [`LockBackend::close`](lockcore::LockBackend::close)):
    ///
    /// 1. every lease granted on its session is lost (its loss signal fires);
    /// 2. its clean-ups (queue nodes of cancelled waiters, sessions given up
    ///    or retired) are finished, within [`close_limit`](Self::close_limit);
    /// 3. its session is closed on the servers, which deletes its nodes, and
    ///    its tasks end, within that limit again.
    ///
    /// Later calls are `Unavailable`. Idempotent.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when no server confirmed the session's
    /// close in time: its nodes go when the servers expire it.
    pub(crate) async fn close(&self) -> Result<(), LockError> {
        self.closed.cancel();
        let live = self.current();
        live.session.losing.cancel();
        let limit = self.close_limit();
        if !self.cleanups.finish(limit).await {
            tracing::debug!(
                pending = self.cleanups.pending(),
                "zookeeper clean-ups unfinished at close; the session's close deletes their nodes"
            );
        }
        let shut = live.session.shut(limit).await;
        self.tasks.close();
        if tokio::time::timeout(limit, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::debug!("the session keeper of a closed zookeeper client is still running");
        }
        shut
    }
}

impl Drop for Client {
    /// The last handle of a client that was not closed: its leases can no
    /// longer be renewed or released, so they are lost at once, and the
    /// session is closed in the background (where a runtime runs; else the
    /// servers expire it).
    fn drop(&mut self) {
        if self.is_closed() {
            return;
        }
        self.closed.cancel();
        let session = self.current().session.clone();
        session.losing.cancel();
        let (limit, cleanups) = (self.close_limit(), self.cleanups.clone());
        let closing = async move {
            cleanups.finish(limit).await;
            if let Err(e) = session.shut(limit).await {
                tracing::debug!(error = %e, "closing the session of a dropped zookeeper client");
            }
        };
        // Not among the clean-ups: it waits for them.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(closing)),
            Err(_) => {
                tracing::debug!(
                    "zookeeper client dropped outside a runtime; closing its session unwaited"
                );
                self.current().session.let_go();
            }
        }
    }
}
