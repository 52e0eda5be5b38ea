//! Wake-ups through LISTEN/NOTIFY: one listener connection per backend
//! instance, shared by all its waiters, and listening only while they wait.
//!
//! Releases and forced releases `pg_notify(channel, name)` in the statement
//! that frees the row, so the notification is sent exactly when the change
//! commits. The listener task wakes one local waiter of that name (a release
//! frees the lock for one acquirer; waking all would be a herd). Expiries
//! do not notify: waiters also re-check at the holder's expiry and at least
//! every `WaitPolicy::recheck`, which `acquire_loop` arranges.
//!
//! PostgreSQL signals *every* listening session of the database at each
//! notification, whatever its channel, so an idle listener is not free: with
//! turnstiles, one instance at a time waits for a given name, and N
//! instances that all kept listening would wake N server processes (and N
//! client tasks) per release. So the connection runs `LISTEN` when a waiter
//! needs it and `UNLISTEN` when a notification arrives that nobody in this
//! instance waits for. A waiter is only handed its wake-up once `LISTEN` is
//! in effect, and then tries the lock, so no release between the two is
//! missed. When the connection drops, every waiter is woken to re-check,
//! because notifications sent meanwhile are lost; until it is back, waiters
//! poll with backoff.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use lockcore::{CancellationToken, LockName, Wakeup};
use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPoolOptions};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

/// The waiters of one backend instance, and its listener task.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
    options: PgConnectOptions,
    channel: String,
    connect_timeout: Duration,
    /// Requests to the listener task: "make LISTEN effective, then answer".
    listen: OnceLock<mpsc::UnboundedSender<oneshot::Sender<bool>>>,
    stop: CancellationToken,
}

struct Shared {
    state: Mutex<State>,
}

/// Waiters and whether `LISTEN` is in effect, under one lock: a waiter that
/// registers sees `listening` as the task left it, and the task decides to
/// `UNLISTEN` only when no waiter is registered.
struct State {
    waiters: HashMap<String, Waiters>,
    listening: bool,
}

struct Waiters {
    notify: Arc<Notify>,
    count: usize,
}

impl Wakeups {
    pub(crate) fn new(
        options: PgConnectOptions,
        channel: String,
        connect_timeout: Duration,
    ) -> Self {
        Wakeups {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    waiters: HashMap::new(),
                    listening: false,
                }),
            }),
            options,
            channel,
            connect_timeout,
            listen: OnceLock::new(),
            stop: CancellationToken::new(),
        }
    }

    /// A wake-up for the next release of `name`, registered and with
    /// `LISTEN` in effect before it is returned; `None` while the listener
    /// cannot connect (the caller then polls with backoff).
    pub(crate) async fn watch(&self, name: &LockName) -> Option<Wakeup> {
        let (registration, listening) = Registration::new(&self.shared, name.as_str());
        let mut notified = Box::pin(registration.notify.clone().notified_owned());
        notified.as_mut().enable();
        if !listening {
            let (answer, answered) = oneshot::channel();
            self.task().send(answer).ok()?;
            match tokio::time::timeout(self.connect_timeout, answered).await {
                Ok(Ok(true)) => {}
                _ => return None,
            }
        }
        Some(Box::pin(async move {
            notified.await;
            drop(registration);
        }))
    }

    /// The listener task, started on first use: backends that never wait
    /// never open the extra connection.
    fn task(&self) -> &mpsc::UnboundedSender<oneshot::Sender<bool>> {
        self.listen.get_or_init(|| {
            let (requests, received) = mpsc::unbounded_channel();
            tokio::spawn(listen(
                self.shared.clone(),
                self.options.clone(),
                self.channel.clone(),
                self.connect_timeout,
                received,
                self.stop.clone(),
            ));
            requests
        })
    }

    /// Waiters currently registered, over all names (for Debug).
    pub(crate) fn waiting(&self) -> usize {
        self.shared.lock().waiters.values().map(|w| w.count).sum()
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listening = self.shared.lock().listening;
        f.debug_struct("Wakeups")
            .field("channel", &self.channel)
            .field("listening", &listening)
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Updates are single map operations; a panic cannot leave it torn.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes one waiter of `name`; `false` when this instance waits for
    /// nothing at all (the notification was of no use to it).
    fn wake(&self, name: &str) -> bool {
        let state = self.lock();
        if let Some(waiters) = state.waiters.get(name) {
            waiters.notify.notify_one();
        }
        !state.waiters.is_empty()
    }

    fn wake_all(&self) {
        for waiters in self.lock().waiters.values() {
            waiters.notify.notify_waiters();
        }
    }

    fn set_listening(&self, listening: bool) {
        self.lock().listening = listening;
    }

    /// Stops counting as listening if nobody waits; true if so.
    fn stop_listening_if_idle(&self) -> bool {
        let mut state = self.lock();
        if state.waiters.is_empty() {
            state.listening = false;
        }
        !state.listening
    }
}

/// One waiter's place in the registry; the entry of a name goes away with
/// its last waiter, so memory is bounded by the waiters, not the names.
struct Registration {
    shared: Arc<Shared>,
    name: String,
    notify: Arc<Notify>,
}

impl Registration {
    /// Registers, and says whether `LISTEN` was in effect at that moment.
    fn new(shared: &Arc<Shared>, name: &str) -> (Self, bool) {
        let (notify, listening) = {
            let mut state = shared.lock();
            let entry = state
                .waiters
                .entry(name.to_owned())
                .or_insert_with(|| Waiters {
                    notify: Arc::new(Notify::new()),
                    count: 0,
                });
            entry.count += 1;
            (entry.notify.clone(), state.listening)
        };
        let registration = Registration {
            shared: shared.clone(),
            name: name.to_owned(),
            notify,
        };
        (registration, listening)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        if let Some(entry) = state.waiters.get_mut(&self.name) {
            entry.count -= 1;
            if entry.count == 0 {
                state.waiters.remove(&self.name);
            }
        }
    }
}

/// What the listener task reacts to.
enum Event {
    Stop,
    Listen(oneshot::Sender<bool>),
    Received(Result<Option<PgNotification>, sqlx::Error>),
}

/// The listener task: `LISTEN` on request, dispatch notifications,
/// `UNLISTEN` when idle, reconnect on demand (with backoff after a failure),
/// until the backend is dropped.
async fn listen(
    shared: Arc<Shared>,
    options: PgConnectOptions,
    channel: String,
    connect_timeout: Duration,
    mut requests: mpsc::UnboundedReceiver<oneshot::Sender<bool>>,
    stop: CancellationToken,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(50);
    const MAX_BACKOFF: Duration = Duration::from_secs(2);
    let mut listener: Option<PgListener> = None;
    let mut listening = false;
    let mut backoff = MIN_BACKOFF;
    let mut retry_at = Instant::now();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => Event::Stop,
            request = requests.recv() => request.map_or(Event::Stop, Event::Listen),
            received = async {
                match listener.as_mut() {
                    Some(listener) => listener.try_recv().await,
                    None => Err(sqlx::Error::PoolClosed),
                }
            }, if listening => Event::Received(received),
        };
        match event {
            Event::Stop => return,
            Event::Listen(answer) => {
                if !listening && Instant::now() >= retry_at {
                    let started = tokio::time::timeout(
                        connect_timeout,
                        start_listening(&mut listener, &options, &channel, connect_timeout),
                    )
                    .await;
                    match started {
                        Ok(Ok(())) => {
                            listening = true;
                            backoff = MIN_BACKOFF;
                            shared.set_listening(true);
                        }
                        failed => {
                            let error = match failed {
                                Ok(Err(e)) => e.to_string(),
                                _ => format!("no answer within {connect_timeout:?}"),
                            };
                            tracing::debug!(%channel, %error, "LISTEN failed; waiters poll meanwhile");
                            listener = None;
                            retry_at = Instant::now() + backoff;
                            backoff = (backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                }
                let _ = answer.send(listening);
            }
            Event::Received(Ok(Some(notification))) => {
                if !shared.wake(notification.payload()) && shared.stop_listening_if_idle() {
                    let stopped = match listener.as_mut() {
                        Some(l) => tokio::time::timeout(connect_timeout, l.unlisten(&channel))
                            .await
                            .is_ok_and(|r| r.is_ok()),
                        None => false,
                    };
                    listening = false;
                    if !stopped {
                        // Unsure what the connection listens to: start over.
                        listener = None;
                    }
                }
            }
            // The connection dropped and sqlx reconnected and re-listened
            // before returning: notifications in between are lost.
            Event::Received(Ok(None)) => shared.wake_all(),
            Event::Received(Err(error)) => {
                tracing::debug!(%channel, %error, "LISTEN connection lost");
                listener = None;
                listening = false;
                shared.set_listening(false);
                shared.wake_all();
            }
        }
    }
}

/// Makes `LISTEN channel` effective on `listener`, connecting it if needed.
/// An idle connection may have died unnoticed: it gets one fresh retry.
async fn start_listening(
    listener: &mut Option<PgListener>,
    options: &PgConnectOptions,
    channel: &str,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    if let Some(existing) = listener.as_mut() {
        if existing.listen(channel).await.is_ok() {
            return Ok(());
        }
        *listener = None;
    }
    listener
        .insert(connect(options, timeout).await?)
        .listen(channel)
        .await
}

async fn connect(options: &PgConnectOptions, timeout: Duration) -> Result<PgListener, sqlx::Error> {
    // A pool of one just for reconnection, outside the statement pool: the
    // listener never takes a slot waiters' statements need.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        // Bounds sqlx's own reconnect inside `try_recv`.
        .acquire_timeout(timeout)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    Ok(listener)
}
