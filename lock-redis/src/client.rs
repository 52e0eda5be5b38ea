//! The store client: one function per round trip, each one Lua script
//! (see `scripts/`), plus the background work the notifier hands over.

use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::wait::Wakeup;
use lockcore::backend::{CancellationToken, Cleanups, LockRequest, Moment};
use lockcore::{
    Attempt, FencingToken, Holder, HolderLabel, Lease, LockError, LockName, OwnerToken,
    ReleaseOutcome,
};
use redis::{FromRedisValue, Script, ScriptInvocation};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::connection::{self, Commands};
use crate::error;
use crate::keys::{self, Keys, PermitKeys};
use crate::notify::Notifier;
use crate::scripts;

pub(crate) mod background;
mod closing;
mod permits;

use background::{Pending, Undo};

/// Leases renewed by one script: bounds how long one `renew_many` call
/// keeps the server busy (about a millisecond).
const RENEW_CHUNK: usize = 1000;

/// Floor keys raised by one script.
const FLOOR_CHUNK: usize = 4096;

/// How long a watch's registration in the store lasts; the watch wakes up
/// (spuriously) before it lapses, so the caller re-arms it.
const WATCH_LINGER: Duration = Duration::from_secs(60);

/// The largest fence Redis counts exactly: Lua holds numbers as doubles.
pub(crate) const MAX_FENCE: u64 = (1 << 53) - 1;

/// A script invocation and the nonce its reply must echo.
type Call = (ScriptInvocation<'static>, String);

/// One backend instance's link to the server.
pub(crate) struct Client {
    pub(crate) commands: Commands,
    pub(crate) prefix: String,
    pub(crate) endpoint: String,
    /// Connect + response timeout: the longest one request may take.
    pub(crate) op_timeout: Duration,
    /// The longest a lock handed to a woken waiter of this instance stays
    /// reserved for it (at most the waiter's TTL).
    pub(crate) claim_window: Duration,
    pub(crate) notifier: Arc<Notifier>,
    /// Background clean-ups this client owes the store; `close` finishes them.
    pub(crate) cleanups: Cleanups,
    /// Cancelled when the client closes (or is dropped): the parent of every
    /// lease's loss signal, so every lease it granted is lost at once.
    pub(crate) closing: CancellationToken,
    /// The client's own background tasks (the subscription, the handling of
    /// what it hears, lease checks): each ends once `closing` fires.
    pub(crate) tasks: TaskTracker,
    /// Acquires in progress (waits, and attempts in flight): each may leave
    /// a clean-up behind when it ends, which `close` must see.
    pub(crate) acquires: TaskTracker,
}

impl Drop for Client {
    /// Nothing can renew this client's leases any more: each is lost now.
    fn drop(&mut self) {
        self.closing.cancel();
        self.notifier.shutdown();
    }
}

/// A script invocation whose first argument is a fresh nonce.
fn prepare(script: &'static Script) -> Call {
    let nonce = connection::nonce();
    let mut invocation = script.prepare_invoke();
    invocation.arg(&nonce);
    (invocation, nonce)
}

impl Client {
    pub(crate) fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.prefix, name)
    }

    pub(crate) fn permit_keys(&self, name: &LockName) -> PermitKeys {
        PermitKeys::new(&self.prefix, name)
    }

    async fn invoke<T: FromRedisValue>(&self, what: &str, call: &Call) -> Result<T, LockError> {
        self.commands.invoke(what, &call.1, &call.0).await
    }

    /// One acquire script for `owner`. With `line` (the wait's member and
    /// how long the line is kept without a refresh), a held lock puts the
    /// caller in line. An attempt whose outcome is unknown (no reply, or
    /// this future dropped before it; a line's waiter handles the latter
    /// itself) is undone in the background.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        request: &LockRequest,
        keys: &Keys,
        owner: OwnerToken,
        line: Option<(&str, Duration)>,
    ) -> Result<Attempt, LockError> {
        let ttl = request.ttl();
        let (member, linger) = line.unwrap_or_default();
        let mut call = prepare(&scripts::ACQUIRE);
        call.0
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.next)
            .key(&keys.floor)
            .arg(owner.encode())
            .arg(ttl.as_millis_ceil())
            .arg(member)
            .arg(linger.as_millis() as u64)
            .arg(request.label().as_str());
        // Listening for an eviction of this grant starts before it exists.
        let watch = self.notifier.watch_hold(&keys.lock, owner);
        let sent_at = request.now();
        let until = sent_at.mono() + ttl.get();
        let pending = line
            .is_none()
            .then(|| Pending::new(self.clone(), Undo::Lock(keys.clone(), owner), until));
        let reply = self
            .commands
            .invoke_tracked("acquire", &call.1, &call.0)
            .await;
        let (granted, value): (i64, i64) = match reply {
            Ok(reply) => {
                Pending::settled(pending);
                reply
            }
            Err((e, maybe_ran)) => {
                if !maybe_ran {
                    Pending::settled(pending);
                } else if line.is_some() {
                    self.leave_later(keys.clone(), String::new(), Some(owner), until);
                }
                return Err(e);
            }
        };
        if granted != 1 {
            return Ok(Attempt::Held {
                expires_in: remaining(value),
            });
        }
        let fence = FencingToken::from_store(error::BACKEND, value)?;
        tracing::debug!(key = %keys.lock, %fence, "acquired");
        let lost = watch.granted(fence);
        Ok(Attempt::Acquired(
            Lease::granted(request, owner, fence, sent_at)
                .with_loss_signal(lost)
                .with_extension(watch),
        ))
    }

    /// Renews `leases`, locks and permits alike, one script per chunk of
    /// [`RENEW_CHUNK`], each lease owner- and fence-checked on its own.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let chunks = leases
            .chunks(RENEW_CHUNK)
            .map(|chunk| self.renew_chunk(chunk));
        futures::future::join_all(chunks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn renew_chunk(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut call = prepare(&scripts::RENEW);
        for lease in leases {
            match lease.slot() {
                None => {
                    let lock = self.keys(lease.name()).lock;
                    call.0.key(&lock).key(&lock).arg(lease_value(lease));
                    call.0.arg(lease.ttl().as_millis_ceil()).arg("");
                }
                Some(slot) => {
                    let keys = self.permit_keys(lease.name());
                    call.0
                        .key(&keys.slots)
                        .key(&keys.holders)
                        .arg(lease_value(lease));
                    call.0.arg(lease.ttl().as_millis_ceil()).arg(slot);
                }
            }
        }
        // Each lease on its own clock, read before the request leaves.
        let sent: Vec<Moment> = leases.iter().map(Lease::now).collect();
        match self.invoke::<Vec<i64>>("renew", &call).await {
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

    /// Releases a lock or a permit, if this lease still holds it.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let call = match lease.slot() {
            None => {
                let keys = self.keys(lease.name());
                let mut call = prepare(&scripts::RELEASE);
                call.0.key(&keys.lock).key(&keys.queue).key(&keys.next);
                call.0.key(&keys.watchers).arg(lease_value(lease));
                call
            }
            Some(slot) => {
                let keys = self.permit_keys(lease.name());
                let mut call = prepare(&scripts::PERMIT_RELEASE);
                call.0
                    .key(&keys.slots)
                    .key(&keys.holders)
                    .key(&keys.watchers);
                call.0.arg(lease_value(lease)).arg(slot);
                call
            }
        };
        match self.invoke::<(i64,)>("release", &call).await? {
            (1,) => {
                tracing::debug!(name = %lease.name(), fence = %lease.fence(), "released");
                Ok(ReleaseOutcome::Released)
            }
            _ => Ok(ReleaseOutcome::NotHeld),
        }
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let keys = self.keys(name);
        let mut call = prepare(&scripts::INSPECT);
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
        let mut call = prepare(&scripts::FORCE_RELEASE);
        call.0.key(&keys.lock).key(&keys.fence).key(&keys.queue);
        call.0.key(&keys.next).key(&keys.watchers).key(&keys.floor);
        call.0
            .arg(expected.map(|f| f.to_string()).unwrap_or_default())
            .arg(keys::evict_channel(&self.prefix));
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

    /// Takes `member` (if not empty) out of the line of `keys`, passing on a
    /// hand-off reserved for it, and frees the lock if `owner`'s attempt got
    /// it. Returns whether it freed the lock.
    pub(crate) async fn leave(
        &self,
        keys: &Keys,
        member: &str,
        owner: Option<OwnerToken>,
    ) -> Result<bool, LockError> {
        let mut call = prepare(&scripts::LEAVE);
        call.0.key(&keys.lock).key(&keys.queue).key(&keys.next);
        call.0
            .key(&keys.watchers)
            .arg(member)
            .arg(owner.map(|o| o.encode()).unwrap_or_default());
        let (freed,): (i64,) = self.invoke("leave", &call).await?;
        Ok(freed == 1)
    }

    /// A wake-up for a change of `key` (a lock key, or a semaphore's slots
    /// with `permits`): registered locally, then in the store's watcher set
    /// `watchers`, so the next release publishes to this instance. Also
    /// completes when the holder (first permit) expires, which sends no
    /// message, and before the registration lapses.
    pub(crate) async fn watch(
        &self,
        key: &str,
        watchers: &str,
        permits: bool,
    ) -> Result<Wakeup, LockError> {
        let mut changed = self.notifier.watch_key(key).await?;
        let mut call = prepare(&scripts::WATCH);
        call.0.key(key).key(watchers);
        call.0
            .arg(self.notifier.channel())
            .arg(WATCH_LINGER.as_millis() as u64)
            .arg(if permits { "permits" } else { "" });
        let sent_at = Instant::now();
        let (expires_in,): (i64,) = self.invoke("watch", &call).await?;
        let lapses = sent_at + WATCH_LINGER - self.op_timeout.min(WATCH_LINGER / 2);
        let until = match remaining(expires_in) {
            Some(left) => (sent_at + left + Duration::from_millis(1)).min(lapses),
            None => lapses,
        };
        Ok(Box::pin(async move {
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }))
    }

    /// Raises the fence floor of every Cluster slot to `floor` (checked
    /// against [`MAX_FENCE`] by the caller).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let floor_keys: Vec<String> = (0..keys::SLOTS)
            .map(|slot| keys::floor_key(&self.prefix, slot))
            .collect();
        for chunk in floor_keys.chunks(FLOOR_CHUNK) {
            let mut call = prepare(&scripts::RAISE_FLOOR);
            for key in chunk {
                call.0.key(key);
            }
            call.0.arg(floor.get());
            let () = self.invoke("raise fence floor", &call).await?;
        }
        tracing::info!(%floor, "fence floor raised");
        Ok(())
    }
}

/// `"<owner>:<fence>"`: what identifies `lease` in the store (the stored
/// value adds `" <label>"`).
fn lease_value(lease: &Lease) -> String {
    format!("{}:{}", lease.owner().encode(), lease.fence())
}

/// What a lock key or a semaphore slot holds.
#[derive(Debug, PartialEq, Eq)]
struct Stored {
    owner: OwnerToken,
    fence: FencingToken,
    /// `None` for values written before labels were stored.
    label: Option<HolderLabel>,
}

impl Stored {
    fn holder(self, expires_in: Option<Duration>) -> Holder {
        Holder::new(self.fence, Some(self.owner), expires_in).with_label(self.label)
    }
}

/// Parses `"<owner>:<fence>"`, optionally followed by `" <label>"`.
fn parse_value(key: &str, value: &str) -> Result<Stored, LockError> {
    let (lease, label) = match value.split_once(' ') {
        Some((lease, label)) => (lease, HolderLabel::new(label).ok()),
        None => (value, None),
    };
    lease
        .split_once(':')
        .and_then(|(owner, fence)| {
            Some(Stored {
                owner: OwnerToken::decode(owner)?,
                fence: FencingToken::new(fence.parse().ok()?)?,
                label,
            })
        })
        .ok_or_else(|| {
            error::unexpected(format!(
                "{key} holds a value distlock did not write ({} bytes)",
                value.len()
            ))
        })
}

/// A remaining time in ms from the server; negative means none.
fn remaining(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_foreign_values_are_errors() {
        let lease = Lease::new(
            LockName::new("n").unwrap(),
            OwnerToken::new(),
            FencingToken::new(1_795_940_012_062_115).unwrap(),
            lockcore::Capabilities::new("test")
                .effective_ttl(Duration::from_secs(1))
                .unwrap(),
            Moment::now(),
        );
        let value = lease_value(&lease);
        let unlabelled = parse_value("k", &value).unwrap();
        assert_eq!(
            (unlabelled.owner, unlabelled.fence),
            (lease.owner(), lease.fence())
        );
        assert_eq!(
            unlabelled.label, None,
            "values of older versions have no label"
        );
        let labelled = parse_value("k", &format!("{value} worker 3: a:b")).unwrap();
        assert_eq!(
            labelled.label,
            Some(HolderLabel::new("worker 3: a:b").unwrap())
        );
        for bad in [
            "",
            "x",
            "abc:1",
            &format!("{}:0", lease.owner().encode()),
            &format!("{}:-1", lease.owner().encode()),
        ] {
            assert!(
                matches!(parse_value("k", bad), Err(LockError::Store { .. })),
                "{bad}"
            );
        }
        assert_eq!(remaining(-2), None);
        assert_eq!(remaining(-1), None);
        assert_eq!(remaining(1500), Some(Duration::from_millis(1500)));
    }
}
