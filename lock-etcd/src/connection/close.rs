//! Closing a client, and what dropping one without closing it does.
//!
//! A process calls `close` right before it exits (a CLI whose wait timed
//! out, a worker on SIGTERM). Whatever the client would leave to the
//! background then would be cut short: a waiter's entry left in its queue
//! blocks the name until its session's TTL runs out. So closing does it
//! all before it returns: every grant's loss signal fires, the clean-ups
//! the client owes the store finish, and every session is revoked, which
//! makes etcd delete every key on it at once (held locks, waiting entries,
//! whatever a lost reply left); then the watch stream, the views, the
//! keeper and the connection end.
//!
//! Dropping a client without closing it ends its tasks and fires its
//! grants' loss signals, but revokes nothing: a holder may be acting on a
//! lease until its deadline, and etcd keeps its keys until then at least.

use std::sync::atomic::Ordering;

use lockcore::LockError;

use crate::connection::client::Inner;
use crate::connection::closed;
use crate::error::BACKEND;

impl Inner {
    /// `Ok` while the client is open: every operation asks first.
    pub(crate) fn open(&self) -> Result<(), LockError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        Ok(())
    }

    /// Closes the client (see [`LockBackend::close`](lockcore::LockBackend::close));
    /// a second call finds it closed and returns at once.
    ///
    /// Clean-ups and the background tasks get the request timeout each;
    /// each session's revoke too.
    pub(crate) async fn close(&self) -> Result<(), LockError> {
        let mut done = self.closing.lock().await;
        if *done {
            return Ok(());
        }
        self.closed.store(true, Ordering::Release);
        // 1. Nothing this client granted reads held any more.
        let sessions = self.sessions.close();
        // 2. What it owes the store (a waiter's entry, a session to revoke).
        if !self.conn.cleanups.finish(self.timeout).await {
            tracing::debug!(
                pending = self.conn.cleanups.pending(),
                "etcd clean-ups unfinished at close; their sessions' revokes remove what they would have"
            );
        }
        // 3. Every key on its sessions goes with them.
        let revokes = futures_util::future::join_all(
            sessions.iter().map(|session| self.sessions.revoke(session)),
        )
        .await;
        let failed: Vec<LockError> = revokes.into_iter().filter_map(Result::err).collect();
        // 4. The watch stream, views, notices, keeper; then the connection.
        self.hub.close();
        if !self.conn.shut_down(self.timeout).await {
            tracing::debug!("etcd background tasks still ending after close");
        }
        *done = true;
        match failed.first() {
            None => Ok(()),
            Some(e) => Err(LockError::unavailable(
                BACKEND,
                format!(
                    "closed, but {} of {} sessions could not be revoked (their keys expire with their TTL): {e}",
                    failed.len(),
                    sessions.len()
                ),
            )),
        }
    }
}

impl Drop for Inner {
    /// A client dropped without `close` (its last clone): nothing can renew
    /// or release its grants any more, so they read lost at once, and its
    /// tasks end (its connection goes with them). Its keys stay in etcd
    /// until their sessions expire, one TTL after their last refresh: a
    /// holder may still be acting on a lease until its deadline, and only
    /// an explicit `close` says it is done.
    fn drop(&mut self) {
        if self.closed.swap(true, Ordering::AcqRel) && self.conn.is_shut_down() {
            return; // closed
        }
        drop(self.sessions.close());
        self.hub.close();
        self.conn.abandon();
    }
}
