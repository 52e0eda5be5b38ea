//! Wake-ups: one pub/sub connection per backend, shared by all its waiters.
//!
//! The release and force-release scripts `PUBLISH` on the name's channel.
//! A waiter registers before its acquire attempt and subscribes the channel
//! (once per name while anyone waits, plus a linger so a busy name is not
//! re-subscribed on every hand-off). A message wakes **one** local waiter of
//! that name, the one waiting longest (no herd inside a process); if it
//! loses the race to another process, the next release wakes it again.
//! When the subscription connection drops, it is re-established and every
//! waiter is woken to re-check (messages may have been missed meanwhile);
//! until then waiters sleep at most their re-check interval, and new ones
//! poll with backoff. A lost message only ever costs latency, never liveness.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use lockcore::{LockError, Wakeup};
use redis::aio::PubSubSink;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{self, BACKEND};

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(10);
/// Longest pause between reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// The subscription connection's state, as waiters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Never connected yet: the first waiter waits for it.
    Starting,
    /// Connected; the number counts connections made so far.
    Up(u64),
    /// Lost; being re-established. Waiters poll meanwhile.
    Down,
}

pub(crate) struct Notifier {
    client: redis::Client,
    timeout: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// The live connection's sink, with its generation. Holding this lock
    /// serializes (un)subscriptions, so they reach the server in order.
    sink: tokio::sync::Mutex<Option<(u64, PubSubSink)>>,
    link: watch::Sender<Link>,
    /// A generation whose connection misbehaved (an unanswered
    /// (un)subscribe): the task drops it and reconnects.
    abandon: watch::Sender<u64>,
    started: OnceLock<()>,
    shutdown: CancellationToken,
}

struct Channel {
    notify: Arc<Notify>,
    watchers: usize,
    /// The connection generation this channel is subscribed on.
    subscribed: Option<u64>,
    idle_since: Instant,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("link", &*self.link.borrow())
            .field("channels", &self.lock().len())
            .finish()
    }
}

impl Notifier {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Arc<Self> {
        Arc::new(Notifier {
            client,
            timeout,
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            link: watch::channel(Link::Starting).0,
            abandon: watch::channel(0).0,
            started: OnceLock::new(),
            shutdown: CancellationToken::new(),
        })
    }

    /// Stops the connection task; called when the backend is dropped.
    pub(crate) fn shutdown(&self) {
        self.shutdown.cancel();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        // Every update under this lock is a few field writes that cannot
        // panic half-way, so a poisoned lock holds consistent data.
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a waiter on `channel` and makes sure the channel is
    /// subscribed before returning, so a release published after this call
    /// returns is never missed.
    pub(crate) async fn watch(self: &Arc<Self>, channel: &str) -> Result<Wakeup, LockError> {
        if self.started.set(()).is_ok() {
            tokio::spawn(self.clone().run());
        }
        let generation = self.wait_for_link().await?;
        let registration = Registration {
            notifier: self.clone(),
            channel: channel.to_owned(),
        };
        let (notify, subscribed) = {
            let mut channels = self.lock();
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    notify: Arc::new(Notify::new()),
                    watchers: 0,
                    subscribed: None,
                    idle_since: Instant::now(),
                });
            entry.watchers += 1;
            (entry.notify.clone(), entry.subscribed == Some(generation))
        };
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        if !subscribed {
            self.subscribe(channel).await?;
        }
        Ok(Box::pin(async move {
            let _registered = registration;
            notified.await;
        }))
    }

    async fn wait_for_link(&self) -> Result<u64, LockError> {
        let mut link = self.link.subscribe();
        let ready = tokio::time::timeout(
            self.timeout,
            link.wait_for(|l| !matches!(l, Link::Starting)),
        )
        .await;
        match ready {
            Ok(Ok(link)) => match *link {
                Link::Up(generation) => Ok(generation),
                Link::Starting | Link::Down => Err(link_down()),
            },
            Ok(Err(_)) => Err(link_down()),
            Err(_) => Err(error::timed_out("pub/sub connect", self.timeout)),
        }
    }

    async fn subscribe(&self, channel: &str) -> Result<(), LockError> {
        let mut sink = self.sink.lock().await;
        let Some((generation, sink)) = sink.as_mut() else {
            return Err(link_down());
        };
        if self.lock().get(channel).and_then(|c| c.subscribed) == Some(*generation) {
            return Ok(());
        }
        match tokio::time::timeout(self.timeout, sink.subscribe(channel)).await {
            Ok(Ok(())) => {
                if let Some(entry) = self.lock().get_mut(channel) {
                    entry.subscribed = Some(*generation);
                }
                Ok(())
            }
            Ok(Err(e)) => {
                self.abandon.send_replace(*generation);
                Err(error::map(e))
            }
            Err(_) => {
                self.abandon.send_replace(*generation);
                Err(error::timed_out("SUBSCRIBE", self.timeout))
            }
        }
    }

    /// Wakes one waiter of `channel`, the one waiting longest.
    fn dispatch(&self, channel: &str) {
        if let Some(entry) = self.lock().get(channel) {
            entry.notify.notify_one();
        }
    }

    /// Wakes every waiter: after a reconnect, messages may have been missed.
    fn wake_all(&self) {
        for entry in self.lock().values() {
            entry.notify.notify_waiters();
        }
    }

    /// Keeps the subscription connection up until shutdown.
    async fn run(self: Arc<Self>) {
        let mut generation = 0;
        let mut failures: u32 = 0;
        loop {
            let connected = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                c = tokio::time::timeout(self.timeout, self.client.get_async_pubsub()) => c,
            };
            let pubsub = match connected {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "redis pub/sub connect failed");
                    self.link_down(&mut failures).await;
                    continue;
                }
                Err(_) => {
                    tracing::debug!("redis pub/sub connect timed out");
                    self.link_down(&mut failures).await;
                    continue;
                }
            };
            let (mut sink, mut stream) = pubsub.split();
            generation += 1;
            {
                let mut slot = self.sink.lock().await;
                let wanted: Vec<String> = self.lock().keys().cloned().collect();
                if !wanted.is_empty() {
                    match tokio::time::timeout(self.timeout, sink.subscribe(&wanted)).await {
                        Ok(Ok(())) => {}
                        _ => {
                            drop(slot);
                            self.link_down(&mut failures).await;
                            continue;
                        }
                    }
                    for name in &wanted {
                        if let Some(entry) = self.lock().get_mut(name) {
                            entry.subscribed = Some(generation);
                        }
                    }
                }
                *slot = Some((generation, sink));
            }
            failures = 0;
            self.link.send_replace(Link::Up(generation));
            if generation > 1 {
                self.wake_all();
            }
            let mut sweep = tokio::time::interval(LINGER / 2);
            sweep.tick().await;
            let mut abandon = self.abandon.subscribe();
            loop {
                tokio::select! {
                    _ = self.shutdown.cancelled() => return,
                    _ = async { let _ = abandon.wait_for(|g| *g == generation).await; } => break,
                    msg = stream.next() => match msg {
                        Some(msg) => self.dispatch(msg.get_channel_name()),
                        None => break,
                    },
                    _ = sweep.tick() => self.sweep().await,
                }
            }
            tracing::debug!("redis pub/sub connection lost; reconnecting");
            self.link_down(&mut failures).await;
        }
    }

    /// Marks the link down and pauses before the next attempt. Registered
    /// waiters keep sleeping (bounded by their re-check) and are all woken
    /// once the link is back; new ones poll until then.
    async fn link_down(&self, failures: &mut u32) {
        *self.sink.lock().await = None;
        for entry in self.lock().values_mut() {
            entry.subscribed = None;
        }
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

    /// Unsubscribes channels nobody has waited on for [`LINGER`], so the
    /// subscription set stays bounded by the names recently waited on.
    async fn sweep(&self) {
        let mut slot = self.sink.lock().await;
        let idle: Vec<String> = {
            let mut channels = self.lock();
            let now = Instant::now();
            let idle: Vec<String> = channels
                .iter()
                .filter(|(_, c)| {
                    c.watchers == 0 && now.saturating_duration_since(c.idle_since) >= LINGER
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in &idle {
                channels.remove(name);
            }
            idle
        };
        if idle.is_empty() {
            return;
        }
        if let Some((generation, sink)) = slot.as_mut() {
            match tokio::time::timeout(self.timeout, sink.unsubscribe(&idle)).await {
                Ok(Ok(())) => {}
                _ => {
                    self.abandon.send_replace(*generation);
                }
            }
        }
    }
}

fn link_down() -> LockError {
    LockError::unavailable(
        BACKEND,
        "the pub/sub connection is down; waiting falls back to polling",
    )
}

/// One waiter's registration; dropping it (with the wake-up future) lets the
/// channel go idle.
struct Registration {
    notifier: Arc<Notifier>,
    channel: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(entry) = self.notifier.lock().get_mut(&self.channel) {
            entry.watchers = entry.watchers.saturating_sub(1);
            if entry.watchers == 0 {
                entry.idle_since = Instant::now();
            }
        }
    }
}
