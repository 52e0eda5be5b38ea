//! One ZooKeeper session: its client handle, the negotiated timeout (every
//! lease's TTL), the fence floor it lives under, the signals that fire when
//! it ends for good, and shutting it.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::backend::CancellationToken;
use lockcore::{Backoff, Lease, LockError};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use zookeeper_client as zk;

use crate::config::ZooKeeperConfig;
use crate::error::{BACKEND, map};
use crate::fence::floor::Floor;
use crate::locks::quiet::QuietQueues;
use crate::wait::line::Lines;

/// How early and how late the servers may end a session, against its
/// client's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// The negotiated session timeout `T`: every lease's TTL.
    pub(crate) timeout: Duration,
    /// The servers' tick.
    pub(crate) tick: Duration,
    /// Taken off every lease's deadline on top of lockcore's drift margin.
    pub(crate) margin: Duration,
    /// How long a lock may outlive its TTL (`capabilities().expiry_slack`).
    pub(crate) slack: Duration,
}

impl Timing {
    /// The timing of a session of `timeout` under `config`.
    ///
    /// **Margin.** A server expires a session `T` after the last touch it
    /// knows of, rounded up to a tick. On an ensemble, a follower records
    /// the touches of its clients and hands them to the leader in its reply
    /// to the leader's ping, every half tick; the leader does the expiring.
    /// A lease counts from the send time of a request that went through the
    /// leader (a write or a `sync`), which proves the follower was in touch
    /// with the leader after that time; but if the follower is cut off right
    /// after, the touch of that very request never reaches the leader. The
    /// touches the leader surely got were reported at most half a tick
    /// earlier, and the client's packet before that was at most one idle
    /// gap `I` earlier still. So the leader may expire the session
    /// `I + tick/2` before `sent + T`:
    ///
    /// `margin = I + tick/2 + 5 ms` (5 ms for scheduling).
    ///
    /// `I` is how long `zookeeper-client` 0.11.2 stays silent on a healthy
    /// connection: it checks every `T/20` (`c/8` with a connection timeout
    /// `c ≤ 3T/5`) and pings once it sent nothing for three such steps (at
    /// most 10 s): `I = T/5` (`c/2`).
    ///
    /// **Slack.** A session outlives its client's last packet by up to
    /// `T + 1.5 ticks` (half a tick before a follower reports the touch, a
    /// tick of rounding). A client that hears nothing back (a one-way
    /// partition) keeps sending for `7T/5` after its last reply before it
    /// gives the session up, so a lock can outlive its TTL by
    ///
    /// `slack = 7T/5 + 1.5 × tick`.
    pub(crate) fn new(timeout: Duration, config: &ZooKeeperConfig) -> Timing {
        let tick = config.tick_for(timeout);
        let step = match config.connection_timeout {
            Some(c) if c <= timeout * 3 / 5 => c / 8,
            _ => timeout / 20,
        }
        .max(Duration::from_millis(1));
        let idle_gap = (step * 3).min(Duration::from_secs(10)) + step;
        Timing {
            timeout,
            tick,
            margin: idle_gap + tick / 2 + Duration::from_millis(5),
            slack: timeout * 7 / 5 + tick * 3 / 2,
        }
    }

    /// Refuses a session whose margin leaves less than half of it to a
    /// lease: renewals (every third of the TTL by default) would barely
    /// keep up.
    fn check(&self) -> Result<(), LockError> {
        let taken = self.margin + Lease::drift(self.timeout);
        if taken * 2 >= self.timeout {
            return Err(LockError::config(format!(
                "a ZooKeeper session of {:?} is too short: the margin taken off every lease \
                 (client ping gap + half a tick + drift: {taken:?}) leaves less than half of it; \
                 ask for a longer session_timeout, or set tick_time to the servers' tickTime",
                self.timeout
            )));
        }
        Ok(())
    }
}

/// A live (or ended) session. Every lock node this client creates is an
/// ephemeral of one session, and lives no longer than it.
pub(crate) struct Session {
    /// The session's one long-lived client handle: requests take a clone
    /// for their duration ([`client`](Self::client)), and nothing keeps one
    /// longer. Taken out when the session is shut: once the last handle is
    /// dropped, the client sends `closeSession` on its own connection.
    handle: Mutex<Option<zk::Client>>,
    /// Its id and password, to close it from another connection.
    info: zk::SessionInfo,
    states: zk::StateWatcher,
    /// The timeout the server granted, after clamping the one asked for.
    pub(crate) timeout: Duration,
    /// Margin and slack for that timeout.
    pub(crate) timing: Timing,
    /// Cancelled once the session is expired, closed, refused or retired:
    /// every ephemeral node it owned is gone (or going) on the server.
    pub(crate) ended: CancellationToken,
    /// Fires the loss signal of every lease granted on this session (each
    /// a child): when it ends, or when its client is closed.
    pub(crate) losing: CancellationToken,
    /// Told when the connection is back after a break.
    pub(crate) reconnected: Arc<Notify>,
    /// Its background tasks (its state, the keeper and its node watches,
    /// the queue views), which end with it.
    pub(crate) tasks: TaskTracker,
    /// The queues this session may take without listing them.
    pub(crate) quiet: QuietQueues,
    /// The views of the queues this session's waiters are in.
    pub(crate) lines: Lines,
    /// The fence floor, as this session knows it.
    pub(crate) floor: Floor,
}

impl Session {
    /// Opens a session and starts watching its state.
    pub(crate) async fn open(config: &ZooKeeperConfig) -> Result<Arc<Session>, LockError> {
        let client = crate::connection::open::open(config).await?;
        let states = client.state_watcher();
        tracing::debug!(
            session = %client.session_id(),
            timeout = ?client.session_timeout(),
            asked = ?config.session_timeout,
            "zookeeper session established"
        );
        let timeout = client.session_timeout();
        let timing = Timing::new(timeout, config);
        timing.check()?;
        let floor = Floor::new(&client, &config.root);
        // Known from the start (and watched): a create never waits for it.
        floor.offset(&client).await?;
        let (ended, reconnected, tasks) =
            (CancellationToken::new(), Arc::default(), TaskTracker::new());
        tasks.spawn(follow(
            states.clone(),
            ended.clone(),
            Arc::clone(&reconnected),
        ));
        Ok(Arc::new(Session {
            timing,
            quiet: QuietQueues::new(&client, timeout),
            lines: Lines::default(),
            floor,
            timeout,
            info: client.session().clone(),
            handle: Mutex::new(Some(client)),
            states,
            losing: ended.child_token(),
            ended,
            reconnected,
            tasks,
        }))
    }

    /// A handle for requests; `ClientClosed` once the session is shut.
    pub(crate) fn client(&self) -> Result<zk::Client, zk::Error> {
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        handle.clone().ok_or(zk::Error::ClientClosed)
    }

    /// The session id, what `Stat::ephemeral_owner` holds for its nodes.
    pub(crate) fn id(&self) -> i64 {
        self.info.id().0
    }

    /// The session's id and password.
    pub(crate) fn info(&self) -> &zk::SessionInfo {
        &self.info
    }

    /// A watcher of the session's state from now on.
    pub(crate) fn state_watcher(&self) -> zk::StateWatcher {
        let mut states = self.states.clone();
        states.state();
        states
    }

    /// The client's latest view of the session.
    pub(crate) fn state(&self) -> zk::SessionState {
        self.states.peek_state()
    }

    /// Whether the session ended (its ephemerals are gone or going).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled() || self.state().is_terminated()
    }

    /// The fence floor's offset to create nodes with (known, or read after
    /// a raise or a reconnection), unless the session is from before the
    /// floor: its connection broke while the floor was raised, as when it
    /// is resumed from a restored server (see [`crate::fence::floor`]). Such a
    /// session is retired (`None`): its leases are lost, its waiters queue
    /// again on a new session, and the client closes it, with every node it
    /// had (those the restore brought back included).
    pub(crate) async fn floor_offset(&self) -> Result<Option<u64>, LockError> {
        let client = (self.client()).map_err(|e| map("reading the fence floor", e))?;
        let offset = self.floor.offset(&client).await?;
        Ok(self.not_from_before_the_floor().then_some(offset))
    }

    /// [`floor_offset`](Self::floor_offset) for a session about to grant
    /// or renew: whether it may (it is not from before the floor).
    pub(crate) async fn floor_holds(&self) -> Result<bool, LockError> {
        Ok(self.floor_offset().await?.is_some())
    }

    /// `false`, and the session retired, once the floor was raised while
    /// the session's connection was broken.
    pub(crate) fn not_from_before_the_floor(&self) -> bool {
        if self.floor.raised_while_away() {
            self.retire("the fence floor was raised while it was disconnected (a restore)");
            return false;
        }
        true
    }

    /// Ends the session on this side, saying why: its leases are lost, and
    /// the client opens another and closes this one (see [`shut`](Self::shut)).
    pub(crate) fn retire(&self, why: &str) {
        if !self.ended.is_cancelled() {
            tracing::info!(session = %self.info.id(), "retiring the zookeeper session: {why}");
            self.ended.cancel();
        }
    }

    /// Ends the session on this side and drops its handle: the client
    /// closes it once no request holds another (see [`shut`](Self::shut)).
    pub(crate) fn let_go(&self) {
        self.ended.cancel();
        drop(self.handle.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// Ends the session for good and returns once it is closed on the
    /// servers (its ephemeral nodes deleted) and its tasks ended, or after
    /// `within`. Its client sends `closeSession` on its own connection once
    /// the last handle is dropped: this one, and those of requests in flight
    /// (or kept by a caller of
    /// [`ZooKeeperBackend::client`](crate::ZooKeeperBackend::client)).
    /// (Closing it from another connection would not do: the servers hand
    /// the session to the newest connection, and this client, still
    /// running, takes it back at once.) A session that already ended is left
    /// to the servers (see [`reap`]).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the session was not closed in time
    /// (no server answers, or a handle is still kept): its nodes go when the
    /// servers expire it.
    pub(crate) async fn shut(&self, within: Duration) -> Result<(), LockError> {
        let deadline = Instant::now() + within;
        self.let_go();
        let mut states = self.state_watcher();
        if !ends_by(&mut states, deadline).await {
            return Err(LockError::unavailable(
                BACKEND,
                format!(
                    "closing ZooKeeper session {}: not closed within {within:?} (no server answers, \
                     or a handle from client() is still kept); its nodes go when the servers expire it",
                    self.info.id()
                ),
            ));
        }
        self.tasks.close();
        if tokio::time::timeout_at(deadline, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::debug!(session = %self.info.id(), "tasks of a closed session still running at the close limit");
        }
        Ok(())
    }
}

/// Whether the session `states` reports ends (is expired, closed or
/// refused) by `deadline`.
async fn ends_by(states: &mut zk::StateWatcher, deadline: Instant) -> bool {
    loop {
        if states.state().is_terminated() {
            return true;
        }
        if tokio::time::timeout_at(deadline, states.changed())
            .await
            .is_err()
        {
            return false;
        }
    }
}

/// Follows a session's state: tells `reconnected` when the connection is
/// back after a break, and cancels `ended` once the session is over.
async fn follow(mut states: zk::StateWatcher, ended: CancellationToken, reconnected: Arc<Notify>) {
    let mut state = states.state();
    let mut broken = false;
    while !state.is_terminated() {
        state = tokio::select! {
            state = states.changed() => state,
            // Retired or shut: nothing left to tell.
            _ = ended.cancelled() => return,
        };
        match state {
            zk::SessionState::Disconnected => broken = true,
            zk::SessionState::SyncConnected if broken => {
                broken = false;
                reconnected.notify_one();
            }
            _ => {}
        }
    }
    tracing::debug!(%state, "zookeeper session ended");
    ended.cancel();
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.info.id())
            .field("timeout", &self.timeout)
            .field("state", &self.state())
            .finish()
    }
}

/// Closes `old`, a session that ended on this side, on the servers if they
/// still keep it. `zookeeper-client` gives a session up 7/5 of its timeout
/// after the last reply it got; when its requests still reached a server
/// (a one-way partition), that server keeps the session, and its lock
/// nodes block their names, for up to one more timeout. Reconnecting to
/// the session and closing it deletes them at once.
///
/// A reconnection keeps a session alive for one more timeout if its reply
/// is lost, so attempts are made only right after the network answered
/// `fresh` (its connect, then a `sync`), and stop once the servers have
/// surely expired the session by themselves.
pub(crate) async fn reap(config: ZooKeeperConfig, old: Arc<Session>, fresh: Arc<Session>) {
    let Timing { timeout, tick, .. } = old.timing;
    let surely_gone = |last_touch: Instant| last_touch + timeout + tick * 2;
    let mut gone_by = surely_gone(Instant::now());
    let backoff = Backoff::new(timeout / 20, timeout / 4);
    let info = old.info().clone();
    for attempt in 0_u32.. {
        if attempt > 0 {
            tokio::time::sleep(backoff.delay(attempt)).await;
            if fresh.is_ended() || Instant::now() >= gone_by {
                return;
            }
            let Ok(client) = fresh.client() else {
                return;
            };
            if client.sync(&config.root).await.is_err() {
                continue;
            }
        }
        let sent = Instant::now();
        match crate::connection::open::close(&config, info.clone(), timeout / 4).await {
            Ok(()) => {
                tracing::debug!(session = %info.id(), "closed a session this client had given up");
                return;
            }
            Err(e) => {
                tracing::debug!(session = %info.id(), error = %e, "could not close a session given up; again");
                gone_by = gone_by.max(surely_gone(sent));
            }
        }
    }
}
