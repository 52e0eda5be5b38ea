//! Locks: acquire (one `Txn`, without waiting), release, inspect and
//! force release of a lock's queue entries. A lock is a queue of keys under
//! `<prefix><name>/`; the key with the smallest create revision holds it
//! (see `keys`). Waiting in line is the `wait` role's; renewal, shared with
//! permits, is [`renew`]'s, moving a grant onto a lease of its own for a
//! set remaining time, [`remaining`]'s, and several locks in one `Txn`,
//! [`multi`]'s.

pub(crate) mod grant;
pub(crate) mod multi;
mod remaining;
mod renew;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use lockcore::backend::LockRequest;
use lockcore::{
    Attempt, FencingToken, Holder, Lease, LockError, LockName, OwnerToken, ReleaseOutcome,
};

use crate::connection::client::Inner;
use crate::error::{BACKEND, timed};
use crate::keys::record::Record;
use crate::keys::{Keys, empty, range_end, unchanged};
use grant::{Grant, InFlight};

impl Inner {
    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        request: &LockRequest,
    ) -> Result<Attempt, LockError> {
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
                .when([empty(&queue), floor])
                .and_then([TxnOp::put(
                    key.clone(),
                    value.to_vec(),
                    Some(PutOptions::new().with_lease(session.id)),
                )])
                .or_else([self.floor.get()]);
            let mut in_flight = InFlight::entry(self, session.id, &key, &value);
            let reply = tokio::time::timeout(self.timeout, self.conn.kv()?.txn(txn)).await;
            in_flight.answered();
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

    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let Some(grant) = Grant::of(lease) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
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
            .when(unchanged(key, revision, value))
            .and_then([TxnOp::delete(key.to_vec(), None)]);
        Ok(self.txn("release", txn).await?.succeeded())
    }

    /// The holder (the queue's oldest entry, if any), and the revision
    /// read at.
    pub(crate) async fn head(&self, name: &LockName) -> Result<(Option<KeyValue>, i64), LockError> {
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
        Ok((reply.take_kvs().into_iter().next(), revision))
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

    /// Every entry under `prefix` that `which` names (a slot, an access),
    /// with its holder and the time its lease has left: one read, and one
    /// look at each lease however many entries share it.
    pub(crate) async fn holders_under<T>(
        &self,
        prefix: &[u8],
        what: &'static str,
        which: impl Fn(&[u8]) -> Option<T>,
    ) -> Result<Vec<(T, Holder)>, LockError> {
        let options = GetOptions::new().with_range(range_end(prefix));
        let reply = timed(
            self.timeout,
            what,
            self.conn.kv()?.get(prefix.to_vec(), Some(options)),
        )
        .await?;
        let mut left = HashMap::new();
        for lease in reply.kvs().iter().map(KeyValue::lease) {
            if lease != 0 && !left.contains_key(&lease) {
                left.insert(lease, self.time_left(lease).await?);
            }
        }
        let mut holders = Vec::new();
        for kv in reply.kvs() {
            if let Some(which) = which(kv.key()) {
                let expires_in = left.get(&kv.lease()).copied();
                let holder = Record::holder(kv.value(), kv.create_revision(), expires_in)?;
                holders.push((which, holder));
            }
        }
        Ok(holders)
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        match self.head(name).await?.0 {
            None => Ok(None),
            Some(kv) => Ok(Some(self.holder_of(&kv).await?)),
        }
    }

    /// Deletes the head if it is still the head read (same create revision),
    /// and, for an entry of a session client, leaves a notice under its
    /// session in the same transaction (under the lease of its own an entry
    /// `set_remaining` moved it to, the notice is read by nobody and goes
    /// with that lease); retries if the head changed.
    /// Waiters keep their place, and every later grant's fence is larger.
    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let queue = self.keys.queue(name);
        for _ in 0..32 {
            let Some(kv) = self.head(name).await?.0 else {
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
}
