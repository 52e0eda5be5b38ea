//! An atomic multi-lock attempt (`LockBackend::try_acquire_each`): one
//! `Txn` that grants every lock or none.
//!
//! `try_acquire` grants a lock exactly while its queue is empty: no holder
//! and no waiter, so it never barges past the line. The multi-lock `Txn`
//! compares every name's queue empty, and the fence floor, and puts one
//! entry per name, each as `try_acquire` would (attached to the session of
//! its TTL, its own owner token, the offset compared, its label). Every
//! entry is new, so its create revision is the `Txn`'s, one revision for
//! every name: each name's fence is that revision plus the offset, above
//! every earlier grant of that name (created before it, in a queue empty at
//! this revision) and above the floor. The grants are then held like any
//! lock's: renewed, released, evicted and lost one by one.
//!
//! Refused, the failure branch counts each queue and reads the floor, in
//! the same revision: the first non-empty queue is the name found held.
//! A reply lost, or the caller dropped while the `Txn` is in flight, and
//! its sessions are retired and every entry deleted while it holds our
//! value, as for a reader-writer attempt (`Sending`): nothing it may have
//! granted outlives a TTL.
//!
//! etcd takes at most [`MAX_TXN_OPS`] compares in a `Txn`: more names than
//! [`MAX_NAMES`] are `Unsupported`, and the locker takes them one by one.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use lockcore::backend::{LockRequest, Moment, check_each};
use lockcore::{AttemptEach, LockError, OwnerToken};

use super::grant::InFlight;
use crate::connection::MAX_TXN_OPS;
use crate::connection::client::Inner;
use crate::connection::session::Use;
use crate::error::{self, BACKEND, lease_not_found};
use crate::keys::record::Record;
use crate::keys::{Keys, empty, range_end};

/// The most names one attempt takes: a compare per name and the floor's.
pub(crate) const MAX_NAMES: usize = MAX_TXN_OPS - 1;

/// `Txn`s per attempt: a fence floor that moved or a session gone each
/// cost one more.
const TRIES: usize = 3;

/// One name's entry, as the `Txn` writes it.
struct Planned<'a> {
    request: &'a LockRequest,
    queue: Vec<u8>,
    session: i64,
    refreshed: Moment,
    n: u32,
    key: Vec<u8>,
    record: Record,
    value: Arc<[u8]>,
}

/// `LockBackend::try_acquire_each`: every lock of `requests` (distinct
/// names), or none and the name of one found held.
pub(crate) async fn try_acquire_each(
    inner: &Arc<Inner>,
    requests: &[LockRequest],
) -> Result<AttemptEach, LockError> {
    // Two entries of one name in one `Txn` would both find its queue empty.
    check_each(requests)?;
    if requests.len() > MAX_NAMES {
        return Err(LockError::Unsupported {
            backend: BACKEND,
            operation: "try_acquire_each",
        });
    }
    // A session may be gone behind our back, the fence floor raised: a
    // retry or two.
    for _ in 0..TRIES {
        if let Some(outcome) = inner.attempt_each(requests).await? {
            return Ok(outcome);
        }
    }
    Err(LockError::unavailable(
        BACKEND,
        "the etcd session or fence floor kept changing",
    ))
}

impl Inner {
    /// One `Txn`; `None` if it should be sent again (a session gone, the
    /// fence floor moved).
    async fn attempt_each(
        self: &Arc<Self>,
        requests: &[LockRequest],
    ) -> Result<Option<AttemptEach>, LockError> {
        // One session per TTL, kept until the grants are in the book.
        let mut uses: Vec<(Duration, Use)> = Vec::new();
        let mut on = Vec::with_capacity(requests.len());
        for request in requests {
            let ttl = request.ttl().get();
            match uses.iter().position(|(t, _)| *t == ttl) {
                Some(i) => on.push(i),
                None => {
                    on.push(uses.len());
                    uses.push((ttl, self.sessions.for_entry(ttl).await?));
                }
            }
        }
        let (floor, offset) = self.floor.guard();
        let planned: Vec<Planned<'_>> = requests
            .iter()
            .zip(on)
            .map(|(request, i)| {
                let using = &uses[i].1;
                let queue = self.keys.queue(request.name());
                let session = using.session.id;
                let n = self.sessions.reserve(session, &queue);
                let record = Record::new(OwnerToken::new(), offset, request.label());
                Planned {
                    request,
                    key: Keys::entry(&queue, session, n),
                    queue,
                    session,
                    refreshed: using.refreshed,
                    n,
                    value: record.encode().into(),
                    record,
                }
            })
            .collect();
        let unreserve = || {
            for p in &planned {
                self.sessions.unreserve(p.session, &p.queue, p.n);
            }
        };
        let mut kv = self.conn.kv()?;
        let mut in_flight = InFlight::new(self);
        for p in &planned {
            in_flight.sending.on(p.session);
            in_flight.sending.may_write(&p.key, &p.value);
        }
        let txn = grant_all(&planned, floor, self.floor.get());
        let reply = tokio::time::timeout(self.timeout, kv.txn(txn)).await;
        let reply = match reply {
            Ok(Ok(reply)) => {
                in_flight.answered();
                reply
            }
            Ok(Err(e)) if lease_not_found(&e) => {
                in_flight.answered();
                unreserve();
                // Which of the sessions is gone: a keep-alive of each tells
                // (and books it gone).
                for (_, using) in &uses {
                    self.sessions.refresh(&using.session).await?;
                }
                return Ok(None);
            }
            Ok(Err(e)) => {
                let e = error::map(e);
                if !e.is_retryable() {
                    // Refused: nothing was written.
                    in_flight.answered();
                    unreserve();
                }
                return Err(e);
            }
            Err(_) => {
                return Err(LockError::unavailable(
                    BACKEND,
                    format!(
                        "a multi-lock acquire got no answer within {:?}",
                        self.timeout
                    ),
                ));
            }
        };
        if !reply.succeeded() {
            unreserve();
            if self.floor.moved_since(&reply, offset)? {
                return Ok(None); // write with the new offset
            }
            // (No queue found taken, and the floor unchanged: only a floor
            // raise learned meanwhile explains it; sent again.)
            return Ok(held(&reply, requests).map(|name| AttemptEach::Held {
                name,
                expires_in: None,
            }));
        }
        let revision = reply.header().map_or(0, |h| h.revision());
        tracing::debug!(names = requests.len(), revision, "multi-lock acquired");
        let leases = planned
            .into_iter()
            .map(|p| {
                self.grant_held(
                    p.request,
                    &p.record,
                    p.session,
                    p.key,
                    revision,
                    p.value,
                    p.refreshed,
                    Some((p.queue, p.n)),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        drop(uses);
        Ok(Some(AttemptEach::Acquired(leases)))
    }
}

/// The `Txn`: every queue empty and the floor unchanged, then every entry;
/// else each queue's count, then the floor (last, where
/// `Floor::moved_since` reads it).
fn grant_all(planned: &[Planned<'_>], floor: Compare, read_floor: TxnOp) -> Txn {
    let mut compares: Vec<Compare> = planned.iter().map(|p| empty(&p.queue)).collect();
    compares.push(floor);
    let puts: Vec<TxnOp> = planned
        .iter()
        .map(|p| {
            let on_session = PutOptions::new().with_lease(p.session);
            TxnOp::put(p.key.clone(), p.value.to_vec(), Some(on_session))
        })
        .collect();
    let mut reads: Vec<TxnOp> = planned
        .iter()
        .map(|p| {
            let count = GetOptions::new()
                .with_range(range_end(&p.queue))
                .with_count_only();
            TxnOp::get(p.queue.clone(), Some(count))
        })
        .collect();
    reads.push(read_floor);
    Txn::new().when(compares).and_then(puts).or_else(reads)
}

/// The first name whose queue the refused `Txn` found not empty.
fn held(reply: &TxnResponse, requests: &[LockRequest]) -> Option<lockcore::LockName> {
    reply
        .op_responses()
        .into_iter()
        .zip(requests)
        .find_map(|(response, request)| match response {
            TxnOpResponse::Get(get) if get.count() > 0 => Some(request.name().clone()),
            _ => None,
        })
}
