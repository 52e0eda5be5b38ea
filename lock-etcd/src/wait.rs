//! Waiting in line: a FIFO queue by create revision, as a
//! [`lockcore::backend::wait::Waiter`].
//!
//! 1. The first attempt puts our entry (attached to our session). If nobody
//!    follows the queue in this client yet, the same `Txn` reads the whole
//!    queue: no older entry, and the lock is ours in one round trip.
//! 2. Otherwise we join the client's one view of the queue ([`crate::line`]),
//!    which follows its deletes and tells us when our entry is the oldest:
//!    between the holder's delete and our grant there is no read, no write
//!    and no watch to set up. Each attempt after a wake-up is a local look
//!    at the view (and, once per re-check interval per queue, a read to
//!    verify it).
//! 3. Our own entry's deletion (our session expired, etcd issue #11456
//!    territory; a forced clear) means we queue again, never claiming a
//!    lock whose entry died.
//!
//! While we wait, the keeper refreshes our session. Cancellation: the entry
//! is removed when the waiter is dropped (a clean-up in the background,
//! which closing the client finishes); if that fails, the keeper deletes it
//! once its session's last refresh runs out.
//!
//! Inside this role: the one watch stream per client ([`hub`]), the view of
//! each queue ([`line`]), the store-pushed loss notices ([`notify`]) and
//! `LockBackend::watch`/`watch_permits` ([`watch`]).

pub(crate) mod hub;
pub(crate) mod line;
pub(crate) mod notify;
mod watch;

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use lockcore::backend::wait::Wakeup;
use lockcore::backend::wait::{WaitPolicy, Waiter};
use lockcore::backend::{LockRequest, async_trait};
use lockcore::{Attempt, Lease, LockError, OwnerToken};
use tokio::sync::watch::{Sender, channel};

use crate::connection::client::Inner;
use crate::connection::session::{Attached, Entry, Kind};
use crate::error::{BACKEND, protocol};
use crate::keys::record::Record;
use crate::keys::{Keys, range_end};
use crate::locks::grant::InFlight;
use crate::wait::line::{Line, Read, Turn};

/// `LockBackend::acquire`: wait in line until granted or the deadline.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    request: &LockRequest,
    wait: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let mut waiter = LineWaiter::new(inner, request, wait);
    lockcore::backend::wait::wait(wait, &mut waiter).await
}

/// Our entry in the queue.
struct Place {
    key: Vec<u8>,
    revision: i64,
    value: Arc<[u8]>,
    record: Record,
}

struct LineWaiter {
    inner: Arc<Inner>,
    request: LockRequest,
    queue: Vec<u8>,
    line: Arc<Line>,
    recheck: std::time::Duration,
    place: Option<Place>,
    wake: Sender<u64>,
}

impl LineWaiter {
    fn new(inner: &Arc<Inner>, request: &LockRequest, wait: &WaitPolicy) -> Self {
        let queue = inner.keys.queue(request.name());
        LineWaiter {
            line: inner.lines.get(&queue),
            inner: inner.clone(),
            request: request.clone(),
            queue,
            recheck: wait.recheck,
            place: None,
            wake: channel(0).0,
        }
    }

    /// Puts our entry; `Some(lease)` if the read along with it shows the
    /// lock ours at once.
    async fn enqueue(&mut self) -> Result<Option<Lease>, LockError> {
        let inner = self.inner.clone();
        let ttl = self.request.ttl().get();
        let using = inner.sessions.for_entry(ttl).await?;
        let session = &using.session;
        let n = inner.sessions.reserve(session.id, &self.queue);
        let key = Keys::entry(&self.queue, session.id, n);
        let (floor, offset) = inner.floor.guard();
        let record = Record::new(OwnerToken::new(), offset, self.request.label());
        let value: Arc<[u8]> = record.encode().into();
        let read = self.line.begin_enqueue();
        let mut ops = vec![TxnOp::put(
            key.clone(),
            value.to_vec(),
            Some(PutOptions::new().with_lease(session.id)),
        )];
        let range = GetOptions::new()
            .with_range(range_end(&self.queue))
            .with_keys_only();
        match read {
            Read::All => ops.push(TxnOp::get(self.queue.clone(), Some(range))),
            Read::Since(from, _) => ops.push(TxnOp::get(
                self.queue.clone(),
                Some(range.with_min_create_revision(from)),
            )),
            Read::Nothing => {}
        }
        // Our key is new (its number was free), so its create revision is
        // the revision of this transaction.
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                floor,
            ])
            .and_then(ops)
            .or_else([inner.floor.get()]);
        let mut in_flight = InFlight::entry(&inner, session.id, &key, &value);
        let reply = tokio::time::timeout(inner.timeout, inner.conn.kv()?.txn(txn)).await;
        in_flight.answered();
        let reply = match inner.written(reply, session.id, "enqueue") {
            Ok(Some(reply)) if reply.succeeded() => reply,
            other => {
                self.line.enqueued(read, None, &[]);
                return match other {
                    Ok(Some(reply)) => {
                        if inner.floor.moved_since(&reply, offset)? {
                            // The floor moved: queue with the new offset.
                            inner.sessions.unreserve(session.id, &self.queue, n);
                            Err(LockError::unavailable(
                                BACKEND,
                                "the fence floor moved; queueing again",
                            ))
                        } else {
                            // The number's key is still there: an earlier
                            // entry of this session whose delete has not
                            // landed yet, or a put whose reply was lost (its
                            // session is retired, so it goes within a TTL).
                            // The number stays taken; queue again under the
                            // next one. (Seen with 2,000 waiters on a
                            // saturated etcd: a Store error ended the wait.)
                            Err(LockError::unavailable(
                                BACKEND,
                                "an earlier entry still holds that entry name; queueing again",
                            ))
                        }
                    }
                    Ok(None) => {
                        inner.sessions.unreserve(session.id, &self.queue, n);
                        Err(LockError::unavailable(
                            BACKEND,
                            "our session was gone; queueing again",
                        ))
                    }
                    Err(e) => Err(e),
                };
            }
        };
        let revision = reply.header().map_or(0, |h| h.revision());
        let kvs = reply
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
                _ => None,
            })
            .unwrap_or_default();
        inner.sessions.record(
            key.clone(),
            Entry {
                session: session.id,
                revision,
                value: value.clone(),
                kind: Kind::Waiting,
                lost: lockcore::backend::CancellationToken::new(),
                number: Some((self.queue.clone(), n)),
            },
        );
        self.place = Some(Place {
            key: key.clone(),
            revision,
            value,
            record,
        });
        let first =
            matches!(read, Read::All) && kvs.iter().all(|kv| kv.create_revision() >= revision);
        if first {
            self.line.enqueued(read, None, &[]);
            return self.grant().map(Some);
        }
        inner
            .lines
            .register(&self.line, &key, revision, self.wake.clone());
        self.line.enqueued(read, Some((&key, revision)), &kvs);
        Ok(None)
    }

    /// Our entry is the oldest. Written under an older fence floor, it is
    /// first rewritten with the current offset (same key, same create
    /// revision): every grant after a raise has a fence above the floor.
    async fn take(&mut self) -> Result<Attempt, LockError> {
        let inner = self.inner.clone();
        let Some(place) = self.place.as_mut() else {
            return Err(protocol("a grant without an entry"));
        };
        loop {
            let (floor, offset) = inner.floor.guard();
            if place.record.offset >= offset {
                break;
            }
            let record = Record {
                offset,
                ..place.record.clone()
            };
            let value: Arc<[u8]> = record.encode().into();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(place.key.clone(), CompareOp::Equal, place.revision),
                    floor,
                ])
                .and_then([TxnOp::put(
                    place.key.clone(),
                    value.to_vec(),
                    Some(PutOptions::new().with_ignore_lease()),
                )])
                .or_else([
                    TxnOp::get(place.key.clone(), Some(GetOptions::new().with_keys_only())),
                    inner.floor.get(),
                ]);
            let reply = inner.txn("rewrite under the new floor", txn).await?;
            if reply.succeeded() {
                inner
                    .sessions
                    .rewritten(&place.key, place.revision, value.clone());
                place.record = record;
                place.value = value;
            } else if !inner.floor.moved_since(&reply, offset)? {
                // Not the floor: our entry is gone.
                return Ok(Attempt::Held { expires_in: None });
            }
        }
        self.grant().map(Attempt::Acquired)
    }

    /// The lock is ours: our entry becomes a grant, whose lease counts from
    /// its session's last refresh.
    fn grant(&mut self) -> Result<Lease, LockError> {
        let place = self
            .place
            .take()
            .ok_or_else(|| protocol("a grant without an entry"))?;
        self.line.unregister(&place.key);
        let Some((since, lost)) = self.inner.sessions.granted(&place.key, place.revision) else {
            return Err(LockError::unavailable(
                BACKEND,
                "our entry was gone; queueing again",
            ));
        };
        tracing::debug!(name = %self.request.name(), revision = place.revision, "acquired after waiting");
        self.inner.lease(
            &self.request,
            &place.record,
            place.key,
            place.revision,
            place.value,
            since,
            lost,
        )
    }
}

#[async_trait]
impl Waiter for LineWaiter {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        let mut changes = self.wake.subscribe();
        changes.mark_unchanged();
        Ok(Some(Box::pin(async move {
            let _ = changes.changed().await;
        })))
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        if self.place.is_none()
            && let Some(lease) = self.enqueue().await?
        {
            return Ok(Attempt::Acquired(lease));
        }
        let Some(place) = &self.place else {
            return Err(protocol("no entry after queueing"));
        };
        match self.line.turn(&place.key, place.revision) {
            Turn::Mine => self.take().await,
            Turn::Gone => {
                // Our entry died (session expired, cleared): queue again.
                let place = self.place.take().expect("checked above");
                self.line.unregister(&place.key);
                self.inner.sessions.forget(&place.key, place.revision);
                Err(LockError::unavailable(
                    BACKEND,
                    "our queue entry was gone; queueing again",
                ))
            }
            Turn::Waiting | Turn::Unknown => {
                self.line.want(place.revision, self.recheck);
                Ok(Attempt::Held { expires_in: None })
            }
        }
    }
}

impl Drop for LineWaiter {
    fn drop(&mut self) {
        let place = self.place.take();
        if let Some(place) = &place {
            self.line.unregister(&place.key);
        }
        self.inner.lines.drop_unused(&self.line);
        let Some(place) = place else {
            return;
        };
        self.inner.leave_line(Attached {
            key: place.key,
            revision: place.revision,
            value: place.value,
        });
    }
}

impl Inner {
    /// A waiter gave up its entry in line (a lock's queue, a reader-writer
    /// lock's line): it is deleted in the background.
    pub(crate) fn leave_line(self: &Arc<Self>, place: Attached) {
        // No longer kept alive by the keeper for this waiter: if the removal
        // below fails (or never runs), the keeper deletes the entry once its
        // session's last refresh runs out.
        self.sessions.doom(&place.key, place.revision);
        let inner = self.clone();
        // A clean-up this client owes the store, tracked: closing the client
        // finishes it, so a process that exits right after its wait gave up
        // leaves no entry to block the name until its session's TTL.
        self.conn.cleanup(async move {
            match inner.delete_entry(&place.key, place.revision, &place.value).await {
                Ok(_) => {
                    inner.sessions.forget(&place.key, place.revision);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "removing a queue entry failed; the keeper removes it");
                }
            }
        });
    }
}
