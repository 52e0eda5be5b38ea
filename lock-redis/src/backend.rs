//! `RedisBackend`: the lock operations, each one Lua script round trip.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lockcore::backend::{LockRequest, Moment, Ttl, WaitPolicy};
use lockcore::{
    Attempt, Capabilities, ExpiryClock, Fairness, FenceDurability, FencingToken, Holder, Lease,
    LockBackend, LockError, LockName, OwnerToken, ReleaseOutcome,
};
use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::connection::{self, Commands};
use crate::durability::{Eviction, Persistence};
use crate::error::{self, BACKEND};
use crate::fenced::{self, Fenced};
use crate::keys::{self, Keys};
use crate::notify::{Checks, Event, Notifier, Wait};
use crate::{RedisConfig, scripts};

/// The longest TTL accepted: one year. Redis itself accepts `PX` values of
/// hundreds of thousands of years, so the cap is ours.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Locks in one Redis server (or one Redis Cluster slot per name).
///
/// Clones share the connections; connect another backend for an
/// independent client. Each backend holds one multiplexed connection for
/// commands (reconnected automatically) and, from its first acquire, one
/// pub/sub connection shared by all its leases (a forced release reaches
/// the holder there) and waiters (woken there, first come, first served).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lockcore::LockError> {
/// use lock_redis::RedisBackend;
/// use lockcore::Locker;
///
/// let locker = Locker::new(RedisBackend::connect("redis://127.0.0.1:6379").await?);
/// let guard = locker.acquire("nightly-settlement").await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    commands: Commands,
    prefix: String,
    endpoint: String,
    op_timeout: Duration,
    /// The longest a lock handed to a woken waiter of this instance stays
    /// reserved for it (at most the waiter's TTL).
    claim_window: Duration,
    caps: Capabilities,
    notifier: Arc<Notifier>,
    persistence: Persistence,
    eviction: Eviction,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.notifier.shutdown();
    }
}

impl RedisBackend {
    /// Connects to the server `url` names (see [`RedisConfig::from_url`]).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad URL, [`LockError::Unavailable`]
    /// when the server cannot be reached in time, [`LockError::Store`] when it
    /// refuses the credentials.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(RedisConfig::from_url(url)?).await
    }

    /// Connects with a full configuration (an existing client or connection,
    /// key prefix, timeouts, durability requirement).
    ///
    /// Reads the server's persistence settings: without `appendfsync always`
    /// it logs a warning (fences then rely on the server clock, see the crate
    /// docs), or refuses with [`RedisConfig::require_durable_fences`].
    /// Reads its memory limit and policy: a server that may evict keys is
    /// refused unless [`RedisConfig::allow_maxmemory_eviction`] (then it
    /// logs a warning). Settings it cannot read (an ACL denies `CONFIG`)
    /// are logged and reported as unknown, never refused.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), plus [`LockError::InvalidConfig`] for an
    /// invalid prefix or timeout, non-durable persistence when required, or
    /// an evicting `maxmemory-policy` not accepted.
    pub async fn connect_with(config: RedisConfig) -> Result<Self, LockError> {
        config.validate()?;
        if config.uses_tls() {
            install_tls_provider();
        }
        let endpoint = config.endpoint();
        let op_timeout = config.connect_timeout + config.response_timeout;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let mut con = match config.connection.clone() {
            Some(con) => con,
            None => connection::open(&config, &endpoint, manager.clone()).await?,
        };
        // A first command proves the credentials and the link; the
        // persistence probe may be refused (ACL), that is not fatal.
        let ping_cmd = redis::cmd("PING");
        let ping = ping_cmd.query_async::<String>(&mut con);
        match tokio::time::timeout(op_timeout, ping).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(error::at_connect(&endpoint, e)),
            Err(_) => return Err(error::timed_out(&format!("PING {endpoint}"), op_timeout)),
        }
        let persistence = tokio::time::timeout(op_timeout, Persistence::probe(&mut con))
            .await
            .unwrap_or_else(|_| Persistence::Unknown("CONFIG GET timed out".into()));
        if !persistence.is_durable() {
            if config.require_durable_fences {
                return Err(LockError::config(format!(
                    "{endpoint} persists with {persistence}; durable fences need \
                     `appendonly yes` and `appendfsync always`"
                )));
            }
            tracing::warn!(
                endpoint = %endpoint,
                persistence = %persistence,
                "redis without `appendfsync always`: after a crash, fencing tokens stay \
                 monotonic only if the server clock does not step back, and held locks may be forgotten"
            );
        }
        let eviction = tokio::time::timeout(op_timeout, Eviction::probe(&mut con))
            .await
            .unwrap_or_else(|_| Eviction::Unknown("CONFIG GET timed out".into()));
        match &eviction {
            Eviction::Evicts { .. } if !config.allow_maxmemory_eviction => {
                return Err(LockError::config(
                    eviction.refusal(&endpoint).unwrap_or_default(),
                ));
            }
            Eviction::Evicts { .. } => tracing::warn!(
                endpoint = %endpoint,
                eviction = %eviction,
                "redis may evict lock keys when memory runs short (accepted with \
                 allow_maxmemory_eviction): a second client can then be granted a lock that is \
                 still held; only fencing tells the holders apart"
            ),
            Eviction::Unknown(why) => tracing::warn!(
                endpoint = %endpoint,
                why = %why,
                "could not read maxmemory / maxmemory-policy: make sure the server runs with \
                 `maxmemory-policy noeviction` or no maxmemory, or it may evict held locks"
            ),
            Eviction::Unlimited | Eviction::Refuses { .. } => {}
        }
        let caps = Capabilities::new(BACKEND)
            .expiry_clock(ExpiryClock::StoreWallClock)
            .ttl_range(Duration::from_millis(1), MAX_TTL)
            .ttl_granularity(Duration::from_millis(1))
            .fairness(Fairness::Fifo)
            .fence_durability(FenceDurability::Conditional(eviction.fence_assumption()))
            .notifications(true)
            .expiry_slack(Duration::from_millis(1))
            // A forced release publishes to the holder's subscription in the
            // same script: one message, on a link whose PINGs are answered
            // within the response timeout (or it is replaced and every lease
            // checked, see `notify`).
            .eviction_notice(Some(config.response_timeout));
        let (notifier, events) = Notifier::new(
            config.client.clone(),
            op_timeout,
            config.response_timeout,
            keys::wake_channel(&config.key_prefix),
            keys::evict_channel(&config.key_prefix),
        );
        let inner = Arc::new(Inner {
            commands: Commands::new(config.client.clone(), manager, op_timeout, con),
            prefix: config.key_prefix,
            endpoint,
            op_timeout,
            claim_window: config.response_timeout,
            caps,
            notifier,
            persistence,
            eviction,
        });
        tokio::spawn(handle_events(events, Arc::downgrade(&inner)));
        Ok(RedisBackend { inner })
    }

    /// The connection lock commands use, for your own commands (e.g.
    /// [`fenced_apply`](Self::fenced_apply) on data kept in the same server).
    pub fn connection(&self) -> ConnectionManager {
        self.inner.commands.get().1
    }

    /// The server's persistence settings, as read at connect.
    pub fn persistence(&self) -> &Persistence {
        &self.inner.persistence
    }

    /// The server's memory limit and eviction policy, as read at connect.
    pub fn eviction(&self) -> &Eviction {
        &self.inner.eviction
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Applies `command` only if `token` is not older than the last token
    /// applied through `fence_key`; see [`fenced_apply`](crate::fenced_apply).
    ///
    /// # Errors
    /// As [`fenced_apply`](crate::fenced_apply).
    pub async fn fenced_apply<T: redis::FromRedisValue>(
        &self,
        fence_key: &str,
        token: FencingToken,
        command: &redis::Cmd,
    ) -> Result<Fenced<T>, LockError> {
        let mut con = self.connection();
        tokio::time::timeout(
            self.inner.op_timeout,
            fenced::fenced_apply(&mut con, fence_key, token, command),
        )
        .await
        .unwrap_or_else(|_| Err(error::timed_out("fenced write", self.inner.op_timeout)))
    }

    fn keys(&self, name: &LockName) -> Keys {
        Keys::new(&self.inner.prefix, name)
    }

    /// A script invocation whose first argument is a fresh nonce.
    fn prepare(script: &'static Script) -> (redis::ScriptInvocation<'static>, String) {
        let nonce = connection::nonce();
        let mut invocation = script.prepare_invoke();
        invocation.arg(&nonce);
        (invocation, nonce)
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        what: &str,
        (invocation, nonce): &(redis::ScriptInvocation<'static>, String),
    ) -> Result<T, LockError> {
        self.inner.commands.invoke(what, nonce, invocation).await
    }

    /// One acquire script. With `line` (the wait's member and how long the
    /// line is kept without a refresh), a held lock puts the caller in line.
    async fn attempt(
        &self,
        name: &LockName,
        keys: &Keys,
        ttl: Ttl,
        owner: OwnerToken,
        line: Option<(&str, Duration)>,
    ) -> Result<Attempt, LockError> {
        let (member, linger) = line.unwrap_or_default();
        let mut call = Self::prepare(&scripts::ACQUIRE);
        call.0
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.next)
            .arg(owner.encode())
            .arg(ttl.as_millis_ceil())
            .arg(member)
            .arg(linger.as_millis() as u64);
        // Listening for an eviction of this grant starts before it exists.
        let watch = self.inner.notifier.watch_hold(&keys.lock, owner);
        let sent_at = Moment::now();
        let acquired = self
            .inner
            .commands
            .invoke_tracked("acquire", &call.1, &call.0)
            .await;
        let (granted, value): (i64, i64) = match acquired {
            Ok(reply) => reply,
            Err((e, maybe_ran)) => {
                if maybe_ran {
                    self.leave_later(
                        keys.clone(),
                        String::new(),
                        Some(owner),
                        sent_at.mono() + ttl.get(),
                    );
                }
                return Err(e);
            }
        };
        if granted == 1 {
            let fence = u64::try_from(value)
                .ok()
                .and_then(FencingToken::new)
                .ok_or_else(|| error::unexpected(format!("acquire returned fence {value}")))?;
            let lost = watch.granted(fence);
            Ok(Attempt::Acquired(
                Lease::new(name.clone(), owner, fence, ttl, sent_at)
                    .with_loss_signal(lost)
                    .with_extension(watch),
            ))
        } else {
            Ok(Attempt::Held {
                expires_in: remaining(value),
            })
        }
    }

    /// Takes `member` (if not empty) out of the line of `keys`, passing on a
    /// hand-off reserved for it, and frees the lock if `owner`'s attempt got
    /// it. Returns whether it freed the lock.
    async fn leave(
        &self,
        keys: &Keys,
        member: &str,
        owner: Option<OwnerToken>,
    ) -> Result<bool, LockError> {
        let mut call = Self::prepare(&scripts::LEAVE);
        call.0
            .key(&keys.lock)
            .key(&keys.queue)
            .key(&keys.next)
            .arg(member)
            .arg(owner.map(|o| o.encode()).unwrap_or_default());
        let (freed,): (i64,) = self.invoke("leave", &call).await?;
        Ok(freed == 1)
    }

    /// [`leave`](Self::leave) in the background, for a wait that ended
    /// without the lock or an acquire whose outcome is unknown. The first
    /// try keeps the backend alive (the wait may have been its last user);
    /// retries (the network that lost a reply may heal) go on until one gets
    /// an answer, `until` passes (by then a grant has expired) or the
    /// backend is dropped.
    fn leave_later(&self, keys: Keys, member: String, owner: Option<OwnerToken>, until: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the entry is skipped later, a grant expires
        };
        let mut first = Some(self.clone());
        let inner = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            let retry = lockcore::Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
            for attempt in 0_u32.. {
                let backend = first.take().or_else(|| {
                    let inner = inner.upgrade()?;
                    Some(RedisBackend { inner })
                });
                let Some(backend) = backend else {
                    return;
                };
                let outcome = backend.leave(&keys, &member, owner).await;
                drop(backend);
                match outcome {
                    Ok(freed) => {
                        if freed {
                            tracing::debug!(key = %keys.lock, "freed the lock of an acquire whose reply was lost");
                        }
                        return;
                    }
                    Err(e) if e.is_retryable() => {
                        let next = Instant::now() + retry.delay(attempt);
                        if next >= until {
                            return;
                        }
                        tokio::time::sleep_until(next).await;
                    }
                    Err(_) => return,
                }
            }
        });
    }
}

/// Handles what the notifier hands over, until the backend is dropped:
/// passes on hand-offs whose wake-up came after the wait had ended, and
/// checks leases whose eviction may have gone unheard.
async fn handle_events(mut events: mpsc::UnboundedReceiver<Event>, inner: Weak<Inner>) {
    while let Some(event) = events.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        match event {
            Event::Orphan(orphan) => {
                let Some(keys) = Keys::from_lock_key(&inner.prefix, &orphan.lock_key) else {
                    continue;
                };
                let backend = RedisBackend { inner };
                if let Err(e) = backend.leave(&keys, &orphan.member, None).await {
                    tracing::debug!(key = %keys.lock, error = %e, "could not pass a hand-off on; its reservation lapses");
                }
            }
            Event::Check(checks) => {
                tokio::spawn(check_leases(Arc::downgrade(&inner), checks));
            }
        }
    }
}

/// Reads the lock key of each lease (pipelined) and fires the loss signal
/// of every lease whose key no longer holds its `owner:fence`. Leases the
/// server could not be asked about are retried with backoff until it
/// answers, the subscription the check follows is gone (the next one
/// checks again), or the backend is dropped.
async fn check_leases(inner: Weak<Inner>, checks: Checks) {
    let retry = lockcore::Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let mut pending = checks.leases;
    for attempt in 0_u32.. {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.notifier.subscription() != Some(checks.subscription) {
            return;
        }
        let backend = RedisBackend { inner };
        let looked_up: Vec<_> = futures::stream::iter(pending)
            .map(
                |(lock_key, value, lost): (String, String, CancellationToken)| {
                    let backend = &backend;
                    async move {
                        let mut call = RedisBackend::prepare(&scripts::INSPECT);
                        call.0.key(&lock_key);
                        let found = backend
                            .invoke::<(i64, Option<String>)>("lease check", &call)
                            .await;
                        (lock_key, value, lost, found)
                    }
                },
            )
            .buffer_unordered(64)
            .collect()
            .await;
        drop(backend);
        pending = Vec::new();
        for (lock_key, value, lost, found) in looked_up {
            match found {
                Ok((_, held)) if held.as_deref() == Some(value.as_str()) => {}
                Ok(_) => {
                    tracing::debug!(key = %lock_key, "lease found gone after a resubscription");
                    lost.cancel();
                }
                Err(_) => pending.push((lock_key, value, lost)),
            }
        }
        if pending.is_empty() {
            return;
        }
        tokio::time::sleep(retry.delay(attempt)).await;
    }
}

/// A waiting acquire's place in line. Dropped before a grant (timeout,
/// error, cancellation), it leaves the line in the background and frees
/// what an attempt still in flight may have got.
struct InLine {
    backend: RedisBackend,
    keys: Keys,
    ttl: Duration,
    wait: Option<Wait>,
    member: String,
    /// An attempt carrying `member` was sent: the line may hold it.
    joined: bool,
    /// The owner token of an attempt sent and not yet answered.
    in_flight: Option<OwnerToken>,
    granted: bool,
}

impl Drop for InLine {
    fn drop(&mut self) {
        if self.granted || (!self.joined && self.in_flight.is_none()) {
            return;
        }
        let member = if self.joined {
            std::mem::take(&mut self.member)
        } else {
            String::new()
        };
        self.backend.leave_later(
            self.keys.clone(),
            member,
            self.in_flight,
            Instant::now() + self.ttl,
        );
    }
}

/// `"<owner>:<fence>"`: what the lock key holds for `lease`.
fn lease_value(lease: &Lease) -> String {
    format!("{}:{}", lease.owner().encode(), lease.fence())
}

/// Parses what the lock key holds.
fn parse_value(key: &str, value: &str) -> Result<(OwnerToken, FencingToken), LockError> {
    value
        .split_once(':')
        .and_then(|(owner, fence)| {
            Some((
                OwnerToken::decode(owner)?,
                FencingToken::new(fence.parse().ok()?)?,
            ))
        })
        .ok_or_else(|| {
            error::unexpected(format!(
                "{key} holds a value distlock did not write ({} bytes)",
                value.len()
            ))
        })
}

fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// `rediss://` needs a rustls crypto provider; install ring's unless the
/// process already chose one.
fn install_tls_provider() {
    #[cfg(feature = "tls")]
    {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.inner.endpoint)
            .field("key_prefix", &self.inner.prefix)
            .field("persistence", &self.inner.persistence)
            .field("eviction", &self.inner.eviction)
            .field("notifier", &self.inner.notifier)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.caps.clone()
    }

    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        let name = request.name();
        self.attempt(
            name,
            &self.keys(name),
            request.ttl(),
            OwnerToken::new(),
            None,
        )
        .await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease, LockError> {
        let ttl = lease.ttl();
        let keys = self.keys(lease.name());
        let mut call = Self::prepare(&scripts::RENEW);
        call.0
            .key(&keys.lock)
            .arg(lease_value(lease))
            .arg(ttl.as_millis() as u64);
        let sent_at = Moment::now();
        match self.invoke::<(i64,)>("renew", &call).await? {
            (1,) => Ok(lease.renewed(sent_at)),
            _ => Err(LockError::NotHeld {
                name: lease.name().clone(),
            }),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let keys = self.keys(lease.name());
        let mut call = Self::prepare(&scripts::RELEASE);
        call.0
            .key(&keys.lock)
            .key(&keys.queue)
            .key(&keys.next)
            .arg(lease_value(lease));
        match self.invoke::<(i64,)>("release", &call).await? {
            (1,) => Ok(ReleaseOutcome::Released),
            _ => Ok(ReleaseOutcome::NotHeld),
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let keys = self.keys(name);
        let mut call = Self::prepare(&scripts::INSPECT);
        call.0.key(&keys.lock);
        let (pttl, value): (i64, Option<String>) = self.invoke("inspect", &call).await?;
        value
            .map(|value| {
                let (owner, fence) = parse_value(&keys.lock, &value)?;
                Ok(Holder::new(fence, Some(owner), remaining(pttl)))
            })
            .transpose()
    }

    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let keys = self.keys(name);
        let mut call = Self::prepare(&scripts::FORCE_RELEASE);
        call.0
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.next)
            .arg(expected.map(|f| f.to_string()).unwrap_or_default())
            .arg(keys::evict_channel(&self.inner.prefix));
        let (_fence, pttl, value): (i64, i64, Option<String>) =
            self.invoke("force_release", &call).await?;
        // The eviction happened: record it even if the old value is odd.
        let evicted = match value.as_deref().map(|v| parse_value(&keys.lock, v)) {
            Some(Ok((owner, fence))) => Some(Holder::new(fence, Some(owner), remaining(pttl))),
            Some(Err(e)) => {
                tracing::warn!(key = %keys.lock, error = %e, "force_release removed a foreign value");
                None
            }
            None => None,
        };
        Ok(evicted)
    }

    /// Waits in line: the first attempt joins the name's queue in Redis,
    /// and a release (or anyone finding the lock free) wakes the first
    /// waiter only, holding the free lock for it while it claims. Without a
    /// subscription connection it polls with backoff instead (no place in
    /// line, and no barging: a free lock goes to whoever heads the line).
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        let (name, ttl) = (request.name(), request.ttl());
        let window = ttl.get().min(self.inner.claim_window);
        // A waiter re-attempts at least every `recheck`; its entry outlives that.
        let linger = wait.recheck.min(MAX_TTL) + self.inner.op_timeout;
        let mut line = InLine {
            backend: self.clone(),
            keys: self.keys(name),
            ttl: ttl.get(),
            wait: None,
            member: String::new(),
            joined: false,
            in_flight: None,
            granted: false,
        };
        let mut attempt: u32 = 0;
        loop {
            if line.wait.is_none() {
                match self.inner.notifier.join().await {
                    Ok(joined) => {
                        line.member = joined.member(window);
                        line.wait = Some(joined);
                    }
                    Err(e) if e.is_retryable() => {
                        tracing::debug!(name = %name, error = %e, "waiting without wake-ups");
                    }
                    Err(e) => return Err(e),
                }
            }
            attempt = attempt.saturating_add(1);
            tracing::Span::current().record("attempts", attempt);
            let owner = OwnerToken::new();
            line.in_flight = Some(owner);
            let in_line = line
                .wait
                .is_some()
                .then_some((line.member.as_str(), linger));
            line.joined |= in_line.is_some();
            let outcome = self.attempt(name, &line.keys, ttl, owner, in_line).await;
            line.in_flight = None;
            let (expires_in, failed) = match outcome {
                Ok(Attempt::Acquired(lease)) => {
                    line.granted = true;
                    return Ok(Some(lease));
                }
                Ok(Attempt::Held { expires_in }) => (expires_in, None),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(name = %name, attempt, error = %e, "acquire attempt failed, will retry");
                    (None, Some(e))
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= wait.deadline {
                return failed.map_or(Ok(None), Err);
            }
            // Retry right after the holder's TTL (or a reservation) runs out:
            // expiry sends no message.
            let notified = line.wait.is_some() && failed.is_none();
            let until = wait.retry_at(now, attempt, expires_in, notified);
            match &line.wait {
                Some(joined) => {
                    tokio::select! {
                        _ = joined.woken() => {}
                        _ = tokio::time::sleep_until(until) => {}
                    }
                }
                None => tokio::time::sleep_until(until).await,
            }
        }
    }
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
            Capabilities::new("test")
                .effective_ttl(Duration::from_secs(1))
                .unwrap(),
            Instant::now(),
        );
        let value = lease_value(&lease);
        assert_eq!(
            parse_value("k", &value).unwrap(),
            (lease.owner(), lease.fence())
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
