//! A session's lease: granted once per TTL (with its marker), kept alive
//! on one keep-alive stream, revoked when dropped; and keys moved onto it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use lockcore::LockError;
use lockcore::backend::{CancellationToken, Moment};

use super::{
    Attached, MOVE_BATCH, Session, SessionState, Sessions, Status, Use, fresh_enough, keeper,
    not_before,
};
use crate::error::{self, BACKEND, lease_not_found, timed};
use crate::keys::unchanged;

/// A session's keep-alive stream, lent for whole exchanges only: etcd's
/// keep-alive replies carry no request id, so the reply of a keep-alive
/// given up on mid-flight (its caller timed out or was dropped) would answer
/// the next one, and date the session from that later send. Dropped with an
/// exchange in flight, it closes the stream (the next refresh opens
/// another), and that late reply goes with it.
struct Lent<'a> {
    stream: tokio::sync::MutexGuard<'a, Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// A keep-alive was sent and its reply not read yet.
    in_flight: bool,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if self.in_flight {
            *self.stream = None;
        }
    }
}

impl Sessions {
    /// The live session for new entries of `ttl`, refreshed first if it is
    /// not fresh enough, and when it was last refreshed (a new entry's lease
    /// counts from then). The keeper keeps it while the [`Use`] lives: hold
    /// it until the write's outcome is in the book.
    pub(crate) async fn for_entry(self: &Arc<Self>, ttl: Duration) -> Result<Use, LockError> {
        for _ in 0..3 {
            let session = self.current(ttl).await?;
            let Some(mut using) = self.claim(&session) else {
                continue;
            };
            if self.clock.now().since(using.refreshed) <= fresh_enough(ttl) {
                return Ok(using);
            }
            if let Some(sent) = self.refresh(&session).await? {
                using.refreshed = sent;
                return Ok(using);
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            "every new etcd session was gone at once",
        ))
    }

    async fn current(self: &Arc<Self>, ttl: Duration) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.live_current(ttl) {
            return Ok(session);
        }
        let _granting = self.granting.lock().await;
        if let Some(session) = self.live_current(ttl) {
            return Ok(session);
        }
        if self.is_closed() {
            return Err(crate::connection::closed());
        }
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        // Read before the grant leaves: the lease lives at least a TTL from
        // here, and is granted under at least this fence offset.
        let sent = self.clock.now();
        let epoch = self.floor.offset();
        let (id, granted) = self.grant(secs).await?;
        if granted != secs {
            // The cluster's minimum changed under us: never hand out a lease
            // whose real TTL differs from what we report.
            self.spawn_revoke(id);
            return Err(LockError::InvalidTtl {
                ttl,
                reason: format!(
                    "etcd granted {granted} s instead of {secs} s (its minimum lease TTL is larger)"
                ),
            });
        }
        // The marker goes with the lease: its delete tells this client at
        // once that the session (and every lock on it) is gone.
        let marker = TxnOp::put(
            self.keys.alive(id),
            Vec::new(),
            Some(PutOptions::new().with_lease(id)),
        );
        if let Err(e) = timed(
            self.timeout,
            "session marker",
            self.conn.kv()?.txn(Txn::new().and_then([marker])),
        )
        .await
        {
            self.spawn_revoke(id);
            return Err(e);
        }
        let session = Arc::new(Session {
            id,
            ttl,
            stream: tokio::sync::Mutex::new(None),
            ended: CancellationToken::new(),
        });
        let mut book = self.book();
        if self.is_closed() {
            drop(book);
            self.spawn_revoke(session.id);
            return Err(crate::connection::closed());
        }
        book.sessions.insert(
            session.id,
            SessionState {
                handle: session.clone(),
                refreshed: sent,
                epoch,
                status: Status::Live,
                numbers: HashMap::new(),
                busy: false,
                empty_since: None,
                users: 0,
            },
        );
        book.current.insert(ttl, session.id);
        drop(book);
        (self.on_session)(&session);
        self.start_keeper();
        Ok(session)
    }

    /// Grants an etcd lease of `secs` seconds: its id, and the TTL etcd
    /// gave it (more than asked under the cluster's minimum).
    pub(crate) async fn grant(&self, secs: i64) -> Result<(i64, i64), LockError> {
        let granted = timed(
            self.timeout,
            "lease grant",
            self.conn.lease()?.grant(secs, None),
        )
        .await?;
        if !granted.error().is_empty() {
            return Err(LockError::store(BACKEND, granted.error().to_owned()));
        }
        Ok((granted.id(), granted.ttl()))
    }

    /// The current session of `ttl` if it is live and was granted under the
    /// fence offset in force (one from before a raise is about to be retired).
    fn live_current(&self, ttl: Duration) -> Option<Arc<Session>> {
        let floor = self.floor.offset();
        let book = self.book();
        let state = book.sessions.get(book.current.get(&ttl)?)?;
        (state.status == Status::Live && state.epoch >= floor).then(|| state.handle.clone())
    }

    /// Marks `session` in use (if it is live), with its last refresh.
    fn claim(self: &Arc<Self>, session: &Arc<Session>) -> Option<Use> {
        let mut book = self.book();
        let state = book.sessions.get_mut(&session.id)?;
        if state.status != Status::Live {
            return None;
        }
        state.users += 1;
        Some(Use {
            session: session.clone(),
            refreshed: state.refreshed,
            sessions: self.clone(),
        })
    }

    /// Restarts the session's TTL: one keep-alive on its stream, shared by
    /// every caller waiting meanwhile. `Some(sent)`: the lease lives at least
    /// a TTL from `sent` (both clocks, read before the keep-alive left),
    /// taken after this call began. `None`: etcd says it is gone (or it was
    /// retired: it may not be refreshed).
    pub(crate) async fn refresh(&self, session: &Session) -> Result<Option<Moment>, LockError> {
        let asked = self.clock.now();
        let mut stream = Lent {
            stream: session.stream.lock().await,
            in_flight: false,
        };
        {
            let book = self.book();
            match book.sessions.get(&session.id) {
                Some(state) if state.status == Status::Live => {
                    if not_before(state.refreshed, asked) {
                        return Ok(Some(state.refreshed));
                    }
                }
                _ => return Ok(None),
            }
        }
        let sent = self.clock.now();
        let outcome = tokio::time::timeout(self.timeout, async {
            match stream.stream.as_mut() {
                Some((keeper, replies)) => {
                    stream.in_flight = true;
                    keeper.keep_alive().await?;
                    let reply = replies.message().await?;
                    stream.in_flight = false;
                    match reply {
                        Some(reply) => Ok(reply.ttl() > 0),
                        None => Err(etcd_client::Error::WatchError(
                            "keep-alive stream closed".into(),
                        )),
                    }
                }
                None => {
                    // Dropped mid-way, the opening takes its stream with it.
                    let Ok(mut leases) = self.conn.lease() else {
                        return Err(etcd_client::Error::LeaseKeepAliveError(
                            "the client was closed".into(),
                        ));
                    };
                    let opened = leases.keep_alive(session.id).await?;
                    *stream.stream = Some(opened);
                    Ok(true)
                }
            }
        })
        .await;
        // etcd no longer has the lease (expired or revoked): said by a reply
        // with TTL 0, or by the error status of the stream or of its opening.
        let outcome = outcome.map(|alive| match alive {
            Err(e) if lease_not_found(&e) => Ok(false),
            other => other,
        });
        match outcome {
            Ok(Ok(true)) => {
                let mut book = self.book();
                if let Some(state) = book.sessions.get_mut(&session.id)
                    && not_before(sent, state.refreshed)
                {
                    state.refreshed = sent;
                }
                Ok(Some(sent))
            }
            Ok(Ok(false)) => {
                *stream.stream = None;
                self.gone(session.id);
                Ok(None)
            }
            Ok(Err(e)) => {
                *stream.stream = None;
                Err(error::map(e))
            }
            Err(_) => {
                *stream.stream = None;
                Err(LockError::unavailable(
                    BACKEND,
                    format!("lease keep-alive got no answer within {:?}", self.timeout),
                ))
            }
        }
    }

    /// Moves `keys` (with their create revisions and values) off session
    /// `from` onto `target`, keeping each key's create revision, each only
    /// if it is still that grant (create revision and value: after a
    /// restore, revisions repeat) and still on `from` (not on a lease of its
    /// own, where `set_remaining` may have just moved it); returns the keys
    /// on `target` now (those an earlier move whose reply was lost put
    /// there too), the others are gone.
    pub(crate) async fn move_to(
        &self,
        from: i64,
        target: i64,
        keys: &[Attached],
    ) -> Result<Vec<Vec<u8>>, LockError> {
        let mut moved = Vec::new();
        for batch in keys.chunks(MOVE_BATCH) {
            let ops: Vec<TxnOp> = batch
                .iter()
                .map(|entry| {
                    let mut on_from = unchanged(&entry.key, entry.revision, &entry.value).to_vec();
                    on_from.push(Compare::lease(entry.key.clone(), CompareOp::Equal, from));
                    TxnOp::txn(
                        Txn::new()
                            .when(on_from)
                            .and_then([TxnOp::put(
                                entry.key.clone(),
                                entry.value.to_vec(),
                                Some(PutOptions::new().with_lease(target)),
                            )])
                            .or_else([TxnOp::get(entry.key.clone(), None)]),
                    )
                })
                .collect();
            let reply = timed(
                self.timeout,
                "move to a new session",
                self.conn.kv()?.txn(Txn::new().and_then(ops)),
            )
            .await?;
            for (entry, op) in batch.iter().zip(reply.op_responses()) {
                if let TxnOpResponse::Txn(nested) = op
                    && (nested.succeeded() || entry.is_on(target, &nested))
                {
                    moved.push(entry.key.clone());
                }
            }
        }
        Ok(moved)
    }

    /// Revokes lease `id` (a session, or a lease nothing is left on) in the
    /// background: one of the client's clean-ups, which closing finishes.
    pub(crate) fn spawn_revoke(&self, id: i64) {
        let Ok(mut leases) = self.conn.lease() else {
            return; // closed: closing revoked what the book had
        };
        let limit = self.timeout;
        self.conn.cleanup(async move {
            let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
        });
    }

    /// Revokes `session` now (etcd deletes every key on it); its keep-alive
    /// stream closes.
    pub(crate) async fn revoke(&self, session: &Session) -> Result<(), LockError> {
        let revoked = async {
            let mut leases = self.conn.lease()?;
            match tokio::time::timeout(self.timeout, leases.revoke(session.id)).await {
                Ok(Ok(_)) => Ok(()),
                // Expired meanwhile: gone all the same.
                Ok(Err(e)) if lease_not_found(&e) => Ok(()),
                Ok(Err(e)) => Err(error::map(e)),
                Err(_) => Err(LockError::unavailable(
                    BACKEND,
                    format!("lease revoke got no answer within {:?}", self.timeout),
                )),
            }
        }
        .await;
        if let Ok(mut stream) = tokio::time::timeout(self.timeout, session.stream.lock()).await {
            *stream = None;
        }
        revoked
    }

    pub(super) fn start_keeper(self: &Arc<Self>) {
        let mut running = self.keeper.lock().unwrap_or_else(|p| p.into_inner());
        if !*running {
            *running = self.conn.spawn_task(keeper::keep(Arc::downgrade(self)));
        }
    }
}

impl Attached {
    /// Whether a failed move's read shows this entry on `target` already.
    fn is_on(&self, target: i64, read: &TxnResponse) -> bool {
        read.op_responses().iter().any(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().is_some_and(|kv| {
                kv.create_revision() == self.revision
                    && kv.value() == &*self.value
                    && kv.lease() == target
            }),
            _ => false,
        })
    }
}
