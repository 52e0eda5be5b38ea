//! The listener task: one connection per backend instance, shared by its
//! waiters and holders (see `wait/notify.rs` for what it is for), driven by
//! their requests and the notifications it receives.

use std::sync::Arc;
use std::time::Duration;

use lockcore::Backoff;
use lockcore::backend::CancellationToken;
use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPool, PgPoolOptions};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::connection::Pool;
use crate::keys;
use crate::wait::registry::Shared;

/// How long the eviction LISTEN outlives the last grant this instance held.
const LINGER: Duration = Duration::from_secs(60);

/// Reconnecting and re-checking after a failure back off, jittered.
fn retry() -> Backoff {
    Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
}

/// What the listener task needs.
pub(crate) struct Config {
    pub(crate) options: PgConnectOptions,
    pub(crate) channel: String,
    pub(crate) evict_channel: String,
    /// The lock table, whose name the watch keys hash.
    pub(crate) table: String,
    pub(crate) connect_timeout: Duration,
    /// Checks grants against the table (see `Sql::gone`).
    pub(crate) pool: Pool,
    pub(crate) gone: String,
}

/// Requests to the listener task.
pub(crate) enum Request {
    /// Make `LISTEN` on the wake-up channel and the topic's watch key
    /// effective, then answer whether they are.
    Watch(String, oneshot::Sender<bool>),
    /// The topic's last waiter left: let go of its watch key.
    Unwatch(String),
    /// Holders came or went: listen for evictions while there are any, and
    /// check grants no `LISTEN` covers.
    Holders,
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
    /// The pool of one `conn` came from, closed with it at the end.
    pool: Option<PgPool>,
    /// `LISTEN` on the wake-up channel is in effect.
    waking: bool,
    /// The eviction `LISTEN` in effect, if any (see `State::evictions`).
    evicting: Option<u64>,
    epochs: u64,
    /// Reconnect no sooner than this after a failure, backing off.
    retry_at: Instant,
    /// Failures in a row, for the backoff.
    failures: u32,
    /// Since when this instance holds nothing (the eviction LISTEN lingers).
    idle_since: Option<Instant>,
    /// Check uncovered grants no sooner than this after a failed check.
    check_at: Instant,
    /// `State::checks_wanted` as of the last successful check.
    checked: u64,
}

/// The listener task: `LISTEN` on request, dispatch notifications,
/// `UNLISTEN` when idle, reconnect (with backoff after a failure), until
/// the backend is closed or dropped; then it closes its connection.
pub(crate) async fn listen(
    shared: Arc<Shared>,
    config: Arc<Config>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    stop: CancellationToken,
) {
    let mut l = Listener {
        config,
        shared,
        conn: None,
        pool: None,
        waking: false,
        evicting: None,
        epochs: 0,
        retry_at: Instant::now(),
        failures: 0,
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
            Event::Stop => return l.close().await,
            Event::Request(Request::Watch(topic, answer)) => {
                let watching = l.watch(&topic).await;
                let _ = answer.send(watching);
            }
            Event::Request(Request::Unwatch(topic)) => l.unwatch(&topic).await,
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
            // The connection dropped (sqlx does not reconnect it: a fresh
            // connection and pool come with the next LISTEN).
            Event::Received(Ok(None)) => {
                tracing::debug!(channel = %l.config.channel, "LISTEN connection closed");
                l.lost();
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
    /// Makes `LISTEN` and the watch key of `topic` effective (if it still
    /// has waiters): a release of `topic` then notifies. Whether both are.
    async fn watch(&mut self, topic: &str) -> bool {
        if !self.waking && Instant::now() >= self.retry_at {
            let channel = self.config.channel.clone();
            if self.start(&channel).await {
                self.waking = true;
                self.shared.set_listening(true);
            }
        }
        if !self.waking {
            return false;
        }
        if self.shared.wants_watch(topic) {
            let key = keys::watch_key(&self.config.table, topic);
            if !self
                .run_on_listener("SELECT pg_advisory_lock_shared($1)", key)
                .await
            {
                return false;
            }
            self.shared.set_watched(topic);
        }
        true
    }

    /// Lets go of the watch key of `topic` if nobody waits for it.
    async fn unwatch(&mut self, topic: &str) {
        if self.shared.unwatch_if_idle(topic) {
            let key = keys::watch_key(&self.config.table, topic);
            self.run_on_listener("SELECT pg_advisory_unlock_shared($1)", key)
                .await;
        }
    }

    /// Runs a statement with an advisory key on the listener connection;
    /// on failure starts over (the connection's state is unknown).
    async fn run_on_listener(&mut self, statement: &str, key: i64) -> bool {
        let Some(conn) = self.conn.as_mut() else {
            return false;
        };
        let ran = tokio::time::timeout(
            self.config.connect_timeout,
            sqlx::query(statement).bind(key).execute(&mut *conn),
        )
        .await;
        if let Ok(Ok(_)) = ran {
            return true;
        }
        tracing::debug!(%statement, "statement on the LISTEN connection failed; starting over");
        self.lost();
        false
    }

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
        let gone = async {
            let mut op = self
                .config
                .pool
                .checkout("eviction check", self.config.connect_timeout)
                .await?;
            op.run(|c| {
                sqlx::query_scalar::<_, Uuid>(&self.config.gone)
                    .bind(names)
                    .bind(owners)
                    .bind(fences)
                    .fetch_all(c)
            })
            .await
        };
        match gone.await {
            Ok(gone) => {
                self.shared.checked(epoch, &grants, &gone);
                self.checked = wanted;
                self.failures = 0;
            }
            Err(error) => {
                tracing::debug!(%error, "checking held grants failed; retrying");
                self.check_at = Instant::now() + retry().delay(self.failures);
                self.failures = self.failures.saturating_add(1);
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
            let (conn, pool) = connect(&self.config.options, timeout).await?;
            self.pool = Some(pool);
            self.conn.insert(conn).listen(channel).await
        })
        .await;
        match started {
            Ok(Ok(())) => {
                self.failures = 0;
                true
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {timeout:?}"),
                };
                tracing::debug!(%channel, %error, "LISTEN failed; waiters poll and holders learn of evictions at renewal meanwhile");
                self.lost();
                self.retry_at = Instant::now() + retry().delay(self.failures);
                self.failures = self.failures.saturating_add(1);
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

    /// Closes the connection (its session's `LISTEN`s and watch keys end
    /// with it), within the connect timeout.
    async fn close(&mut self) {
        // Dropping the listener hands its connection back to its pool,
        // which closing waits for.
        self.conn = None;
        if let Some(pool) = self.pool.take() {
            let _ = tokio::time::timeout(self.config.connect_timeout, pool.close()).await;
        }
    }

    /// The connection is gone, and every LISTEN and watch key with it:
    /// waiters re-check (they may have missed a release).
    fn lost(&mut self) {
        self.conn = None;
        self.pool = None;
        self.waking = false;
        self.evicting = None;
        self.shared.lost();
    }
}

async fn connect(
    options: &PgConnectOptions,
    timeout: Duration,
) -> Result<(PgListener, PgPool), sqlx::Error> {
    // A pool of one just for reconnection, outside the statement pool: the
    // listener never takes a slot waiters' statements need.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        // Bounds connecting.
        .acquire_timeout(timeout)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    // A lost connection is this task's to replace (on a fresh pool), and
    // with it every LISTEN and watch key: never behind its back.
    listener.eager_reconnect(false);
    Ok((listener, pool))
}
