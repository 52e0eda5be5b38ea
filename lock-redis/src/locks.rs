//! Locks: acquire, renew, release, inspect and evict, each one Lua script
//! (`locks/scripts/`), so one atomic step and one round trip; several
//! locks at once in one script too (`each.rs`). Renew and
//! release take permit and reader-writer leases too (one batch renews them
//! all mixed), so those two serve `permits.rs` and `rw.rs` as well.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{Kind, LockRequest, Moment};
use lockcore::{
    Attempt, FencingToken, Holder, Lease, LockError, LockName, OwnerToken, ReleaseOutcome,
};

use crate::connection::background::{Pending, Undo};
use crate::connection::client::Client;
use crate::connection::script::{Call, prepare, script};
use crate::error;
use crate::fence::NEXT_FENCE;
use crate::fence::failover::ERA_CHECK;
use crate::keys::{self, Keys};
use crate::permits::SLOTS;
use crate::rw::holder_id;
use crate::wait::handoff::{InLine, backdated};
use crate::wait::notify::HoldWatch;
use crate::wait::{HANDOFF, LINE};

mod each;
mod renew_on_nodes;
pub(crate) mod value;

use value::{lease_value, parse_value, remaining};

/// `is_lease`: whether a stored value belongs to a lease.
pub(crate) const IS_LEASE: &str = include_str!("locks/scripts/lease.lua");

/// `may_take`: whether a caller may take a lock now; shared by the
/// one-lock and the several-lock acquire.
const CLAIM: &str = include_str!("locks/scripts/claim.lua");

script!(ACQUIRE = [NEXT_FENCE, ERA_CHECK, LINE, HANDOFF, CLAIM] include_str!("locks/scripts/acquire.lua"));
/// `renew_one`: renews one lease, a lock, a permit or a reader-writer share.
const RENEW_ONE: &str = include_str!("locks/scripts/renew_one.lua");

script!(RENEW = [IS_LEASE, SLOTS, RENEW_ONE] include_str!("locks/scripts/renew.lua"));
script!(RELEASE = [IS_LEASE, NEXT_FENCE, ERA_CHECK, LINE, HANDOFF] include_str!("locks/scripts/release.lua"));
script!(INSPECT = [] include_str!("locks/scripts/inspect.lua"));
script!(FORCE_RELEASE = [NEXT_FENCE, ERA_CHECK, LINE, HANDOFF] include_str!("locks/scripts/force_release.lua"));

/// Leases renewed by one script: bounds how long one `renew_many` call
/// keeps the server busy (about a millisecond).
const RENEW_CHUNK: usize = 1000;

impl Client {
    /// One acquire script for `owner`. With `line` (a waiting acquire's
    /// place in line and attempt number), a held lock puts the caller in
    /// line and records its standing offer, and a lock already handed to
    /// `owner` is taken. `watch` listens for an eviction of the grant from
    /// before it can exist (registered here if `None`; taken by a grant).
    /// An attempt whose outcome is unknown (no reply, or this future
    /// dropped before it) is undone in the background; in a line, the
    /// wait's next attempt takes what it got, or the wait frees it when it
    /// ends.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        request: &LockRequest,
        keys: &Keys,
        owner: OwnerToken,
        line: Option<InLine<'_>>,
        watch: &mut Option<HoldWatch>,
    ) -> Result<Attempt, LockError> {
        if let Some(expires_in) = self.failover.era.grants_wait() {
            return Ok(Attempt::Held {
                expires_in: Some(expires_in),
            });
        }
        let ttl = request.ttl();
        let (member, linger, seq) = match line {
            Some(l) => (l.member, l.linger, l.seq.to_string()),
            None => ("", Duration::ZERO, String::new()),
        };
        let mut call = prepare(&ACQUIRE);
        call.0.key(&keys.lock).key(&keys.queue).key(&keys.next);
        call.0
            .arg(owner.encode())
            .arg(ttl.as_millis_ceil())
            .arg(member)
            .arg(linger.as_millis() as u64)
            .arg(request.label().as_str())
            .arg(self.failover.script_arg())
            .arg(seq);
        self.handoff_tail(&mut call, keys);
        if watch.is_none() {
            *watch = Some(self.notifier.watch_hold(&keys.lock, owner));
        }
        let sent_at = request.now();
        let until = sent_at.mono() + ttl.get();
        let pending = line
            .is_none()
            .then(|| Pending::new(self.clone(), Undo::Lock(keys.clone(), owner), until));
        let reply = self.invoke_grant("acquire", &call, pending).await;
        type Reply = (String, i64, i64, i64);
        let ((era, granted, value, left), replicated): (Reply, _) = reply.map_err(|(e, _)| e)?;
        self.failover.saw(&era, &self.endpoint);
        let sent_at = match granted {
            1 => Some(sent_at),
            // Handed over before this attempt: as if sent when the store's
            // TTL began, so the deadline is this send plus what it has left.
            2 => backdated(sent_at, ttl.get().saturating_sub(millis(left))),
            _ => None,
        };
        let Some(sent_at) = sent_at else {
            return Ok(Attempt::Held {
                expires_in: remaining(if granted == 2 { left } else { value }),
            });
        };
        let fence = FencingToken::from_store(error::BACKEND, value)?;
        let lease = Lease::granted(request, owner, fence, sent_at);
        if let Err(e) = replicated {
            self.give_back(&lease).await;
            return Err(e);
        }
        tracing::debug!(key = %keys.lock, %fence, "acquired");
        let watch = watch
            .take()
            .ok_or_else(|| error::unexpected("no eviction watch"))?;
        Ok(Attempt::Acquired(self.with_watch(lease, watch)))
    }

    /// Renews `leases`, locks, permits and shares alike, one script per
    /// chunk of [`RENEW_CHUNK`], each lease owner- and fence-checked on its
    /// own. On a Redis Cluster, one script per primary (see
    /// `renew_on_nodes.rs`). A lease of a kind this adapter does not keep
    /// is refused on its own.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if leases.iter().all(|lease| kept(lease.kind())) {
            return self.renew_kept(leases).await;
        }
        let subset: Vec<Lease> = leases
            .iter()
            .filter(|lease| kept(lease.kind()))
            .cloned()
            .collect();
        let mut renewed = self.renew_kept(&subset).await.into_iter();
        leases
            .iter()
            .map(|lease| {
                if kept(lease.kind()) {
                    renewed
                        .next()
                        .unwrap_or_else(|| Err(error::unexpected("a lease was not renewed")))
                } else {
                    Err(lease.kind().unsupported(error::BACKEND))
                }
            })
            .collect()
    }

    /// [`renew_many`](Self::renew_many) of leases of the kinds kept here.
    async fn renew_kept(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.commands.is_cluster() {
            return self.renew_on_nodes(leases).await;
        }
        let chunks = leases
            .chunks(RENEW_CHUNK)
            .map(|chunk| self.renew_chunk(chunk));
        futures::future::join_all(chunks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Renews `leases` on a Redis Cluster with one script per slot they
    /// fall in (each routed by its key, following `MOVED` and `ASK`), all
    /// sent at once; results in the leases' order.
    pub(crate) async fn renew_by_slot(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, lease) in leases.iter().enumerate() {
            let slot = keys::key_slot(&self.keys(lease.name()).lock);
            by_slot.entry(slot).or_default().push(i);
        }
        let groups = chunked(by_slot.into_values());
        let renewed = futures::future::join_all(groups.iter().map(|group| async move {
            let chunk: Vec<Lease> = group.iter().map(|&i| leases[i].clone()).collect();
            self.renew_chunk(&chunk).await
        }))
        .await;
        let mut results: Vec<Option<Result<Lease, LockError>>> = vec![None; leases.len()];
        for (group, outcomes) in groups.iter().zip(renewed) {
            for (&i, outcome) in group.iter().zip(outcomes) {
                results[i] = Some(outcome);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(error::unexpected("a lease was not renewed"))))
            .collect()
    }

    async fn renew_chunk(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut call = prepare(&RENEW);
        // Only kept kinds get here: one entry per lease.
        for lease in leases {
            if let Some((key, holders, slot)) = self.renewal(lease) {
                call.0.key(key).key(holders).arg(lease_value(lease));
                call.0.arg(lease.ttl().as_millis_ceil()).arg(slot);
            }
        }
        // Each lease on its own clock, read before the request leaves.
        let sent: Vec<Moment> = leases.iter().map(Lease::now).collect();
        let reply = self.invoke_replicated::<Vec<i64>>("renew", &call).await;
        // A renewal the replicas do not have is not adopted (lossless mode).
        let reply = match reply {
            Ok((renewed, Ok(()))) => Ok(renewed),
            Ok((_, Err(e))) | Err((e, _)) => Err(e),
        };
        match reply {
            Ok(renewed) if renewed.len() == leases.len() => leases
                .iter()
                .zip(sent)
                .zip(renewed)
                .map(|((lease, sent_at), renewed)| match renewed {
                    1 => Ok(lease.renewed(sent_at)),
                    _ => Err(LockError::NotHeld {
                        name: lease.name().clone(),
                    }),
                })
                .collect(),
            Ok(renewed) => {
                let e = error::unexpected(format!(
                    "renew answered {} results for {} leases",
                    renewed.len(),
                    leases.len()
                ));
                leases.iter().map(|_| Err(e.clone())).collect()
            }
            Err(e) => leases.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// Releases a grant the replicas did not acknowledge (lossless mode):
    /// it is never handed out; if the release fails too, its key runs out
    /// at its TTL, held by nobody.
    pub(crate) async fn give_back(&self, lease: &Lease) {
        if let Err(e) = self.release(lease).await {
            tracing::warn!(name = %lease.name(), error = %e, "could not release a grant the replicas did not acknowledge; it runs out at its TTL");
        }
    }

    /// Releases a lock, a permit or a reader-writer share, if this lease
    /// still holds it. A share is freed as a permit is (the permit script,
    /// with the share's holder id for a slot).
    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let call = match (lease.kind(), lease.slot(), lease.access()) {
            (Kind::Lock, ..) => {
                let keys = self.keys(lease.name());
                let mut call = prepare(&RELEASE);
                call.0.key(&keys.lock).key(&keys.queue).key(&keys.next);
                call.0.key(&keys.watchers).arg(lease_value(lease));
                self.handoff_tail(&mut call, &keys);
                call
            }
            (Kind::Semaphore, Some(slot), _) => {
                let keys = self.permit_keys(lease.name());
                free_slot(lease, [&keys.slots, &keys.holders, &keys.watchers], slot)
            }
            (Kind::ReadWrite, _, Some(access)) => {
                let keys = self.rw_keys(lease.name());
                let holder = holder_id(access, lease.owner());
                free_slot(lease, [&keys.shares, &keys.holders, &keys.watchers], holder)
            }
            (kind, ..) => return Err(kind.unsupported(error::BACKEND)),
        };
        match self.invoke::<(i64,)>("release", &call).await? {
            (1,) => {
                tracing::debug!(name = %lease.name(), fence = %lease.fence(), "released");
                Ok(ReleaseOutcome::Released)
            }
            _ => Ok(ReleaseOutcome::NotHeld),
        }
    }

    /// What `renew_one` is given to renew `lease`: a lock's key twice and
    /// no slot, a semaphore's slots, holders and slot, or a reader-writer
    /// lock's shares, holders and holder id; `None` for a kind this adapter
    /// does not keep.
    pub(crate) fn renewal(&self, lease: &Lease) -> Option<(String, String, String)> {
        match (lease.kind(), lease.slot(), lease.access()) {
            (Kind::Lock, ..) => {
                let lock = self.keys(lease.name()).lock;
                Some((lock.clone(), lock, String::new()))
            }
            (Kind::Semaphore, Some(slot), _) => {
                let keys = self.permit_keys(lease.name());
                Some((keys.slots, keys.holders, slot.to_string()))
            }
            (Kind::ReadWrite, _, Some(access)) => {
                let keys = self.rw_keys(lease.name());
                Some((keys.shares, keys.holders, holder_id(access, lease.owner())))
            }
            _ => None,
        }
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let keys = self.keys(name);
        let mut call = prepare(&INSPECT);
        call.0.key(&keys.lock);
        let (pttl, value): (i64, Option<String>) = self.invoke("inspect", &call).await?;
        value
            .map(|value| Ok(parse_value(&keys.lock, &value)?.holder(remaining(pttl))))
            .transpose()
    }

    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let keys = self.keys(name);
        let mut call = prepare(&FORCE_RELEASE);
        call.0.key(&keys.lock).key(&keys.fence).key(&keys.queue);
        call.0.key(&keys.next).key(&keys.watchers).key(&keys.floor);
        call.0
            .arg(expected.map(|f| f.to_string()).unwrap_or_default())
            .arg(keys::evict_channel(&self.prefix));
        self.handoff_tail(&mut call, &keys);
        let (_fence, pttl, value): (i64, i64, Option<String>) =
            self.invoke("force_release", &call).await?;
        // The eviction happened: report it even if the old value is odd.
        Ok(match value.as_deref().map(|v| parse_value(&keys.lock, v)) {
            Some(Ok(stored)) => Some(stored.holder(remaining(pttl))),
            Some(Err(e)) => {
                tracing::warn!(key = %keys.lock, error = %e, "force_release removed a foreign value");
                None
            }
            None => None,
        })
    }
}

/// The permit release of `lease`, holding `slot` of the slots, holders
/// and watchers `keys` (a semaphore's, or a reader-writer lock's with the
/// share's holder id for a slot).
fn free_slot(lease: &Lease, keys: [&str; 3], slot: impl redis::ToRedisArgs) -> Call {
    let mut call = prepare(&crate::permits::PERMIT_RELEASE);
    call.0.key(keys[0]).key(keys[1]).key(keys[2]);
    call.0.arg(lease_value(lease)).arg(slot);
    call
}

/// A store's ms count (never negative) as a duration.
fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Whether this adapter keeps leases of `kind`.
fn kept(kind: Kind) -> bool {
    matches!(kind, Kind::Lock | Kind::Semaphore | Kind::ReadWrite)
}

/// Groups of lease indexes (one slot's, one node's) cut into renewal
/// chunks of at most [`RENEW_CHUNK`], one script each.
pub(crate) fn chunked(groups: impl IntoIterator<Item = Vec<usize>>) -> Vec<Vec<usize>> {
    groups
        .into_iter()
        .flat_map(|group| {
            group
                .chunks(RENEW_CHUNK)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}
