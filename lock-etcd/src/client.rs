//! The etcd client of one backend instance: its connection, lease pool and
//! watch stream, and one function per store operation (each one or two
//! round trips).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use lockcore::backend::{CancellationToken, LockRequest, Wakeup};
use lockcore::{
    Attempt, Backoff, Capabilities, FencingToken, Holder, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};
use tokio::time::Instant;

use crate::error::{self, BACKEND, lease_not_found, protocol, timed};
use crate::hub::Hub;
use crate::keys::Keys;
use crate::leases::{Grant, Pool, Slot};

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    pub(crate) caps: Capabilities,
    pub(crate) timeout: Duration,
    pub(crate) pool: Pool,
    /// This instance's one watch stream.
    pub(crate) hub: Arc<Hub>,
    pub(crate) watches: crate::notify::Watches,
    /// Tells this instance's leases from other clients' in `Grant::pool`.
    pub(crate) id: u64,
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
}

pub(crate) fn rand_id() -> u64 {
    let uuid = OwnerToken::new().as_uuid();
    uuid.as_u64_pair().0
}

impl Inner {
    pub(crate) fn fence(&self, revision: i64) -> Result<FencingToken, LockError> {
        FencingToken::from_store(BACKEND, revision)
    }

    /// The lease for a new queue entry: a pooled one on the first try, a
    /// fresh grant on the retry (a pooled lease may have been revoked behind
    /// our back).
    pub(crate) async fn entry_lease(&self, ttl: Duration, retry: bool) -> Result<Slot, LockError> {
        if retry {
            self.grant(ttl).await
        } else {
            self.take_lease(ttl).await
        }
    }

    /// A lease for one lock: an idle one (refreshed first if it is getting
    /// old), or a new grant.
    pub(crate) async fn take_lease(&self, ttl: Duration) -> Result<Slot, LockError> {
        while let Some(mut slot) = self.pool.take(ttl) {
            if slot.fresh() {
                return Ok(slot);
            }
            if slot.stale() {
                continue;
            }
            let sent = Instant::now();
            if self.keep_alive(slot.id).await? {
                slot.refreshed = sent;
                return Ok(slot);
            }
        }
        self.grant(ttl).await
    }

    pub(crate) async fn grant(&self, ttl: Duration) -> Result<Slot, LockError> {
        let secs = i64::try_from(ttl.as_secs()).map_err(|_| LockError::InvalidTtl {
            ttl,
            reason: "too large for etcd".into(),
        })?;
        let sent = Instant::now();
        let granted = timed(
            self.timeout,
            "lease grant",
            self.client.lease_client().grant(secs, None),
        )
        .await?;
        if !granted.error().is_empty() {
            return Err(LockError::store(BACKEND, granted.error().to_owned()));
        }
        if granted.ttl() != secs {
            // The cluster's minimum changed under us: never hand out a lease
            // whose real TTL differs from what we report.
            self.spawn_revoke(granted.id());
            return Err(LockError::InvalidTtl {
                ttl,
                reason: format!(
                    "etcd granted {} s instead of {secs} s (its minimum lease TTL is larger)",
                    granted.ttl()
                ),
            });
        }
        Ok(Slot {
            id: granted.id(),
            ttl,
            refreshed: sent,
        })
    }

    /// One keep-alive round trip: `true` if the lease lives on, `false` if
    /// etcd says it is gone.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<bool, LockError> {
        let mut leases = self.client.lease_client();
        let outcome = tokio::time::timeout(self.timeout, async move {
            // The first reply is read inside `keep_alive`: an error with
            // "lease not found" means TTL <= 0. Dropping the keeper and the
            // stream ends the gRPC stream.
            leases.keep_alive(id).await.map(|_| ())
        })
        .await;
        match outcome {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) if lease_not_found(&e) => Ok(false),
            Ok(Err(e)) => Err(error::map(e)),
            Err(_) => Err(LockError::unavailable(
                BACKEND,
                format!("lease keep-alive got no answer within {:?}", self.timeout),
            )),
        }
    }

    /// Revokes a lease in the background (its keys go with it); if that
    /// fails, nobody keeps the lease alive and it expires on its own.
    fn spawn_revoke(&self, id: i64) {
        let mut leases = self.client.lease_client();
        let limit = self.timeout;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
            });
        }
    }

    /// Gives up the lease of a put whose outcome is unknown (no reply): it
    /// is revoked, never pooled. The put may still land later, after any
    /// cleanup; on a pooled lease it would leave a key that every reuse of
    /// the lease keeps alive, blocking the name for as long as this client
    /// is busy. Revoked, the lease takes a landed key with it, and a put
    /// that lands afterwards fails. The revoke is retried (it is idempotent)
    /// until etcd confirms it or the lease has expired anyway.
    pub(crate) fn abandon(&self, slot: Slot) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the lease expires on its own
        };
        let mut leases = self.client.lease_client();
        let limit = self.timeout;
        let expired = slot.refreshed + slot.ttl;
        runtime.spawn(async move {
            let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
            for attempt in 0.. {
                match tokio::time::timeout(limit, leases.revoke(slot.id)).await {
                    Ok(Ok(_)) => return,
                    Ok(Err(e)) if lease_not_found(&e) => return,
                    _ => {}
                }
                let next = Instant::now() + backoff.delay(attempt);
                if next >= expired {
                    return;
                }
                tokio::time::sleep_until(next).await;
            }
        });
    }

    pub(crate) async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, LockError> {
        timed(self.timeout, what, self.client.kv_client().txn(txn)).await
    }

    /// Deletes the entry of one grant (`key` created at `revision` for
    /// `owner`) if it still exists; `true` if this call deleted it.
    pub(crate) async fn delete_entry(
        &self,
        key: &[u8],
        revision: i64,
        owner: OwnerToken,
    ) -> Result<bool, LockError> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.to_vec(), CompareOp::Equal, revision),
                Compare::value(key.to_vec(), CompareOp::Equal, owner.encode()),
            ])
            .and_then([TxnOp::delete(key.to_vec(), None)]);
        Ok(self.txn("release", txn).await?.succeeded())
    }

    /// Deletes our entry (`key`, created at `revision` for `owner`) in the
    /// background after a cancelled wait, then pools its lease.
    pub(crate) fn spawn_cleanup(
        self: &Arc<Self>,
        key: Vec<u8>,
        revision: i64,
        owner: OwnerToken,
        slot: Slot,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the entry expires with its lease
        };
        let inner = self.clone();
        runtime.spawn(async move {
            match inner.delete_entry(&key, revision, owner).await {
                Ok(true) => inner.pool.give_back(slot),
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "cleanup of a queue entry failed; it expires with its lease"),
            }
        });
    }

    /// The lease of a grant (entry created at `fence`), with its loss
    /// signal wired to a watch on its key.
    pub(crate) fn lease_for(
        self: &Arc<Self>,
        name: &LockName,
        owner: OwnerToken,
        fence: FencingToken,
        slot: Slot,
    ) -> Result<Lease, LockError> {
        // Slots carry whole-second TTLs this backend validated.
        let ttl = self.caps.effective_ttl(slot.ttl)?;
        let lost = CancellationToken::new();
        let done = CancellationToken::new();
        if let Ok(revision) = i64::try_from(fence.get()) {
            crate::notify::register(
                self,
                self.keys.queue(name),
                self.keys.entry(name, slot.id),
                revision,
                slot.ttl,
                lost.clone(),
                done.clone(),
            );
        }
        Ok(Lease::new(name.clone(), owner, fence, ttl, slot.refreshed)
            .with_loss_signal(lost)
            .with_extension(Grant {
                lease_id: slot.id,
                pool: self.id,
                done,
            }))
    }

    /// The holder: the queue's oldest entry.
    async fn head(&self, name: &LockName) -> Result<Option<(KeyValue, i64)>, LockError> {
        let queue = self.keys.queue(name);
        let end = Keys::queue_end(&queue);
        let options = GetOptions::new()
            .with_range(end)
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut reply = timed(
            self.timeout,
            "inspect",
            self.client.kv_client().get(queue, Some(options)),
        )
        .await?;
        let revision = reply.header().map_or(0, |h| h.revision());
        Ok(reply.take_kvs().into_iter().next().map(|kv| (kv, revision)))
    }

    async fn holder_of(&self, kv: &KeyValue) -> Result<Holder, LockError> {
        let fence = self.fence(kv.create_revision())?;
        let owner = kv.value_str().ok().and_then(OwnerToken::decode);
        let expires_in = if kv.lease() == 0 {
            None
        } else {
            let ttl = timed(
                self.timeout,
                "lease time-to-live",
                self.client.lease_client().time_to_live(kv.lease(), None),
            )
            .await?;
            // etcd truncates the remaining TTL to whole seconds: report the
            // upper end, never more than the granted TTL.
            let left = u64::try_from(ttl.ttl()).map_or(0, |s| s + 1);
            let granted = u64::try_from(ttl.granted_ttl()).unwrap_or(0);
            Some(Duration::from_secs(left.min(granted)))
        };
        Ok(Holder::new(fence, owner, expires_in))
    }

    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        request: &LockRequest,
    ) -> Result<Attempt, LockError> {
        let inner = self;
        let (name, ttl) = (request.name(), request.ttl().get());
        let queue = inner.keys.queue(name);
        let end = Keys::queue_end(&queue);
        // A pooled lease may have been revoked behind our back: one retry
        // with a fresh grant.
        for fresh_grant in [false, true] {
            let slot = inner.entry_lease(ttl, fresh_grant).await?;
            let owner = OwnerToken::new();
            let key = inner.keys.entry(name, slot.id);
            let txn = Txn::new()
                .when(
                    [Compare::create_revision(queue.clone(), CompareOp::Equal, 0)
                        .with_range(end.clone())],
                )
                .and_then([TxnOp::put(
                    key.clone(),
                    owner.encode(),
                    Some(PutOptions::new().with_lease(slot.id)),
                )]);
            let reply =
                tokio::time::timeout(inner.timeout, inner.client.kv_client().txn(txn)).await;
            match reply {
                Ok(Ok(reply)) if reply.succeeded() => {
                    // The queue was empty, so the key is new: its create
                    // revision is the revision this transaction wrote at,
                    // which etcd returns as the header's revision.
                    let revision = reply.header().map_or(0, |h| h.revision());
                    let fence = inner.fence(revision)?;
                    return Ok(Attempt::Acquired(
                        inner.lease_for(name, owner, fence, slot)?,
                    ));
                }
                Ok(Ok(_)) => {
                    inner.pool.give_back(slot);
                    return Ok(Attempt::Held { expires_in: None });
                }
                Ok(Err(e)) if lease_not_found(&e) && !fresh_grant => continue,
                Ok(Err(e)) => {
                    // The put may or may not have happened, or happen later.
                    inner.abandon(slot);
                    return Err(error::map(e));
                }
                Err(_) => {
                    inner.abandon(slot);
                    return Err(LockError::unavailable(
                        BACKEND,
                        format!("acquire got no answer within {:?}", inner.timeout),
                    ));
                }
            }
        }
        Err(protocol("a freshly granted lease was not found"))
    }

    pub(crate) async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let not_held = || LockError::NotHeld {
            name: lease.name().clone(),
        };
        let Some(grant) = lease.extension::<Grant>() else {
            return Err(not_held());
        };
        let Ok(revision) = i64::try_from(lease.fence().get()) else {
            return Err(not_held());
        };
        let key = self.keys.entry(lease.name(), grant.lease_id);
        let sent = Instant::now();
        // Keep-alive first, then check the key: if the key (unique per
        // grant) still exists after the keep-alive, it existed throughout,
        // so the keep-alive extended exactly this grant.
        if !self.keep_alive(grant.lease_id).await? {
            mark_lost(lease);
            return Err(not_held());
        }
        // The range makes the transaction linearizable: etcd serves a
        // transaction of compares alone like a serializable read, from the
        // member's possibly stale state.
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, revision),
                Compare::value(key.clone(), CompareOp::Equal, lease.owner().encode()),
                Compare::lease(key.clone(), CompareOp::Equal, grant.lease_id),
            ])
            .and_then([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
        if !self.txn("renew check", txn).await?.succeeded() {
            mark_lost(lease);
            return Err(not_held());
        }
        Ok(lease.renewed(sent))
    }

    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        // Without our extension the lease was not granted by this backend
        // kind: there is no entry it could name.
        let (Some(grant), Ok(revision)) = (
            lease.extension::<Grant>(),
            i64::try_from(lease.fence().get()),
        ) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let key = self.keys.entry(lease.name(), grant.lease_id);
        // Our own delete must not read as a loss.
        grant.done.cancel();
        if self.delete_entry(&key, revision, lease.owner()).await? {
            if grant.pool == self.id {
                // Deleted by this call, so the lease has nothing attached:
                // pool it (exactly once per grant).
                self.pool.give_back(Slot {
                    id: grant.lease_id,
                    ttl: lease.ttl(),
                    refreshed: lease.issued_at(),
                });
            }
            Ok(ReleaseOutcome::Released)
        } else {
            Ok(ReleaseOutcome::NotHeld)
        }
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        match self.head(name).await? {
            None => Ok(None),
            Some((kv, _)) => Ok(Some(self.holder_of(&kv).await?)),
        }
    }

    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let inner = self;
        // Delete the head only if it is still the head we read (same create
        // revision); retry if it changed meanwhile. Waiters behind it keep
        // their place, and their revisions are all larger than the evicted
        // fence. The holder's lease is left alone (it may carry nothing else,
        // but it is the holder's to pool or let expire).
        for _ in 0..32 {
            let Some((kv, _)) = inner.head(name).await? else {
                return Ok(None);
            };
            // Compare-and-evict: only the grant holding `expected`, so a
            // retry never evicts the next holder.
            if expected.is_some_and(|fence| Some(fence) != inner.fence(kv.create_revision()).ok()) {
                return Ok(None);
            }
            let holder = inner.holder_of(&kv).await?;
            let txn = Txn::new()
                .when([Compare::create_revision(
                    kv.key().to_vec(),
                    CompareOp::Equal,
                    kv.create_revision(),
                )])
                .and_then([TxnOp::delete(kv.key().to_vec(), None)]);
            if inner.txn("force release", txn).await?.succeeded() {
                return Ok(Some(holder));
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("force release of \"{name}\": the holder kept changing"),
        ))
    }

    pub(crate) async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let inner = self;
        // Subscribe first, then read the holder: its delete cannot be missed.
        let mut deletes = inner.hub.subscribe(&inner.keys.queue(name)).await?;
        let Some((kv, revision)) = inner.head(name).await? else {
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

pub(crate) fn first_range(reply: &TxnResponse) -> Result<Vec<KeyValue>, LockError> {
    reply
        .op_responses()
        .into_iter()
        .find_map(|r| match r {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        })
        .ok_or_else(|| protocol("a transaction reply without its range"))
}

/// Fires the lease's loss signal (the guard watches it).
fn mark_lost(lease: &Lease) {
    if let Some(signal) = lease.loss_signal() {
        signal.cancel();
    }
}
