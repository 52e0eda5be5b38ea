//! Looking at who holds a lock, from outside the queue: `inspect`, a
//! forced release (`evict`), and a wake-up when the holder goes (`watch`).
//! `watch` serves waiters, but it reads the queue's head as `inspect` does,
//! so it lives here with it rather than in `wait`.

use lockcore::backend::wait::Wakeup;
use lockcore::{FencingToken, Holder, LockError, LockName, OwnerToken};
use zookeeper_client as zk;

use crate::connection::Client;
use crate::connection::requests::{delete_node, list, retry};
use crate::connection::session::Session;
use crate::error::{BACKEND, map};
use crate::keys::names::{NodeData, Queue};

/// How many times inspect and evict look again when the holder changes
/// under them.
const LOOKS: usize = 8;

impl Client {
    /// The head of `name`'s queue, read after a `sync`: its path and holder.
    async fn head(
        &self,
        session: &Session,
        name: &LockName,
    ) -> Result<Option<(String, Holder)>, LockError> {
        let parent = self.lock_path(name);
        let client = (session.client()).map_err(|e| map(format!("reading {parent}"), e))?;
        for _ in 0..LOOKS {
            let queue = list(&client, &parent, true).await?;
            let Some(head) = queue.head() else {
                return Ok(None);
            };
            let path = format!("{parent}/{}", head.name);
            let read = match retry(|| client.get_data(&path)).await {
                Ok(read) => read,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map(format!("reading {path}"), e)),
            };
            let (data, stat) = read;
            let data = NodeData::decode(&data);
            let holder = Holder::new(
                data.fence(stat.czxid)?,
                Some(OwnerToken::from_uuid(head.guid)),
                None,
            )
            .with_label(data.label);
            return Ok(Some((path, holder)));
        }
        Err(LockError::unavailable(
            BACKEND,
            format!("the holder of {parent} kept changing while being read"),
        ))
    }

    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, LockError> {
        let live = self.live().await?;
        Ok(self.head(&live.session, name).await?.map(|(_, h)| h))
    }

    /// Deletes the head of the queue (if its fence is `expected`, when given).
    pub(crate) async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        let live = self.live().await?;
        for _ in 0..LOOKS {
            let Some((path, current)) = self.head(&live.session, name).await? else {
                return Ok(None);
            };
            if expected.is_some_and(|fence| fence != current.fence) {
                return Ok(None);
            }
            // The path names one grant (its owner's uuid and sequence), so
            // this deletes exactly the holder just read.
            let evicting = |e| map(format!("force-releasing {path}"), e);
            if delete_node(&live.session.client().map_err(evicting)?, &path)
                .await
                .map_err(evicting)?
            {
                return Ok(Some(current));
            }
        }
        Ok(None)
    }

    /// A wake-up once the head of `name`'s queue is gone: an `exists` watch
    /// on it, as the session's waiters watch the node ahead of theirs. On
    /// an empty queue, once it changes ([`watch_empty`]): a multi-lock
    /// waiter arms every name's wake-up, most of them free, and must not
    /// be woken by those at once.
    pub(crate) async fn watch(&self, name: &LockName) -> Result<Option<Wakeup>, LockError> {
        let live = self.live().await?;
        let parent = self.lock_path(name);
        let watching = |e| map(format!("watching {parent}"), e);
        let client = &live.session.client().map_err(watching)?;
        let queue = list(client, &parent, false).await?;
        let Some(head) = queue.head() else {
            return watch_empty(client, &parent).await;
        };
        let path = format!("{parent}/{}", head.name);
        match client.check_and_watch_stat(&path).await {
            Ok((Some(_), watcher)) => Ok(Some(Box::pin(async move {
                watcher.changed().await;
            }))),
            Ok((None, _)) => Ok(Some(Box::pin(async {}))),
            Err(e) => Err(map(format!("watching {path}"), e)),
        }
    }
}

/// A wake-up once the empty queue under `parent` changes: a child watch on
/// the parent (a node queued, or the parent deleted), or an `exists` watch
/// on the missing parent (created). At once if a node was queued since the
/// caller looked: the next look watches it.
async fn watch_empty(client: &zk::Client, parent: &str) -> Result<Option<Wakeup>, LockError> {
    let watching = |e| map(format!("watching {parent}"), e);
    match client.list_and_watch_children(parent).await {
        Ok((children, _)) if Queue::new(&children).head().is_some() => Ok(Some(Box::pin(async {}))),
        Ok((_, watcher)) => Ok(Some(Box::pin(async move {
            watcher.changed().await;
        }))),
        Err(zk::Error::NoNode) => match client.check_and_watch_stat(parent).await {
            Ok((None, watcher)) => Ok(Some(Box::pin(async move {
                watcher.changed().await;
            }))),
            Ok((Some(_), _)) => Ok(Some(Box::pin(async {}))),
            Err(e) => Err(watching(e)),
        },
        Err(e) => Err(watching(e)),
    }
}
