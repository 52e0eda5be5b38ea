//! The fence floor: restores must not move fences backwards.
//!
//! A fence is a node's `czxid`, the zxid of the transaction that created it.
//! Restoring a server from an older copy of its data directory takes the
//! zxids back with it: nodes created after the restore get `czxid`s that
//! grants before it already had. So a fence is `czxid + offset`, where the
//! offset lives in one node, `<root>/%floor` (decimal text; none means 0),
//! and every queue node carries the offset in force when it was created
//! (its data, see [`NodeData`](crate::keys::names::NodeData)).
//!
//! **Raising the floor to `F`** (after a restore, before clients come back)
//! writes the floor node twice: once unchanged, which yields a zxid `Z`
//! that every later create exceeds, then `max(offset, F - Z)`. A node
//! created afterwards has `czxid > Z` and an offset at least that, so its
//! fence is above `F`. Offsets never decrease, and `czxid`s grow, so fences
//! keep growing per name and per slot.
//!
//! **Why a node carries the offset in force at its create.** Each session
//! reads the floor once, with a data watch, and creates nodes with that
//! offset. ZooKeeper sends the event of a change before the reply to any
//! later request of the session, so if the watch has not fired when a
//! create's reply is in, the floor did not change before that create. If it
//! fired (or the connection broke, after which this does not rely on
//! watches), the floor is read again: a value still equal to the one used
//! was in force at the create too, since offsets only grow; otherwise the
//! node is deleted and created again. Nothing is read on the common path.
//!
//! **Sessions from before the floor.** Restoring a server brings back the
//! sessions of its backup with their nodes (a lock released since, a place
//! in line), and their clients, if still running, may resume them once the
//! server's zxids pass what they saw. The procedure raises the floor while
//! clients are away, so a session whose floor changed across a break of
//! its connection is one of those: it is retired ([`Session::floor_offset`](crate::connection::session::Session::floor_offset))
//! and closed, which deletes those nodes. After every break the floor is
//! read again before the session grants, renews or queues anything. A raise
//! seen while connected (its watch fired) retires nothing: no restore came
//! in between.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Waker};

use lockcore::{FencingToken, LockError};
use zookeeper_client as zk;

use crate::error::{BACKEND, map};
use crate::keys::paths;

type Fired = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// What one session knows of the floor.
pub(crate) struct Floor {
    path: String,
    state: Mutex<State>,
}

struct State {
    known: Option<Known>,
    /// The session's connection state, to notice a reconnection.
    link: zk::StateWatcher,
    /// How many times the connection state changed so far.
    breaks: u64,
    /// The offset last read, and `breaks` when that read was sent.
    seen: Option<(u64, u64)>,
    /// A read after a break found the offset changed since the one before
    /// it: the floor was raised while the session was away (see
    /// [`raised_while_away`](Floor::raised_while_away)). Never reset.
    away: bool,
}

/// The offset as read, and the watch set by that read.
struct Known {
    offset: u64,
    fired: Fired,
}

impl Floor {
    pub(crate) fn new(client: &zk::Client, root: &str) -> Floor {
        Floor {
            path: paths::floor(root),
            state: Mutex::new(State {
                known: None,
                link: client.state_watcher(),
                breaks: 0,
                seen: None,
                away: false,
            }),
        }
    }

    /// The state, after forgetting the offset if its watch fired or the
    /// connection state changed.
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let reconnected = ready(pin!(state.link.changed()));
        let fired = (state.known.as_mut()).is_some_and(|k| ready(k.fired.as_mut()));
        if reconnected {
            state.breaks += 1;
        }
        if reconnected || fired {
            state.known = None;
        }
        state
    }

    /// Whether the offset changed across a break of the session's
    /// connection: the floor was raised while the session was away, as the
    /// restore procedure does, so the session may have been resumed from a
    /// restored server along with nodes (and a queue state) from before the
    /// floor. Such a session is retired.
    pub(crate) fn raised_while_away(&self) -> bool {
        self.lock().away
    }

    /// The offset to create a node with: the one known, or read now.
    pub(crate) async fn offset(&self, client: &zk::Client) -> Result<u64, LockError> {
        if let Some(known) = &self.lock().known {
            return Ok(known.offset);
        }
        self.read(client).await
    }

    /// Whether `offset` was in force when a node created with it was
    /// created (the create's reply is in).
    pub(crate) async fn confirm(
        &self,
        client: &zk::Client,
        offset: u64,
    ) -> Result<bool, LockError> {
        if self
            .lock()
            .known
            .as_ref()
            .is_some_and(|k| k.offset == offset)
        {
            return Ok(true);
        }
        Ok(self.read(client).await? == offset)
    }

    /// Reads the floor after a `sync`, with a watch.
    async fn read(&self, client: &zk::Client) -> Result<u64, LockError> {
        let breaks = self.lock().breaks;
        let path = &self.path;
        let reading = |e| map(format!("reading the fence floor {path}"), e);
        let synced = client.sync(path);
        let read = client.get_and_watch_data(path);
        match synced.await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(reading(e)),
        }
        let (offset, fired): (u64, Fired) = match read.await {
            Ok((data, _, watcher)) => (parse(path, &data)?, Box::pin(watcher.changed())),
            // Never raised: 0, until the node shows up.
            Err(zk::Error::NoNode) => match client.check_and_watch_stat(path).await {
                Ok((None, watcher)) => (0, Box::pin(watcher.changed())),
                Ok((Some(_), _)) => return Box::pin(self.read(client)).await,
                Err(e) => return Err(reading(e)),
            },
            Err(e) => return Err(reading(e)),
        };
        let mut state = self.lock();
        if let Some((seen, then)) = state.seen
            && seen != offset
            && breaks > then
        {
            state.away = true;
        }
        state.seen = Some((offset, breaks));
        // Known (and watched) only if the connection held since the read.
        if state.breaks == breaks {
            state.known = Some(Known { offset, fired });
        }
        Ok(offset)
    }
}

impl std::fmt::Debug for Floor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("Floor")
            .field("path", &self.path)
            .field("offset", &state.known.as_ref().map(|k| k.offset))
            .finish()
    }
}

/// Raises the floor of the lock root `root` so that every fence handed out
/// afterwards is above `floor` (see the module docs). Never lowers it.
pub(crate) async fn raise(
    client: &zk::Client,
    root: &str,
    acls: &[zk::Acl],
    floor: FencingToken,
) -> Result<(), LockError> {
    let path = paths::floor(root);
    let failed = |e| map(format!("raising the fence floor {path}"), e);
    for _ in 0..16 {
        let synced = client.sync(&path);
        let read = client.get_data(&path);
        match synced.await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(failed(e)),
        }
        let (data, stat) = match read.await {
            Ok(read) => read,
            Err(zk::Error::NoNode) => {
                let mode = zk::CreateMode::Persistent.with_acls(zk::Acls::new(acls));
                match client.create(&path, b"0", &mode).await {
                    Ok(_) | Err(zk::Error::NodeExists) => continue,
                    Err(e) => return Err(failed(e)),
                }
            }
            Err(e) => return Err(failed(e)),
        };
        let offset = parse(&path, &data)?;
        // Rewritten as it is: the write's zxid is below every later czxid.
        let touched = match client.set_data(&path, &data, Some(stat.version)).await {
            Ok(touched) => touched,
            Err(zk::Error::BadVersion) => continue,
            Err(e) => return Err(failed(e)),
        };
        let below = u64::try_from(touched.mzxid).unwrap_or(0);
        let raised = offset.max(floor.get().saturating_sub(below));
        if raised == offset {
            return Ok(());
        }
        let data = raised.to_string();
        match client
            .set_data(&path, data.as_bytes(), Some(touched.version))
            .await
        {
            Ok(_) => {
                tracing::info!(%path, floor = %floor, offset = raised, "fence floor raised");
                return Ok(());
            }
            Err(zk::Error::BadVersion) => continue,
            Err(e) => return Err(failed(e)),
        }
    }
    Err(LockError::unavailable(
        BACKEND,
        format!("the fence floor {path} kept changing while being raised"),
    ))
}

fn parse(path: &str, data: &[u8]) -> Result<u64, LockError> {
    if data.is_empty() {
        return Ok(0);
    }
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            LockError::store(
                BACKEND,
                format!(
                    "the fence floor {path} holds {:?}, not a number",
                    String::from_utf8_lossy(data)
                ),
            )
        })
}

/// The retryable error of a request on a session retired because the
/// floor was raised while it was disconnected: a new session takes over.
pub(crate) fn floor_raised(parent: &str) -> LockError {
    LockError::unavailable(
        BACKEND,
        format!(
            "the fence floor was raised while this session was disconnected (queueing under {parent}); \
             the session is retired and a new one takes over"
        ),
    )
}

/// Polls `future` once: whether it has completed (its event has arrived).
fn ready<F: Future + ?Sized>(future: Pin<&mut F>) -> bool {
    future
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
}
