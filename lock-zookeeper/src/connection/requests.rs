//! Requests that survive a lost connection: reads retried, deletes that
//! tell whether they deleted, and the listing of a queue.

use std::future::Future;

use lockcore::LockError;
use uuid::Uuid;
use zookeeper_client as zk;

use crate::error::{connection_lost, map};
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
    let Ok(children) = retry(|| client.list_children(parent)).await else {
        return;
    };
    for node in Queue::new(&children).all_of(guid) {
        let _ = delete_node(client, &format!("{parent}/{}", node.name)).await;
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
