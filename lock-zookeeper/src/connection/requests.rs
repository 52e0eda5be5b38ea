//! Requests that survive a lost connection: reads retried, deletes that
//! tell whether they deleted, the listing of a queue, a node created again
//! in place, and clean-ups tried until done while their session lives.

use std::future::Future;
use std::time::Duration;

use lockcore::{Backoff, LockError};
use uuid::Uuid;
use zookeeper_client as zk;

use crate::connection::session::Session;
use crate::error::{connection_lost, map, transient};
use crate::keys::names::Queue;

/// How many times a request is tried again after its connection was lost.
pub(crate) const ATTEMPTS: usize = 8;

/// Deletes `path`, retrying a lost connection; `Ok(true)` if it existed
/// (or an earlier attempt whose reply was lost most likely deleted it).
pub(crate) async fn delete_node(client: &zk::Client, path: &str) -> Result<bool, zk::Error> {
    let mut ambiguous = false;
    for _ in 0..ATTEMPTS {
        match client.delete(path, None).await {
            Ok(()) => return Ok(true),
            Err(zk::Error::NoNode) => return Ok(ambiguous),
            Err(e) if connection_lost(&e) => ambiguous = true,
            Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Err(zk::Error::ConnectionLoss)
}

/// Deletes every queue node of owner `guid` under `parent` (best effort).
pub(crate) async fn sweep_owner(client: &zk::Client, parent: &str, guid: Uuid) {
    let children = match retry(|| client.list_children(parent)).await {
        Ok(children) => children,
        Err(e) => {
            tracing::debug!(%parent, owner = %guid, error = %e, "could not list the queue to sweep our strays");
            return;
        }
    };
    for node in Queue::new(&children).all_of(guid) {
        let deleted = delete_node(client, &format!("{parent}/{}", node.name)).await;
        tracing::debug!(%parent, node = %node.name, ?deleted, "swept a queue node of ours");
    }
}

/// The queue under `parent` (empty if the parent is gone); with `sync`, read
/// after the server caught up with the leader.
pub(crate) async fn list(
    client: &zk::Client,
    parent: &str,
    sync: bool,
) -> Result<Queue, LockError> {
    let mut last = zk::Error::ConnectionLoss;
    for _ in 0..ATTEMPTS {
        let synced = sync.then(|| client.sync(parent));
        let children = client.list_children(parent);
        if let Some(synced) = synced {
            match synced.await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) if connection_lost(&e) => {
                    last = e;
                    continue;
                }
                Err(e) => return Err(map(format!("syncing {parent}"), e)),
            }
        }
        match children.await {
            Ok(children) => return Ok(Queue::new(&children)),
            Err(zk::Error::NoNode) => return Ok(Queue::default()),
            Err(e) if connection_lost(&e) => last = e,
            Err(e) => return Err(map(format!("listing {parent}"), e)),
        }
    }
    Err(map(format!("listing {parent}"), last))
}

/// Runs a read again while the connection is lost (requests wait for the
/// reconnection; a session that ends fails them for good).
pub(crate) async fn retry<T, F, Fut>(op: F) -> Result<T, zk::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let mut last = zk::Error::ConnectionLoss;
    for _ in 0..ATTEMPTS {
        match op().await {
            Err(e) if connection_lost(&e) => last = e,
            other => return other,
        }
    }
    Err(last)
}

/// Runs the clean-up `op` (deleting what a lease or a place in line left)
/// until it succeeds, trying again while it fails on connection trouble and
/// `session` lives: a session outlives a network blip shorter than its
/// timeout, and so would the node left behind, blocking its name for as
/// long as this client runs. Each try is cut at the session timeout: the
/// client library waits for a reply until the connection breaks, and a
/// request the server never got (seen with a proxy that dropped it, the
/// connection kept) would wait as long as the session lives. `what` names
/// the clean-up in the log.
pub(crate) async fn until_cleaned<F, Fut>(session: &Session, what: &str, op: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), zk::Error>>,
{
    let backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    for attempt in 0.. {
        let e = match tokio::time::timeout(session.timeout, op()).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(_) => zk::Error::Timeout,
        };
        let closed = matches!(e, zk::Error::ClientClosed);
        if closed || !transient(&e) || session.is_ended() {
            tracing::debug!(error = %e, "could not {what}; its session will");
            return;
        }
        tracing::debug!(error = %e, "could not {what} yet; again");
        tokio::time::sleep(backoff.delay(attempt)).await;
    }
}

/// What a [`recreate`] transaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recreated {
    /// The node is a new one at the same path, with this `czxid`.
    As(i64),
    /// The node was gone: nothing was created.
    Gone,
}

/// The place of the create in a [`recreate`] transaction (after the write
/// and the delete).
pub(crate) const RECREATE: usize = 2;

/// Creates the node `path` again in place, in one `multi`: writes it with
/// `data`, deletes it, and creates it with `data` and `mode`. The write
/// comes first so that a watcher of the node (a one-shot `exists` or data
/// watch) hears of a change (`NodeDataChanged`), never of a deletion: a
/// deletion event stays proof that a node is gone. The write and the
/// delete fail if the node is gone, and then nothing is created.
///
/// After a lost reply, reads the node again behind a `sync` (a transaction
/// that reached the leader through the lost connection is then visible):
/// a `czxid` other than `before`, the node's until now, means it went
/// through; the same one, that it did not, and it is sent again.
///
/// # Errors
/// The transaction's own failure (`OperationFailed` names the operation:
/// [`RECREATE`] for the create), or the request's.
pub(crate) async fn recreate(
    client: &zk::Client,
    path: &str,
    data: &[u8],
    mode: &zk::CreateOptions<'_>,
    before: i64,
) -> Result<Recreated, zk::MultiWriteError> {
    let mut last = zk::Error::ConnectionLoss;
    for _ in 0..ATTEMPTS {
        let mut multi = client.new_multi_writer();
        multi.add_set_data(path, data, None)?;
        multi.add_delete(path, None)?;
        multi.add_create(path, data, mode)?;
        match multi.commit().await {
            Ok(results) => return created(client, path, &results).await.map_err(Into::into),
            Err(zk::MultiWriteError::OperationFailed {
                index: 0 | 1,
                source: zk::Error::NoNode,
            }) => return Ok(Recreated::Gone),
            Err(zk::MultiWriteError::RequestFailed { source }) if connection_lost(&source) => {
                last = source;
            }
            Err(e) => return Err(e),
        }
        match retry(|| client.sync(path)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(e.into()),
        }
        match retry(|| client.check_stat(path)).await? {
            None => return Ok(Recreated::Gone),
            Some(stat) if stat.czxid != before => return Ok(Recreated::As(stat.czxid)),
            Some(_) => {}
        }
    }
    Err(last.into())
}

/// The `czxid` of the node a [`recreate`] transaction created: from its
/// reply, or read (some servers answer a `multi`'s create without its stat).
async fn created(
    client: &zk::Client,
    path: &str,
    results: &[zk::MultiWriteResult],
) -> Result<Recreated, zk::Error> {
    if let Some(zk::MultiWriteResult::Create { stat, .. }) = results.get(RECREATE)
        && !stat.is_invalid()
    {
        return Ok(Recreated::As(stat.czxid));
    }
    match retry(|| client.check_stat(path)).await? {
        Some(stat) => Ok(Recreated::As(stat.czxid)),
        // Created, then gone at once (its session ended, a release).
        None => Ok(Recreated::Gone),
    }
}
