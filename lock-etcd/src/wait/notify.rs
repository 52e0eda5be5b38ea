//! Store-pushed loss: a forced release of one of this client's locks, or
//! the end of a session (expired, revoked), reaches the guards at once, not
//! at their next renewal.
//!
//! `evict` deletes the holder's key and, in the same transaction, puts a
//! notice under the holder's session (`<prefix>/sessions/<session>/evicted/
//! <create revision>`, value: the evicted key, attached to the session
//! lease). Each session also has a marker (`.../alive`) attached to it,
//! deleted by etcd with the lease. Each client follows these keys of each of
//! its sessions on its shared watch stream, one watch per session however
//! many locks it holds, and reads what is there after subscribing (so
//! nothing is missed). A notice fires the loss signal of the grant it names
//! and is then deleted; the marker's delete (or absence) fires every loss
//! signal of the session.
//!
//! The same follower watches the fence floor's key (one more watch per
//! client, shared by its sessions) and reads it with the session's keys: a
//! raise, which follows a restore from a backup, reaches the client at once,
//! and the keeper retires every session from before it (see `session`).
//!
//! A watch that lives on is synced: etcd sends its events as it commits
//! them. A watch created while a write races it starts unsynced and is
//! caught up by a loop that runs every 100 ms ([`NOTICE`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};
use lockcore::{Backoff, LockError};

use crate::connection::Conn;
use crate::connection::session::{Session, Sessions};
use crate::error::timed;
use crate::fence::floor::Floor;
use crate::keys::{Keys, range_end};
use crate::wait::hub::{Events, Hub};

/// etcd serves a watch that is behind (created while a write raced it, or
/// whose client was slow to read) from loops that run every 100 ms.
const UNSYNCED_LOOP: Duration = Duration::from_millis(100);

/// How soon a connected holder's loss signal fires after a forced release,
/// round trips aside.
pub(crate) const NOTICE: Duration = UNSYNCED_LOOP;

/// What following notices needs.
#[derive(Clone)]
pub(crate) struct Notices {
    pub(crate) hub: Arc<Hub>,
    pub(crate) conn: Arc<Conn>,
    pub(crate) keys: Keys,
    /// Followed too: a raise (after a restore) retires older sessions.
    pub(crate) floor: Arc<Floor>,
    pub(crate) timeout: Duration,
}

impl Notices {
    /// Follows the notices of `session` until it ends.
    pub(crate) fn follow(&self, sessions: Weak<Sessions>, session: &Arc<Session>) {
        // Without a runtime (or once closed) nothing follows them: evictions
        // are noticed at the next renewal.
        let (this, session) = (self.clone(), session.clone());
        self.conn.spawn_task(async move {
            let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
            let mut failures = 0;
            loop {
                tokio::select! {
                    () = session.ended.cancelled() => return,
                    outcome = this.serve(&sessions, session.id) => match outcome {
                        Ok(()) => return, // the session is gone
                        Err(e) => {
                            tracing::debug!(error = %e, "following eviction notices failed; starting over");
                        }
                    }
                }
                tokio::select! {
                    () = session.ended.cancelled() => return,
                    () = tokio::time::sleep(backoff.delay(failures)) => failures += 1,
                }
            }
        });
    }

    async fn serve(&self, sessions: &Weak<Sessions>, session: i64) -> Result<(), LockError> {
        let prefix = self.keys.session(session);
        let alive = self.keys.alive(session);
        let mut changes = self.hub.subscribe(&prefix, Events::All).await?;
        let floor_key = self.floor.key();
        let mut raises = self.hub.subscribe(&floor_key, Events::All).await?;
        // Subscribed: a change from now on arrives as an event, one before
        // shows in this read.
        let options = GetOptions::new().with_range(range_end(&prefix));
        let reads =
            Txn::new().and_then([TxnOp::get(prefix.clone(), Some(options)), self.floor.get()]);
        let there = timed(self.timeout, "notice read", self.conn.kv()?.txn(reads)).await?;
        self.floor.learn_from(&there)?;
        let kvs = there
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
                _ => None,
            })
            .unwrap_or_default();
        if !kvs.iter().any(|kv| kv.key() == alive.as_slice()) {
            return self.gone(sessions, session);
        }
        for kv in &kvs {
            self.handle(sessions, &prefix, kv.key(), kv.value());
        }
        loop {
            tokio::select! {
                change = changes.next() => {
                    let Some(change) = change else { break };
                    if change.key == alive && change.deleted {
                        return self.gone(sessions, session);
                    }
                    if !change.deleted {
                        self.handle(sessions, &prefix, &change.key, &change.value);
                    }
                }
                raise = raises.next() => {
                    let Some(raise) = raise else { break };
                    if raise.key == floor_key {
                        // The keeper's next look retires what came before.
                        self.floor.learn_value((!raise.deleted).then_some(raise.value))?;
                    }
                }
            }
        }
        Err(LockError::unavailable(
            crate::error::BACKEND,
            "the watch ended",
        ))
    }

    /// The session's marker is gone, and with it the session.
    fn gone(&self, sessions: &Weak<Sessions>, session: i64) -> Result<(), LockError> {
        if let Some(sessions) = sessions.upgrade() {
            tracing::debug!(session, "etcd session gone: its locks are lost");
            sessions.gone(session);
        }
        Ok(())
    }

    /// Fires the loss signal of the grant a notice names, then deletes it.
    fn handle(&self, sessions: &Weak<Sessions>, prefix: &[u8], notice: &[u8], evicted: &[u8]) {
        let Some(revision) = Keys::noticed(prefix, notice) else {
            return;
        };
        if let Some(sessions) = sessions.upgrade()
            && let Some(entry) = sessions.forget(evicted, revision)
        {
            tracing::debug!(revision, "held lock evicted in etcd: lease lost");
            entry.lost.cancel();
        }
        let Ok(mut kv) = self.conn.kv() else {
            return; // closed: it goes with its session
        };
        let (key, limit) = (notice.to_vec(), self.timeout);
        self.conn.cleanup(async move {
            let _ = tokio::time::timeout(limit, kv.delete(key, None)).await;
        });
    }
}
