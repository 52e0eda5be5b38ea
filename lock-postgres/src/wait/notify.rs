//! Wake-ups through LISTEN/NOTIFY: one listener connection per backend
//! instance, shared by all its waiters, and listening only while they wait.
//!
//! A waiter of a topic (a lock name, a semaphore's or a reader-writer
//! lock's, see `keys.rs`) has the listener `LISTEN` and take the topic's
//! *watch key*, an advisory lock held shared by every instance with a
//! waiter of it. A release (or a lost-reply cleanup, or a writer leaving
//! its intent) frees the row and, in the same statement, tries the
//! watch key exclusively: it fails while somebody watches, and only then
//! does the statement `pg_notify(channel, topic)`, sent when the release
//! commits. Taken, the key is held to the release's commit, so a waiter
//! registering meanwhile waits for that commit, then tries the lock and
//! finds it free: no release between registering and trying is missed.
//! Releases nobody waits for send nothing (every NOTIFY serializes its
//! transaction's commit with every other notifying commit of the server).
//!
//! The listener task wakes one local waiter of the topic per notification
//! (a release frees one lock or slot; waking all would be a herd), except
//! for a reader-writer lock, whose every local waiter wakes (a writer's
//! release admits every waiting reader).
//! Forced releases always notify. Expiries do not: waiters also re-check at
//! the holder's expiry and at least every `WaitPolicy::recheck`, which the
//! wait loop arranges.
//!
//! PostgreSQL signals *every* listening session of the database at each
//! notification, whatever its channel, so an idle listener is not free: the
//! connection runs `LISTEN` when a waiter needs it and `UNLISTEN` when a
//! notification arrives that nobody in this instance waits for, and lets go
//! of a topic's watch key with its last local waiter. A waiter is handed
//! its wake-up only once both are in effect. When the connection drops,
//! every waiter is woken to re-check (notifications sent meanwhile are
//! lost, and the watch keys went with the session); until it is back,
//! waiters poll with backoff.
//!
//! The same connection tells holders of a forced release. Every grant is
//! registered (by its owner token, before the acquire is sent) and, while
//! this instance holds anything, the connection also listens on the
//! table's eviction channel, where `evict` sends `fence owner name`: the
//! matching grant's loss signal is cancelled, so its guard fires `lost()`
//! about one round trip after the eviction commits. One LISTEN per
//! instance, however many locks it holds; it lingers a while after the
//! last one is dropped, so acquire-release cycles do not churn it. A grant
//! sent while that LISTEN was not in effect (first use, reconnect) could
//! have been evicted unseen: once the LISTEN is in effect, such grants are
//! checked against the table in one statement, and those gone are signalled.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lockcore::backend::CancellationToken;
use lockcore::backend::wait::Wakeup;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::wait::listener::{self, Config, Request};
use crate::wait::registry::Shared;
use lockcore::backend::Era;

/// The waiters and holders of one backend instance, and its listener task.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
    config: Arc<Config>,
    requests: OnceLock<mpsc::UnboundedSender<Request>>,
    stop: CancellationToken,
    /// The listener task, once started.
    task: TaskTracker,
}

impl Wakeups {
    /// Every grant's loss signal comes from `era` (see [`Era`]).
    pub(crate) fn new(config: Config, era: Arc<Era>) -> Self {
        Wakeups {
            shared: Arc::new(Shared::new(era)),
            config: Arc::new(config),
            requests: OnceLock::new(),
            stop: CancellationToken::new(),
            task: TaskTracker::new(),
        }
    }

    /// Stops the listener task and returns once it has closed its
    /// connection (its `LISTEN`s and watch keys end with the session), or
    /// `limit` passed. No task starts afterwards.
    pub(crate) async fn close(&self, limit: Duration) -> bool {
        self.stop.cancel();
        self.task.close();
        tokio::time::timeout(limit, self.task.wait()).await.is_ok()
    }

    /// A wake-up for the next release of `topic` (see `keys::lock_topic`),
    /// registered, and with `LISTEN` and the topic's watch key in effect,
    /// before it is returned; `None` while the listener cannot connect (the
    /// caller then polls with backoff).
    pub(crate) async fn watch(&self, topic: String) -> Option<Wakeup> {
        let requests = self.task().clone();
        let (registration, ready) = Registration::new(&self.shared, topic, requests.clone());
        let mut notified = Box::pin(registration.notify.clone().notified_owned());
        notified.as_mut().enable();
        if !ready {
            let (answer, answered) = oneshot::channel();
            requests
                .send(Request::Watch(registration.topic.clone(), answer))
                .ok()?;
            match tokio::time::timeout(self.config.connect_timeout, answered).await {
                Ok(Ok(true)) => {}
                _ => return None,
            }
        }
        Some(Box::pin(async move {
            notified.await;
            drop(registration);
        }))
    }

    /// Waiters registered for a wake-up, over all topics.
    pub(crate) fn waiting(&self) -> usize {
        self.shared.waiting()
    }

    /// Registers the grant an acquire of `name` by `owner` may get; call it
    /// before the acquire is sent, so an eviction that follows the grant at
    /// once is not missed. Never waits: the eviction `LISTEN` is started in
    /// the background if it is not in effect.
    pub(crate) fn expect(&self, name: &str, owner: Uuid) -> Pending {
        let requests = self.task().clone();
        if !self.shared.expect(name, owner) {
            let _ = requests.send(Request::Holders);
        }
        Pending(Some(Holding {
            shared: self.shared.clone(),
            requests,
            owner,
        }))
    }

    /// The listener task, started on first use: backends that never wait
    /// nor hold never open the extra connection. Never once closed: the
    /// requests then go nowhere.
    fn task(&self) -> &mpsc::UnboundedSender<Request> {
        self.requests.get_or_init(|| {
            let (requests, received) = mpsc::unbounded_channel();
            if !self.stop.is_cancelled() {
                self.task.spawn(listener::listen(
                    self.shared.clone(),
                    self.config.clone(),
                    received,
                    self.stop.clone(),
                ));
            }
            requests
        })
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (listening, evictions, holding) = self.shared.status();
        f.debug_struct("Wakeups")
            .field("channel", &self.config.channel)
            .field("listening", &listening)
            .field("waiting", &self.waiting())
            .field("listening_for_evictions", &evictions)
            .field("holding", &holding)
            .finish()
    }
}

/// An acquire in flight, registered as a possible grant; dropped without
/// [`granted`](Self::granted), it unregisters.
pub(crate) struct Pending(Option<Holding>);

impl Pending {
    /// The acquire got `fence`: its loss signal (already cancelled if an
    /// eviction of it arrived first) and its registration, which lasts as
    /// long as the lease.
    pub(crate) fn granted(mut self, fence: i64) -> (CancellationToken, Holding) {
        let holding = self.0.take().expect("granted once");
        let (lost, covered) = holding.shared.granted(holding.owner, fence);
        if !covered {
            let _ = holding.requests.send(Request::Holders);
        }
        (lost, holding)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(holding) = self.0.take() {
            holding.forget();
        }
    }
}

/// A held grant's registration for eviction notices; dropping it (with the
/// last clone of its lease) unregisters.
pub(crate) struct Holding {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedSender<Request>,
    owner: Uuid,
}

impl Holding {
    /// Stops watching for this grant's eviction (it was released).
    pub(crate) fn forget(&self) {
        if self.shared.forget(self.owner) {
            let _ = self.requests.send(Request::Holders);
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.forget();
    }
}

impl fmt::Debug for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holding")
            .field("owner", &self.owner)
            .finish()
    }
}

/// One waiter's place in the registry, for as long as its wake-up lives.
struct Registration {
    shared: Arc<Shared>,
    topic: String,
    notify: Arc<Notify>,
    requests: mpsc::UnboundedSender<Request>,
}

impl Registration {
    /// Registers, and says whether `LISTEN` and the watch key were in
    /// effect at that moment.
    fn new(
        shared: &Arc<Shared>,
        topic: String,
        requests: mpsc::UnboundedSender<Request>,
    ) -> (Self, bool) {
        let (notify, ready) = shared.register(&topic);
        let registration = Registration {
            shared: shared.clone(),
            topic,
            notify,
            requests,
        };
        (registration, ready)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.shared.unregister(&self.topic) {
            let _ = self
                .requests
                .send(Request::Unwatch(std::mem::take(&mut self.topic)));
        }
    }
}
