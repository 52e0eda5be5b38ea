//! The etcd client of one backend instance (its connection, sessions,
//! watch stream and lines) and one function per lock operation, each one
//! or two round trips.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, LeaseTimeToLiveOptions, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lockcore::backend::{CancellationToken, LockRequest, Wakeup};
use lockcore::{
    Attempt, Capabilities, FencingToken, Holder, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};
use tokio::time::Instant;

use crate::error::{self, BACKEND, lease_not_found, timed};
use crate::fence::Floor;
use crate::hub::{Events, Hub};
use crate::keys::{Keys, range_end};
use crate::line::Lines;
use crate::record::Record;
use crate::session::{Attached, Entry, Kind, Sessions, Status};

/// Keys checked per transaction of gets (etcd allows 128 operations); a
/// renewal of more keys on one session asks the session's lease which keys
/// it carries instead, in one request.
const CHECK_BATCH: usize = 128;

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    pub(crate) caps: Capabilities,
    pub(crate) timeout: Duration,
    /// This instance's one watch stream.
    pub(crate) hub: Arc<Hub>,
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) lines: Arc<Lines>,
    pub(crate) floor: Arc<Floor>,
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
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
        timed(self.timeout, what, self.client.kv_client().txn(txn)).await
    }

    /// The lease of a grant: entry `key`, created at `revision` with `value`
    /// (`record`), on a session last refreshed at `refreshed`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lease(
        &self,
        request: &LockRequest,
        record: &Record,
        key: Vec<u8>,
        revision: i64,
        value: Arc<[u8]>,
        refreshed: Instant,
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
            let (session, refreshed) = self.sessions.for_entry(ttl).await?;
            let n = self.sessions.reserve(session.id, &queue);
            let key = Keys::entry(&queue, session.id, n);
            let record = Record::new(OwnerToken::new(), self.floor.offset(), request.label());
            let value: Arc<[u8]> = record.encode().into();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(queue.clone(), CompareOp::Equal, 0)
                        .with_range(range_end(&queue)),
                    self.floor.compare(),
                ])
                .and_then([TxnOp::put(
                    key.clone(),
                    value.to_vec(),
                    Some(PutOptions::new().with_lease(session.id)),
                )])
                .or_else([self.floor.get()]);
            let reply = tokio::time::timeout(self.timeout, self.client.kv_client().txn(txn)).await;
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
                if self.floor.learn_from(&reply)? {
                    continue; // the floor moved: write with the new offset
                }
                return Ok(Attempt::Held { expires_in: None });
            }
            // The queue was empty, so the key is new: its create revision is
            // the revision this transaction wrote at (the header's).
            let revision = reply.header().map_or(0, |h| h.revision());
            let lost = CancellationToken::new();
            self.sessions.record(
                key.clone(),
                Entry {
                    session: session.id,
                    revision,
                    value: value.clone(),
                    kind: Kind::Held {
                        paid_until: refreshed + ttl,
                    },
                    lost: lost.clone(),
                    number: Some((queue, n)),
                },
            );
            tracing::debug!(name = %request.name(), revision, "acquired");
            return self
                .lease(request, &record, key, revision, value, refreshed, lost)
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

    /// Renews each lease whose grant this client holds: per session, one
    /// keep-alive (shared) and one check that each key still exists with its
    /// create revision, after the keep-alive (a key that exists after it
    /// existed throughout, so exactly its grant was extended).
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut results: Vec<Option<Result<Lease, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        let mut by_session: HashMap<i64, Vec<usize>> = HashMap::new();
        for (i, lease) in leases.iter().enumerate() {
            match self.held(lease) {
                Some(entry) => by_session.entry(entry.session).or_default().push(i),
                None => results[i] = Some(Err(not_held(lease))),
            }
        }
        let groups = futures_util::future::join_all(by_session.into_iter().map(
            |(session, at)| async move {
                let group: Vec<&Lease> = at.iter().map(|&i| &leases[i]).collect();
                (at, self.renew_on(session, &group).await)
            },
        ))
        .await;
        for (at, outcomes) in groups {
            for (i, outcome) in at.into_iter().zip(outcomes) {
                results[i] = Some(outcome);
            }
        }
        results
            .into_iter()
            .zip(leases)
            .map(|(r, lease)| r.unwrap_or_else(|| Err(not_held(lease))))
            .collect()
    }

    /// The book's entry of a grant this client holds.
    fn held(&self, lease: &Lease) -> Option<Entry> {
        let grant = lease.extension::<Grant>()?;
        let entry = self.sessions.entry(&grant.key, grant.revision)?;
        let owner = Record::decode(&grant.value).map(|r| r.owner);
        (owner == Some(lease.owner()) && matches!(entry.kind, Kind::Held { .. })).then_some(entry)
    }

    async fn renew_on(&self, session: i64, leases: &[&Lease]) -> Vec<Result<Lease, LockError>> {
        let grants: Vec<&Grant> = leases
            .iter()
            .filter_map(|l| l.extension::<Grant>())
            .collect();
        let outcome = match self.sessions.status(session) {
            Some((Status::Live, _)) => self.refresh_and_check(session, &grants).await,
            Some((Status::Retired, ttl)) => self.move_on(ttl, &grants).await,
            _ => Ok(None),
        };
        match outcome {
            Ok(Some((sent, present))) => leases
                .iter()
                .zip(&grants)
                .map(|(lease, grant)| {
                    let at = present.get(&grant.key).copied();
                    if let Some(on) = at
                        && self.sessions.renewed(&grant.key, grant.revision, on, sent)
                    {
                        Ok(lease.renewed(sent))
                    } else {
                        self.lost(lease, grant);
                        Err(not_held(lease))
                    }
                })
                .collect(),
            Ok(None) => leases.iter().map(|l| Err(not_held(l))).collect(),
            Err(e) => leases.iter().map(|_| Err(copy_error(&e))).collect(),
        }
    }

    /// One keep-alive of `session`, then which of `grants` it carries:
    /// `None` if etcd says the session is gone.
    async fn refresh_and_check(
        &self,
        session: i64,
        grants: &[&Grant],
    ) -> Result<Option<(Instant, HashMap<Vec<u8>, i64>)>, LockError> {
        let Some(handle) = self.sessions.handle(session) else {
            return Ok(None);
        };
        let Some(sent) = self.sessions.refresh(&handle).await? else {
            return Ok(None);
        };
        let present = if grants.len() <= CHECK_BATCH {
            self.check_exact(grants).await?
        } else {
            self.check_attached(session, grants).await?
        };
        let on_session = present
            .into_iter()
            .filter(|(_, lease)| *lease == session)
            .collect();
        Ok(Some((sent, on_session)))
    }

    /// Which grants' keys exist with their create revision, and on which
    /// lease: one transaction of gets (linearizable).
    async fn check_exact(&self, grants: &[&Grant]) -> Result<HashMap<Vec<u8>, i64>, LockError> {
        let only_keys = GetOptions::new().with_keys_only();
        let gets: Vec<TxnOp> = grants
            .iter()
            .map(|g| TxnOp::get(g.key.clone(), Some(only_keys.clone())))
            .collect();
        let reply = self.txn("renew check", Txn::new().and_then(gets)).await?;
        let mut present = HashMap::new();
        for (grant, op) in grants.iter().zip(reply.op_responses()) {
            if let TxnOpResponse::Get(get) = op
                && let Some(kv) = get.kvs().first()
                && kv.create_revision() == grant.revision
            {
                present.insert(grant.key.clone(), kv.lease());
            }
        }
        Ok(present)
    }

    /// Which grants' keys `session`'s lease carries: one request however
    /// many keys. The lease's leader tracks them; a key only this client
    /// writes, attached to its session, is the book's grant of that key.
    async fn check_attached(
        &self,
        session: i64,
        grants: &[&Grant],
    ) -> Result<HashMap<Vec<u8>, i64>, LockError> {
        let reply = timed(
            self.timeout,
            "renew check",
            self.client
                .lease_client()
                .time_to_live(session, Some(LeaseTimeToLiveOptions::new().with_keys())),
        )
        .await?;
        if reply.ttl() <= 0 {
            return Ok(HashMap::new());
        }
        let attached: std::collections::HashSet<&[u8]> =
            reply.keys().iter().map(Vec::as_slice).collect();
        Ok(grants
            .iter()
            .filter(|g| attached.contains(g.key.as_slice()))
            .map(|g| (g.key.clone(), session))
            .collect())
    }

    /// Renewal of grants on a retired session: they move to a fresh one
    /// (each key keeps its create revision), which counts from its last
    /// refresh.
    async fn move_on(
        &self,
        ttl: Duration,
        grants: &[&Grant],
    ) -> Result<Option<(Instant, HashMap<Vec<u8>, i64>)>, LockError> {
        let (target, refreshed) = self.sessions.for_entry(ttl).await?;
        let keys: Vec<Attached> = grants
            .iter()
            .map(|g| Attached {
                key: g.key.clone(),
                revision: g.revision,
                value: g.value.clone(),
            })
            .collect();
        let moved = self.sessions.move_to(target.id, &keys).await?;
        Ok(Some((
            refreshed,
            moved.into_iter().map(|key| (key, target.id)).collect(),
        )))
    }

    /// The grant is gone: forget it and fire its loss signal.
    fn lost(&self, lease: &Lease, grant: &Grant) {
        if let Some(entry) = self.sessions.forget(&grant.key, grant.revision) {
            entry.lost.cancel();
        }
        if let Some(signal) = lease.loss_signal() {
            signal.cancel();
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
            self.client.kv_client().get(queue, Some(options)),
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
            self.client.lease_client().time_to_live(lease, None),
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

fn not_held(lease: &Lease) -> LockError {
    LockError::NotHeld {
        name: lease.name().clone(),
    }
}

/// The same failure for every lease of a batch.
fn copy_error(e: &LockError) -> LockError {
    if e.is_retryable() {
        LockError::unavailable(BACKEND, e.to_string())
    } else {
        LockError::store(BACKEND, e.to_string())
    }
}
