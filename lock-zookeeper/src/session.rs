//! One ZooKeeper session: the client, the negotiated timeout (every lease's
//! TTL) and a signal that fires when the session ends for good.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::CancellationToken;
use lockcore::{Backoff, Lease, LockError};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZooKeeperConfig;
use crate::floor::Floor;
use crate::line::Lines;
use crate::quiet::QuietQueues;

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
    pub(crate) client: zk::Client,
    /// The timeout the server granted, after clamping the one asked for.
    pub(crate) timeout: Duration,
    /// Margin and slack for that timeout.
    pub(crate) timing: Timing,
    /// Cancelled once the session is expired, closed or refused: every
    /// ephemeral node it owned is gone (or going) on the server.
    pub(crate) ended: CancellationToken,
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
        let client = crate::connect::open(config).await?;
        let ended = CancellationToken::new();
        let mut states = client.state_watcher();
        let signal = ended.clone();
        tokio::spawn(async move {
            let mut state = states.state();
            while !state.is_terminated() {
                state = states.changed().await;
            }
            tracing::debug!(%state, "zookeeper session ended");
            signal.cancel();
        });
        tracing::debug!(
            session = %client.session_id(),
            timeout = ?client.session_timeout(),
            asked = ?config.session_timeout,
            "zookeeper session established"
        );
        let timeout = client.session_timeout();
        let timing = Timing::new(timeout, config);
        timing.check()?;
        let session = Arc::new(Session {
            timing,
            quiet: QuietQueues::new(&client, timeout),
            lines: Lines::default(),
            floor: Floor::new(&client, &config.root),
            timeout,
            client,
            ended,
        });
        // Known from the start (and watched): a create never waits for it.
        session.floor.offset(&session.client).await?;
        Ok(session)
    }

    /// The session id, what `Stat::ephemeral_owner` holds for its nodes.
    pub(crate) fn id(&self) -> i64 {
        self.client.session_id().0
    }

    /// Whether the session ended (its ephemerals are gone or going).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled() || self.client.state().is_terminated()
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.client.session_id())
            .field("timeout", &self.timeout)
            .field("state", &self.client.state())
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
    let info = old.client.session().clone();
    for attempt in 0_u32.. {
        if attempt > 0 {
            tokio::time::sleep(backoff.delay(attempt)).await;
            if fresh.is_ended() || Instant::now() >= gone_by {
                return;
            }
            if fresh.client.sync(&config.root).await.is_err() {
                continue;
            }
        }
        let sent = Instant::now();
        match crate::connect::close(&config, info.clone(), timeout / 4).await {
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
