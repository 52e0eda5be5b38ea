//! The etcd client of one backend instance (its connection, sessions,
//! watch stream and lines) and one function per lock operation, each one
//! or two round trips.

use std::sync::Arc;
use std::time::Duration;

use crate::conn::Conn;
use crate::error::{self, BACKEND, lease_not_found, timed};
use crate::floor::Floor;
use crate::hub::{Events, Hub};
use crate::keys::{Keys, range_end};
use crate::line::Lines;
use crate::record::Record;
use crate::session::{Entry, Kind, Paid, Sessions};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse,
};
use lockcore::backend::wait::Wakeup;
use lockcore::backend::{CancellationToken, Clock, LockRequest, Moment};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};

pub(crate) struct Inner {
    /// The connection, and the work tied to it, until closed.
    pub(crate) conn: Arc<Conn>,
    pub(crate) keys: Keys,
    pub(crate) caps: Capabilities,
    pub(crate) timeout: Duration,
    /// This instance's one watch stream.
    pub(crate) hub: Arc<Hub>,
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) lines: Arc<Lines>,
    pub(crate) floor: Arc<Floor>,
    /// What leases are stamped with and judged on: the clock every
    /// session's proof of life is read on.
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
    /// Set when closing begins: every operation is refused from then on.
    pub(crate) closed: std::sync::atomic::AtomicBool,
    /// Whether `close` finished (held while it runs, so calls queue up).
    pub(crate) closing: tokio::sync::Mutex<bool>,
}

/// What a granted lock or permit carries in its [`Lease`] extension.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) key: Vec<u8>,
    pub(crate) revision: i64,
    pub(crate) value: Arc<[u8]>,
}

impl Inner {
    pub(crate) async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, LockError> {
        timed(self.timeout, what, self.conn.kv()?.txn(txn)).await
    }

    /// A grant this client just wrote on `session`: recorded as held (its
    /// session's keeper keeps it, and its loss reaches the lease), then the
    /// lease.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grant_held(
        &self,
        request: &LockRequest,
        record: &Record,
        session: i64,
        key: Vec<u8>,
        revision: i64,
        value: Arc<[u8]>,
        refreshed: Moment,
        number: Option<(Vec<u8>, u32)>,
    ) -> Result<Lease, LockError> {
        let lost = CancellationToken::new();
        self.sessions.record(
            key.clone(),
            Entry {
                session,
                revision,
                value: value.clone(),
                kind: Kind::Held {
                    paid: Paid {
                        from: refreshed,
                        ttl: request.ttl().get(),
                    },
                },
                lost: lost.clone(),
                number,
            },
        );
        self.lease(request, record, key, revision, value, refreshed, lost)
    }

    /// The lease of a grant: entry `key`, created at `revision` with `value`
    /// (`record`), on a session last proved alive by a request sent at
    /// `refreshed`: the lease counts from there, on the clock that read it
    /// (not the request's: the proof is older than the request).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lease(
        &self,
        request: &LockRequest,
        record: &Record,
        key: Vec<u8>,
        revision: i64,
        value: Arc<[u8]>,
        refreshed: Moment,
        lost: CancellationToken,
    ) -> Result<Lease, LockError> {
        let fence = Record::fence(record.offset, revision)?;
        Ok(Lease::new(
            request.name().clone(),
            record.owner,
            fence,
            request.ttl(),
            refreshed,
        )
        .with_clock(self.clock.clone())
        .with_loss_signal(lost)
        .with_extension(Grant {
            key,
            revision,
            value,
        }))
    }

    pub(crate) async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let queue = self.keys.queue(request.name());
        let ttl = request.ttl().get();
        // A session may be gone behind our back, the fence floor raised:
        // a retry or two.
        for _ in 0..3 {
            let using = self.sessions.for_entry(ttl).await?;
            let (session, refreshed) = (&using.session, using.refreshed);
            let n = self.sessions.reserve(session.id, &queue);
            let key = Keys::entry(&queue, session.id, n);
            let (floor, offset) = self.floor.guard();
            let record = Record::new(OwnerToken::new(), offset, request.label());
            let value: Arc<[u8]> = record.encode().into();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(queue.clone(), CompareOp::Equal, 0)
                        .with_range(range_end(&queue)),
                    floor,
                ])
                .and_then([TxnOp::put(
                    key.clone(),
                    value.to_vec(),
                    Some(PutOptions::new().with_lease(session.id)),
                )])
                .or_else([self.floor.get()]);
            let reply = tokio::time::timeout(self.timeout, self.conn.kv()?.txn(txn)).await;
            let reply = match self.written(reply, session.id, "acquire") {
                Ok(Some(reply)) => reply,
                Ok(None) => {
                    self.sessions.unreserve(session.id, &queue, n);
                    continue;
                }
                Err(e) => {
                    if !e.is_retryable() {
                        // Refused: nothing was written.
                        self.sessions.unreserve(session.id, &queue, n);
                    }
                    return Err(e);
                }
            };
            if !reply.succeeded() {
                self.sessions.unreserve(session.id, &queue, n);
                if self.floor.moved_since(&reply, offset)? {
                    continue; // the floor moved: write with the new offset
                }
                return Ok(Attempt::Held { expires_in: None });
            }
            // The queue was empty, so the key is new: its create revision is
            // the revision this transaction wrote at (the header's).
            let revision = reply.header().map_or(0, |h| h.revision());
            tracing::debug!(name = %request.name(), revision, "acquired");
            return self
                .grant_held(
                    request,
                    &record,
                    session.id,
                    key,
                    revision,
                    value,
                    refreshed,
                    Some((queue, n)),
                )
                .map(Attempt::Acquired);
        }
        Err(LockError::unavailable(
            BACKEND,
            "the etcd session or fence floor kept changing",
        ))
    }

    /// The reply of a write of new entries on `session`: `Ok(None)` if etcd
    /// says the session is gone (nothing was written). A write without an
    /// answer may land later, unseen: its session is retired.
    pub(crate) fn written(
        &self,
        reply: Result<Result<TxnResponse, etcd_client::Error>, tokio::time::error::Elapsed>,
        session: i64,
        what: &str,
    ) -> Result<Option<TxnResponse>, LockError> {
        match reply {
            Ok(Ok(reply)) => Ok(Some(reply)),
            Ok(Err(e)) if lease_not_found(&e) => {
                self.sessions.gone(session);
                Ok(None)
            }
            Ok(Err(e)) => {
                let e = error::map(e);
                if e.is_retryable() {
                    self.sessions.retire(session);
                }
                Err(e)
            }
            Err(_) => {
                self.sessions.retire(session);
                Err(LockError::unavailable(
                    BACKEND,
                    format!("{what} got no answer within {:?}", self.timeout),
                ))
            }
        }
    }

    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let Some(grant) = lease.extension::<Grant>() else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        if Record::decode(&grant.value).map(|r| r.owner) != Some(lease.owner()) {
            return Ok(ReleaseOutcome::NotHeld);
        }
        let deleted = self
            .delete_entry(&grant.key, grant.revision, &grant.value)
            .await?;
        self.sessions.forget(&grant.key, grant.revision);
        Ok(if deleted {
            tracing::debug!(name = %lease.name(), fence = %lease.fence(), "released");
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    /// Deletes the entry of one grant (`key` created at `revision` with
    /// `value`) if it still exists; `true` if this call deleted it.
    pub(crate) async fn delete_entry(
        &self,
        key: &[u8],
        revision: i64,
        value: &[u8],
    ) -> Result<bool, LockError> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.to_vec(), CompareOp::Equal, revision),
                Compare::value(key.to_vec(), CompareOp::Equal, value.to_vec()),
            ])
            .and_then([TxnOp::delete(key.to_vec(), None)]);
        Ok(self.txn("release", txn).await?.succeeded())
    }

    /// The holder: the queue's oldest entry, and the revision read at.
    async fn head(&self, name: &LockName) -> Result<Option<(KeyValue, i64)>, LockError> {
        let queue = self.keys.queue(name);
        let options = GetOptions::new()
            .with_range(range_end(&queue))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut reply = timed(
            self.timeout,
            "inspect",
            self.conn.kv()?.get(queue, Some(options)),
        )
        .await?;
        let revision = reply.header().map_or(0, |h| h.revision());
        Ok(reply.take_kvs().into_iter().next().map(|kv| (kv, revision)))
    }

    /// The holder view of an entry, with the time its lease has left.
    pub(crate) async fn holder_of(&self, kv: &KeyValue) -> Result<Holder, LockError> {
        let expires_in = if kv.lease() == 0 {
            None
        } else {
            Some(self.time_left(kv.lease()).await?)
        };
        Record::holder(kv.value(), kv.create_revision(), expires_in)
    }

    /// How long etcd keeps lease `lease` without a refresh.
    pub(crate) async fn time_left(&self, lease: i64) -> Result<Duration, LockError> {
        let ttl = timed(
            self.timeout,
            "lease time-to-live",
            self.conn.lease()?.time_to_live(lease, None),
        )
        .await?;
        // etcd truncates the remaining TTL to whole seconds: report the
        // upper end, never more than the granted TTL.
        let left = u64::try_from(ttl.ttl()).map_or(0, |s| s + 1);
        let granted = u64::try_from(ttl.granted_ttl()).unwrap_or(0);
        Ok(Duration::from_secs(left.min(granted)))
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        match self.head(name).await? {
            None => Ok(None),
            Some((kv, _)) => Ok(Some(self.holder_of(&kv).await?)),
        }
    }

    /// Deletes the head if it is still the head read (same create revision),
    /// and, for an entry of a session client, leaves a notice under its
    /// session in the same transaction; retries if the head changed.
    /// Waiters keep their place, and every later grant's fence is larger.
    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let queue = self.keys.queue(name);
        for _ in 0..32 {
            let Some((kv, _)) = self.head(name).await? else {
                return Ok(None);
            };
            let fence = Record::holder(kv.value(), kv.create_revision(), None)?.fence;
            // Compare-and-evict: only the grant holding `expected`, so a
            // retry never evicts the next holder.
            if expected.is_some_and(|expected| expected != fence) {
                return Ok(None);
            }
            let holder = self.holder_of(&kv).await?;
            let key = kv.key().to_vec();
            let mut ops = vec![TxnOp::delete(key.clone(), None)];
            if Keys::entry_session(&queue, &key).is_some() && kv.lease() != 0 {
                ops.push(TxnOp::put(
                    self.keys.notice(kv.lease(), kv.create_revision()),
                    key.clone(),
                    Some(PutOptions::new().with_lease(kv.lease())),
                ));
            }
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key,
                    CompareOp::Equal,
                    kv.create_revision(),
                )])
                .and_then(ops);
            if self.txn("force release", txn).await?.succeeded() {
                return Ok(Some(holder));
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("force release of \"{name}\": the holder kept changing"),
        ))
    }

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
}
