//! Wake-ups: one pub/sub connection per backend instance, subscribed to one
//! channel of its own, shared by all its waits.
//!
//! A waiting acquire joins the name's line in Redis with a member naming
//! this channel and a wait id (see `scripts/line.lua`). When the lock is
//! released, or found free by anyone, the script pops the first waiter and
//! publishes to that waiter's instance only: per hand-off one instance and
//! one wait are woken, never a herd. A message for a wait that has already
//! ended is handed back to the backend ([`Orphan`]), which passes the
//! hand-off on to the next waiter.
//!
//! When the subscription connection drops, releases meanwhile find no
//! subscriber and skip this instance's waiters; once it is back, every local
//! wait is woken to re-check (and rejoin the line). Until then new waits
//! poll with backoff, and every wait re-checks at least every
//! `WaitPolicy::recheck`: a lost message only ever costs latency.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use lockcore::LockError;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::error::{self, BACKEND};

/// Longest pause between reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// The subscription connection's state, as waits see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Never connected yet: the first wait waits for it.
    Starting,
    /// Subscribed.
    Up,
    /// Lost; being re-established. Waits poll meanwhile.
    Down,
}

/// A wake-up that reached this instance for a wait that has ended: the
/// hand-off it announces must be passed on.
#[derive(Debug)]
pub(crate) struct Orphan {
    /// The ended wait's member in the line.
    pub(crate) member: String,
    /// The lock key the hand-off is for.
    pub(crate) lock_key: String,
}

pub(crate) struct Notifier {
    client: redis::Client,
    timeout: Duration,
    /// This instance's channel: `<prefix>wake:<random>`.
    channel: String,
    waits: Mutex<HashMap<u64, Arc<Notify>>>,
    next_id: AtomicU64,
    link: watch::Sender<Link>,
    orphans: mpsc::UnboundedSender<Orphan>,
    started: OnceLock<()>,
    shutdown: CancellationToken,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("link", &*self.link.borrow())
            .field("waits", &self.lock().len())
            .finish()
    }
}

/// One registered wait. Dropping it unregisters it; a wake-up that arrives
/// afterwards becomes an [`Orphan`].
pub(crate) struct Wait {
    notifier: Arc<Notifier>,
    id: u64,
    notify: Arc<Notify>,
}

impl Wait {
    /// This wait's member in a line: `<wait id>:<claim window ms>:<channel>`.
    /// A lock handed to it stays reserved for it for `window`.
    pub(crate) fn member(&self, window: Duration) -> String {
        let ms = window.as_millis().clamp(1, u128::from(u32::MAX));
        format!("{}:{ms}:{}", self.id, self.notifier.channel)
    }

    /// Completes when this wait is woken; a wake-up that came while nobody
    /// awaited is kept, so none is lost between two attempts.
    pub(crate) async fn woken(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        self.notifier.lock().remove(&self.id);
    }
}

impl Notifier {
    /// A notifier for `channel`, and the receiver of its orphaned wake-ups.
    pub(crate) fn new(
        client: redis::Client,
        timeout: Duration,
        channel: String,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Orphan>) {
        let (orphans, orphaned) = mpsc::unbounded_channel();
        let notifier = Arc::new(Notifier {
            client,
            timeout,
            channel,
            waits: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            link: watch::channel(Link::Starting).0,
            orphans,
            started: OnceLock::new(),
            shutdown: CancellationToken::new(),
        });
        (notifier, orphaned)
    }

    /// Stops the connection task; called when the backend is dropped.
    pub(crate) fn shutdown(&self) {
        self.shutdown.cancel();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Notify>>> {
        // Every update under this lock is one map insert or removal that
        // cannot panic half-way, so a poisoned lock holds consistent data.
        self.waits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a wait once the channel is subscribed (connecting on first
    /// use), so a wake-up published after this returns is never missed.
    ///
    /// # Errors
    /// A retryable error while the subscription connection is down.
    pub(crate) async fn join(self: &Arc<Self>) -> Result<Wait, LockError> {
        if self.started.set(()).is_ok() {
            tokio::spawn(self.clone().run());
        }
        let mut link = self.link.subscribe();
        let ready = tokio::time::timeout(
            self.timeout,
            link.wait_for(|l| !matches!(l, Link::Starting)),
        )
        .await;
        match ready {
            Ok(Ok(link)) if *link == Link::Up => {}
            Ok(_) => return Err(link_down()),
            Err(_) => return Err(error::timed_out("pub/sub connect", self.timeout)),
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        self.lock().insert(id, notify.clone());
        Ok(Wait {
            notifier: self.clone(),
            id,
            notify,
        })
    }

    /// Handles one message, `<member> <lock key>`: wakes the wait it names,
    /// or hands it back if that wait has ended.
    fn dispatch(&self, payload: &str) {
        let Some((member, lock_key)) = payload.split_once(' ') else {
            return;
        };
        let id = member.split_once(':').and_then(|(id, rest)| {
            let (_window, channel) = rest.split_once(':')?;
            (channel == self.channel).then(|| id.parse::<u64>().ok())?
        });
        let Some(id) = id else {
            tracing::debug!(payload, "ignoring a wake-up this instance did not ask for");
            return;
        };
        let notify = self.lock().get(&id).cloned();
        match notify {
            Some(notify) => notify.notify_one(),
            None => {
                let _ = self.orphans.send(Orphan {
                    member: member.to_owned(),
                    lock_key: lock_key.to_owned(),
                });
            }
        }
    }

    /// Wakes every wait: after a reconnect, wake-ups may have been missed.
    fn wake_all(&self) {
        for notify in self.lock().values() {
            notify.notify_one();
        }
    }

    async fn subscribe(&self) -> redis::RedisResult<redis::aio::PubSub> {
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        Ok(pubsub)
    }

    /// Keeps the subscription connection up until shutdown.
    async fn run(self: Arc<Self>) {
        let mut connections: u64 = 0;
        let mut failures: u32 = 0;
        loop {
            let subscribed = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                s = tokio::time::timeout(self.timeout, self.subscribe()) => s,
            };
            let mut pubsub = match subscribed {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "redis pub/sub subscribe failed");
                    self.link_down(&mut failures).await;
                    continue;
                }
                Err(_) => {
                    tracing::debug!("redis pub/sub subscribe timed out");
                    self.link_down(&mut failures).await;
                    continue;
                }
            };
            connections += 1;
            failures = 0;
            self.link.send_replace(Link::Up);
            if connections > 1 {
                self.wake_all();
            }
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    _ = self.shutdown.cancelled() => return,
                    msg = messages.next() => match msg {
                        Some(msg) => self.dispatch(&String::from_utf8_lossy(msg.get_payload_bytes())),
                        None => break,
                    },
                }
            }
            tracing::debug!("redis pub/sub connection lost; reconnecting");
            self.link_down(&mut failures).await;
        }
    }

    /// Marks the link down and pauses before the next attempt. Registered
    /// waits keep sleeping (bounded by their re-check) and are all woken
    /// once the link is back; new ones poll until then.
    async fn link_down(&self, failures: &mut u32) {
        self.link.send_replace(Link::Down);
        let delay = Duration::from_millis(50)
            .saturating_mul(1 << (*failures).min(5))
            .min(MAX_RECONNECT_DELAY);
        *failures = failures.saturating_add(1);
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

fn link_down() -> LockError {
    LockError::unavailable(
        BACKEND,
        "the pub/sub connection is down; waiting falls back to polling",
    )
}
