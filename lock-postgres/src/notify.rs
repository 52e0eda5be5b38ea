//! Wake-ups through LISTEN/NOTIFY: one listener connection per backend
//! instance, shared by all its waiters.
//!
//! Releases and forced releases `pg_notify(channel, name)` in the statement
//! that frees the row, so the notification is sent exactly when the change
//! commits. The listener task wakes one local waiter of that name (a release
//! frees the lock for one acquirer; waking all would be a herd). Expiries
//! do not notify: waiters also re-check at the holder's expiry and at least
//! every `WaitPolicy::recheck`, which `acquire_loop` arranges. When the
//! listener connection drops, every waiter is woken to re-check, because
//! notifications sent meanwhile are lost.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use lockcore::{CancellationToken, LockName, Wakeup};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{Notify, watch};

/// The listener's connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// First connection in progress.
    Connecting,
    /// LISTEN is active: every NOTIFY committed from now on reaches us.
    Listening,
    /// No connection; waiters fall back to polling until it is back.
    Down,
}

/// The waiters of one backend instance, and its listener task.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
    options: PgConnectOptions,
    channel: String,
    connect_timeout: Duration,
    started: OnceLock<()>,
    stop: CancellationToken,
}

struct Shared {
    waiters: Mutex<HashMap<String, Waiters>>,
    state: watch::Sender<State>,
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
                waiters: Mutex::new(HashMap::new()),
                state: watch::channel(State::Connecting).0,
            }),
            options,
            channel,
            connect_timeout,
            started: OnceLock::new(),
            stop: CancellationToken::new(),
        }
    }

    /// A wake-up for the next release of `name`, registered before it is
    /// returned; `None` while the listener is not connected (the caller then
    /// polls with backoff).
    pub(crate) async fn watch(&self, name: &LockName) -> Option<Wakeup> {
        self.start();
        let mut state = self.shared.state.subscribe();
        if *state.borrow() == State::Connecting {
            let _ = tokio::time::timeout(
                self.connect_timeout,
                state.wait_for(|s| *s != State::Connecting),
            )
            .await;
        }
        let registration = Registration::new(&self.shared, name.as_str());
        let mut notified = Box::pin(registration.notify.clone().notified_owned());
        notified.as_mut().enable();
        // Checked after registering: if the listener drops from here on, its
        // wake-all reaches this waiter.
        if *self.shared.state.borrow() != State::Listening {
            return None;
        }
        Some(Box::pin(async move {
            notified.await;
            drop(registration);
        }))
    }

    /// Starts the listener task once, on first use: backends that never
    /// wait never open the extra connection.
    fn start(&self) {
        self.started.get_or_init(|| {
            tokio::spawn(listen(
                self.shared.clone(),
                self.options.clone(),
                self.channel.clone(),
                self.connect_timeout,
                self.stop.clone(),
            ));
        });
    }

    /// Waiters currently registered, over all names (for tests and Debug).
    pub(crate) fn waiting(&self) -> usize {
        self.shared.lock().values().map(|w| w.count).sum()
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeups")
            .field("channel", &self.channel)
            .field("state", &*self.shared.state.borrow())
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Waiters>> {
        // Updates are single map operations; a panic cannot leave it torn.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self, name: &str) {
        if let Some(waiters) = self.lock().get(name) {
            waiters.notify.notify_one();
        }
    }

    fn wake_all(&self) {
        for waiters in self.lock().values() {
            waiters.notify.notify_waiters();
        }
    }

    fn set(&self, state: State) {
        self.state.send_replace(state);
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
    fn new(shared: &Arc<Shared>, name: &str) -> Self {
        let notify = {
            let mut map = shared.lock();
            let entry = map.entry(name.to_owned()).or_insert_with(|| Waiters {
                notify: Arc::new(Notify::new()),
                count: 0,
            });
            entry.count += 1;
            entry.notify.clone()
        };
        Registration {
            shared: shared.clone(),
            name: name.to_owned(),
            notify,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.shared.lock();
        if let Some(entry) = map.get_mut(&self.name) {
            entry.count -= 1;
            if entry.count == 0 {
                map.remove(&self.name);
            }
        }
    }
}

/// The listener task: connect, LISTEN, dispatch, reconnect with backoff,
/// until the backend is dropped.
async fn listen(
    shared: Arc<Shared>,
    options: PgConnectOptions,
    channel: String,
    connect_timeout: Duration,
    stop: CancellationToken,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(50);
    const MAX_BACKOFF: Duration = Duration::from_secs(2);
    let mut backoff = MIN_BACKOFF;
    loop {
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            connected = tokio::time::timeout(connect_timeout, connect(&options, &channel, connect_timeout)) => connected,
        };
        let mut listener = match connected {
            Ok(Ok(listener)) => listener,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {connect_timeout:?}"),
                };
                tracing::debug!(%channel, %error, "LISTEN connection failed; waiters poll meanwhile");
                shared.set(State::Down);
                shared.wake_all();
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = MIN_BACKOFF;
        shared.set(State::Listening);
        // Anything released while we were not listening was not heard.
        shared.wake_all();
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                received = listener.try_recv() => received,
            };
            match received {
                Ok(Some(notification)) => shared.wake(notification.payload()),
                // The connection dropped and sqlx reconnected and re-listened
                // before returning: notifications in between are lost.
                Ok(None) => shared.wake_all(),
                Err(error) => {
                    tracing::debug!(%channel, %error, "LISTEN connection lost");
                    shared.set(State::Down);
                    shared.wake_all();
                    break;
                }
            }
        }
    }
}

async fn connect(
    options: &PgConnectOptions,
    channel: &str,
    timeout: Duration,
) -> Result<PgListener, sqlx::Error> {
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
    listener.listen(channel).await?;
    Ok(listener)
}
