//! Wake-ups through LISTEN/NOTIFY: one listener connection per backend
//! instance, shared by all its waiters, and listening only while they wait.
//!
//! Releases and forced releases `pg_notify(channel, name)` in the statement
//! that frees the row, so the notification is sent exactly when the change
//! commits. The listener task wakes one local waiter of that name (a release
//! frees the lock for one acquirer; waking all would be a herd). Expiries
//! do not notify: waiters also re-check at the holder's expiry and at least
//! every `WaitPolicy::recheck`, which the wait loop arranges.
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

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use lockcore::LockName;
use lockcore::backend::{CancellationToken, Wakeup};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPoolOptions};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

/// How long the eviction LISTEN outlives the last grant this instance held.
const LINGER: Duration = Duration::from_secs(60);

/// The waiters and holders of one backend instance, and its listener task.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
    config: Arc<Config>,
    requests: OnceLock<mpsc::UnboundedSender<Request>>,
    stop: CancellationToken,
}

/// What the listener task needs.
struct Config {
    options: PgConnectOptions,
    channel: String,
    evict_channel: String,
    connect_timeout: Duration,
    /// Checks grants against the table (see `Sql::gone`).
    pool: PgPool,
    gone: String,
}

struct Shared {
    state: Mutex<State>,
}

/// Waiters, holders and what `LISTEN`s are in effect, under one lock: a
/// waiter or holder that registers sees the state as the task left it.
struct State {
    waiters: HashMap<String, Waiters>,
    listening: bool,
    holders: HashMap<Uuid, Grant>,
    /// The eviction `LISTEN` in effect, numbered anew each time it starts
    /// (notifications before it are lost).
    evictions: Option<u64>,
    /// Bumped whenever a held grant may not be covered by that `LISTEN`.
    checks_wanted: u64,
}

struct Waiters {
    notify: Arc<Notify>,
    count: usize,
}

/// A grant this instance holds, or an acquire that may get one.
struct Grant {
    name: String,
    /// `None` while the acquire is in flight.
    fence: Option<i64>,
    /// An eviction of this owner seen while the acquire was in flight.
    evicted: Option<i64>,
    /// The eviction `LISTEN` that covers this grant: in effect before its
    /// acquire was sent, or before it was last checked against the table.
    covered_by: Option<u64>,
    lost: CancellationToken,
}

/// Requests to the listener task.
enum Request {
    /// Make `LISTEN` on the wake-up channel effective, then answer.
    Wakeups(oneshot::Sender<bool>),
    /// Holders came or went: listen for evictions while there are any, and
    /// check grants no `LISTEN` covers.
    Holders,
}

impl Wakeups {
    pub(crate) fn new(
        options: PgConnectOptions,
        channels: (String, String),
        connect_timeout: Duration,
        pool: PgPool,
        gone: String,
    ) -> Self {
        Wakeups {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    waiters: HashMap::new(),
                    listening: false,
                    holders: HashMap::new(),
                    evictions: None,
                    checks_wanted: 0,
                }),
            }),
            config: Arc::new(Config {
                options,
                channel: channels.0,
                evict_channel: channels.1,
                connect_timeout,
                pool,
                gone,
            }),
            requests: OnceLock::new(),
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
            self.task().send(Request::Wakeups(answer)).ok()?;
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

    /// Registers the grant an acquire of `name` by `owner` may get; call it
    /// before the acquire is sent, so an eviction that follows the grant at
    /// once is not missed. Never waits: the eviction `LISTEN` is started in
    /// the background if it is not in effect.
    pub(crate) fn expect(&self, name: &str, owner: Uuid) -> Pending {
        let requests = self.task().clone();
        let listening = {
            let mut state = self.shared.lock();
            let covered_by = state.evictions;
            state.holders.insert(
                owner,
                Grant {
                    name: name.to_owned(),
                    fence: None,
                    evicted: None,
                    covered_by,
                    lost: CancellationToken::new(),
                },
            );
            covered_by.is_some()
        };
        if !listening {
            let _ = requests.send(Request::Holders);
        }
        Pending(Some(Holding {
            shared: self.shared.clone(),
            requests,
            owner,
        }))
    }

    /// The listener task, started on first use: backends that never wait
    /// nor hold never open the extra connection.
    fn task(&self) -> &mpsc::UnboundedSender<Request> {
        self.requests.get_or_init(|| {
            let (requests, received) = mpsc::unbounded_channel();
            tokio::spawn(listen(
                self.shared.clone(),
                self.config.clone(),
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
        let (listening, evictions, holding) = {
            let state = self.shared.lock();
            (
                state.listening,
                state.evictions.is_some(),
                state.holders.len(),
            )
        };
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
        let (lost, covered) = {
            let mut state = holding.shared.lock();
            let evictions = state.evictions;
            let (lost, covered) = match state.holders.get_mut(&holding.owner) {
                Some(grant) => {
                    grant.fence = Some(fence);
                    if grant.evicted == Some(fence) {
                        grant.lost.cancel();
                    }
                    (
                        grant.lost.clone(),
                        evictions.is_some() && grant.covered_by == evictions,
                    )
                }
                None => (CancellationToken::new(), true),
            };
            if !covered {
                state.checks_wanted += 1;
            }
            (lost, covered)
        };
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
        let now_idle = {
            let mut state = self.shared.lock();
            state.holders.remove(&self.owner).is_some() && state.holders.is_empty()
        };
        if now_idle {
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

    fn holding(&self) -> bool {
        !self.lock().holders.is_empty()
    }

    fn set_evictions(&self, epoch: Option<u64>) {
        let mut state = self.lock();
        state.evictions = epoch;
        state.checks_wanted += 1;
    }

    fn checks_wanted(&self) -> u64 {
        self.lock().checks_wanted
    }

    /// An eviction notice `fence owner name`: cancels the matching grant's
    /// loss signal (or remembers it for an acquire still in flight).
    fn evicted(&self, payload: &str) {
        let mut parts = payload.splitn(3, ' ');
        let (Some(fence), Some(owner), Some(name)) = (
            parts.next().and_then(|f| f.parse::<i64>().ok()),
            parts.next().and_then(|o| Uuid::parse_str(o).ok()),
            parts.next(),
        ) else {
            tracing::debug!(%payload, "ignoring a malformed eviction notice");
            return;
        };
        let mut state = self.lock();
        let Some(grant) = state.holders.get_mut(&owner) else {
            return;
        };
        if grant.name != name {
            return;
        }
        match grant.fence {
            Some(held) if held == fence => grant.lost.cancel(),
            Some(_) => {}
            None => grant.evicted = Some(fence),
        }
    }

    /// Held grants the eviction `LISTEN` number `epoch` does not cover yet:
    /// `(owner, name, fence)`.
    fn uncovered(&self, epoch: u64) -> Vec<(Uuid, String, i64)> {
        self.lock()
            .holders
            .iter()
            .filter(|(_, g)| g.covered_by != Some(epoch))
            .filter_map(|(owner, g)| Some((*owner, g.name.clone(), g.fence?)))
            .collect()
    }

    /// After checking `checked` against the table with `LISTEN` number
    /// `epoch` in effect: signals those `gone`, and counts the rest covered.
    fn checked(&self, epoch: u64, checked: &[(Uuid, String, i64)], gone: &[Uuid]) {
        let mut state = self.lock();
        for (owner, _, fence) in checked {
            if let Some(grant) = state.holders.get_mut(owner)
                && grant.fence == Some(*fence)
            {
                if gone.contains(owner) {
                    grant.lost.cancel();
                }
                grant.covered_by = Some(epoch);
            }
        }
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
    Request(Request),
    Received(Result<Option<PgNotification>, sqlx::Error>),
    Timer,
}

/// The listener task's connection and what it listens to.
struct Listener {
    config: Arc<Config>,
    shared: Arc<Shared>,
    conn: Option<PgListener>,
    /// `LISTEN` on the wake-up channel is in effect.
    waking: bool,
    /// The eviction `LISTEN` in effect, if any (see `State::evictions`).
    evicting: Option<u64>,
    epochs: u64,
    /// Reconnect no sooner than this after a failure, backing off.
    retry_at: Instant,
    backoff: Duration,
    /// Since when this instance holds nothing (the eviction LISTEN lingers).
    idle_since: Option<Instant>,
    /// Check uncovered grants no sooner than this after a failed check.
    check_at: Instant,
    /// `State::checks_wanted` as of the last successful check.
    checked: u64,
}

const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The listener task: `LISTEN` on request, dispatch notifications,
/// `UNLISTEN` when idle, reconnect (with backoff after a failure), until
/// the backend is dropped.
async fn listen(
    shared: Arc<Shared>,
    config: Arc<Config>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    stop: CancellationToken,
) {
    let mut l = Listener {
        config,
        shared,
        conn: None,
        waking: false,
        evicting: None,
        epochs: 0,
        retry_at: Instant::now(),
        backoff: MIN_BACKOFF,
        idle_since: None,
        check_at: Instant::now(),
        checked: 0,
    };
    loop {
        let timer = l.next_timer();
        let receiving = l.waking || l.evicting.is_some();
        let event = tokio::select! {
            _ = stop.cancelled() => Event::Stop,
            request = requests.recv() => request.map_or(Event::Stop, Event::Request),
            received = async {
                match l.conn.as_mut() {
                    Some(conn) => conn.try_recv().await,
                    None => Err(sqlx::Error::PoolClosed),
                }
            }, if receiving => Event::Received(received),
            _ = tokio::time::sleep_until(timer.unwrap_or_else(Instant::now)), if timer.is_some() => Event::Timer,
        };
        match event {
            Event::Stop => return,
            Event::Request(Request::Wakeups(answer)) => {
                if !l.waking && Instant::now() >= l.retry_at {
                    let channel = l.config.channel.clone();
                    if l.start(&channel).await {
                        l.waking = true;
                        l.shared.set_listening(true);
                    }
                }
                let _ = answer.send(l.waking);
            }
            Event::Request(Request::Holders) | Event::Timer => {}
            Event::Received(Ok(Some(notification))) => {
                if notification.channel() == l.config.evict_channel {
                    l.shared.evicted(notification.payload());
                } else if !l.shared.wake(notification.payload())
                    && l.shared.stop_listening_if_idle()
                {
                    let channel = l.config.channel.clone();
                    l.waking = false;
                    l.stop(&channel).await;
                }
            }
            // The connection dropped and sqlx reconnected and re-listened
            // before returning: notifications in between are lost.
            Event::Received(Ok(None)) => {
                l.shared.wake_all();
                if l.evicting.is_some() {
                    l.new_epoch();
                }
            }
            Event::Received(Err(error)) => {
                tracing::debug!(channel = %l.config.channel, %error, "LISTEN connection lost");
                l.lost();
            }
        }
        l.tend_evictions().await;
    }
}

impl Listener {
    /// When the task must act on its own: reconnect for holders, check
    /// uncovered grants after a failure, or end the eviction LISTEN.
    fn next_timer(&self) -> Option<Instant> {
        let holding = self.shared.holding();
        match (holding, self.evicting) {
            (true, None) => Some(self.retry_at),
            (true, Some(_)) => {
                (self.checked != self.shared.checks_wanted()).then_some(self.check_at)
            }
            (false, Some(_)) => Some(self.idle_since.unwrap_or_else(Instant::now) + LINGER),
            (false, None) => None,
        }
    }

    /// Listens for evictions while this instance holds grants (and checks
    /// those no LISTEN covered); stops a while after it holds none.
    async fn tend_evictions(&mut self) {
        let now = Instant::now();
        if !self.shared.holding() {
            let idle_since = *self.idle_since.get_or_insert(now);
            if self.evicting.is_some() && now >= idle_since + LINGER {
                self.evicting = None;
                self.shared.set_evictions(None);
                let channel = self.config.evict_channel.clone();
                self.stop(&channel).await;
            }
            return;
        }
        self.idle_since = None;
        if self.evicting.is_none() {
            if now < self.retry_at {
                return;
            }
            let channel = self.config.evict_channel.clone();
            if !self.start(&channel).await {
                return;
            }
            self.new_epoch();
        }
        if let Some(epoch) = self.evicting
            && now >= self.check_at
            && self.checked != self.shared.checks_wanted()
        {
            self.check(epoch).await;
        }
    }

    /// A new eviction LISTEN epoch: every grant must be covered anew.
    fn new_epoch(&mut self) {
        self.epochs += 1;
        self.evicting = Some(self.epochs);
        self.shared.set_evictions(self.evicting);
        self.check_at = Instant::now();
    }

    /// Checks the held grants `epoch` does not cover against the table, in
    /// one statement, and signals those gone.
    async fn check(&mut self, epoch: u64) {
        let wanted = self.shared.checks_wanted();
        let grants = self.shared.uncovered(epoch);
        if grants.is_empty() {
            self.checked = wanted;
            return;
        }
        let names: Vec<&str> = grants.iter().map(|(_, n, _)| n.as_str()).collect();
        let owners: Vec<Uuid> = grants.iter().map(|(o, _, _)| *o).collect();
        let fences: Vec<i64> = grants.iter().map(|(_, _, f)| *f).collect();
        let query = async {
            let mut conn = self.config.pool.acquire().await?;
            let gone = sqlx::query_scalar::<_, Uuid>(&self.config.gone)
                .bind(names)
                .bind(owners)
                .bind(fences)
                .fetch_all(&mut *conn);
            match tokio::time::timeout(self.config.connect_timeout, gone).await {
                Ok(result) => result,
                Err(_) => {
                    // Its reply may still come: never pool the connection.
                    conn.close_on_drop();
                    Err(sqlx::Error::PoolTimedOut)
                }
            }
        };
        match tokio::time::timeout(self.config.connect_timeout * 2, query).await {
            Ok(Ok(gone)) => {
                self.shared.checked(epoch, &grants, &gone);
                self.checked = wanted;
                self.backoff = MIN_BACKOFF;
            }
            failed => {
                tracing::debug!(ok = failed.is_ok(), "checking held grants failed; retrying");
                self.check_at = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Makes `LISTEN channel` effective, connecting if needed; on failure
    /// forgets the connection and backs off.
    async fn start(&mut self, channel: &str) -> bool {
        let timeout = self.config.connect_timeout;
        if let Some(conn) = self.conn.as_mut() {
            if let Ok(Ok(())) = tokio::time::timeout(timeout, conn.listen(channel)).await {
                return true;
            }
            // An idle connection may have died unnoticed: start over on a
            // fresh one (which listens to nothing else).
            self.lost();
        }
        let started = tokio::time::timeout(timeout, async {
            self.conn
                .insert(connect(&self.config.options, timeout).await?)
                .listen(channel)
                .await
        })
        .await;
        match started {
            Ok(Ok(())) => {
                self.backoff = MIN_BACKOFF;
                true
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {timeout:?}"),
                };
                tracing::debug!(%channel, %error, "LISTEN failed; waiters poll and holders learn of evictions at renewal meanwhile");
                self.lost();
                self.retry_at = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                false
            }
        }
    }

    /// `UNLISTEN channel`; if unsure what the connection listens to, starts over.
    async fn stop(&mut self, channel: &str) {
        let stopped = match self.conn.as_mut() {
            Some(conn) => tokio::time::timeout(self.config.connect_timeout, conn.unlisten(channel))
                .await
                .is_ok_and(|r| r.is_ok()),
            None => true,
        };
        if !stopped {
            self.lost();
        }
    }

    /// The connection is gone, and every LISTEN with it: waiters re-check
    /// (they may have missed a release).
    fn lost(&mut self) {
        self.conn = None;
        self.waking = false;
        self.evicting = None;
        self.shared.set_listening(false);
        self.shared.set_evictions(None);
        self.shared.wake_all();
    }
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
