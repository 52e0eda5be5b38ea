//! Undoing a grant whose reply was lost: its future was dropped (a
//! timeout, a cancelled acquire) while its commit was under way, so the row
//! may be in the file with no lease to show for it. Its presence file was
//! closed with the future, so others may take the name at once; the row
//! and the file are then removed in the background, through the client's
//! `Cleanups`, which `close` finishes.
//!
//! The same undo removes a waiting writer's intent when it gives up
//! (`rw/intent.rs`): a row known to have committed.

use std::sync::Weak;
use std::time::Duration;

use lockcore::{LockError, LockName, OwnerToken};
use tokio::time::Instant;

use super::held::Closed;
use super::sql;
use crate::connection::Client;
use crate::error::{self, BACKEND};
use crate::keys::Kind;

/// A grant that may commit without anyone to hand it to.
#[derive(Debug, Clone)]
struct Grant {
    kind: Kind,
    name: String,
    slot: i64,
    owner: String,
    fence: i64,
    /// The row is known to have committed: its fence is used up, so its
    /// presence file is nobody else's, and goes once the row is gone,
    /// whoever deleted it.
    committed: bool,
}

/// Armed before a grant's commit, disarmed once its outcome is known;
/// dropped armed, it undoes the grant.
#[derive(Debug)]
pub(crate) struct Undo {
    armed: Option<(Weak<Client>, Grant, Duration)>,
}

impl Undo {
    /// Arms the undo of the grant of `kind` `name`, `slot`, for `ttl`.
    pub(crate) fn arm(
        client: &Client,
        kind: Kind,
        name: &LockName,
        slot: i64,
        owner: OwnerToken,
        fence: i64,
        ttl: Duration,
    ) -> Undo {
        let grant = Grant {
            kind,
            name: name.as_str().to_owned(),
            slot,
            owner: owner.encode(),
            fence,
            committed: false,
        };
        Undo {
            armed: Some((client.me.clone(), grant, ttl)),
        }
    }

    /// The row is known to have committed (see [`Grant::committed`]).
    pub(crate) fn committed(mut self) -> Undo {
        if let Some((_, grant, _)) = &mut self.armed {
            grant.committed = true;
        }
        self
    }

    /// The grant's outcome is known: nothing to undo.
    pub(crate) fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some((client, grant, ttl)) = self.armed.take() else {
            return;
        };
        let Some(client) = client.upgrade() else {
            return;
        };
        // After its TTL the row is expired anyway.
        let until = Instant::now() + ttl;
        let cleanups = client.cleanups.clone();
        let what = if grant.committed {
            "removing the intent of a writer that gave up"
        } else {
            "undoing an acquire whose reply was lost"
        };
        cleanups.retry(client, until, what, move |client| {
            let grant = grant.clone();
            async move { client.undo(&grant).await }
        });
    }
}

impl Client {
    /// Deletes `grant`'s row (owner- and fence-checked) and, if there was
    /// one, its presence file. Without the row the grant never committed:
    /// its fence went back to the counter and may be another grant's by
    /// now, presence file included, which must not be touched (closing or
    /// even briefly locking it would free that grant's name early, or make
    /// its acquire find the file locked and refuse); unless it is known to
    /// have committed, when its row went with whoever deleted it. Nothing
    /// is written once the file was replaced under this client.
    async fn undo(&self, grant: &Grant) -> Result<(), LockError> {
        if matches!(self.grants.closed(), Some(Closed::Replaced(_))) || self.writer.is_closed() {
            return Ok(());
        }
        let deleted = lockcore::backend::timed(BACKEND, "undo", self.limit, async {
            let mut tx = self.begin().await?;
            let row = sqlx::query(sql::RELEASE)
                .bind(grant.kind.as_str())
                .bind(&grant.name)
                .bind(grant.slot)
                .bind(&grant.owner)
                .bind(grant.fence)
                .fetch_optional(&mut *tx)
                .await
                .map_err(error::map)?;
            tx.commit().await.map_err(error::map)?;
            Ok(row.is_some())
        })
        .await?;
        if deleted || grant.committed {
            self.remove_presence(u64::try_from(grant.fence).unwrap_or(0));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! An undo against a real lock file: retried while its first attempt
    //! fails retryably, and never attempted on a file replaced under the
    //! client or through a closed pool. Current-thread runtimes: the first
    //! test pauses time.

    use std::path::Path;
    use std::sync::Arc;

    use lockcore::backend::LockRequest;
    use lockcore::{Attempt, Capabilities};
    use sqlx::Connection as _;

    use super::*;
    use crate::config::SqliteConfig;

    /// A client of a fresh lock file in `dir`.
    async fn connect(dir: &Path) -> Arc<Client> {
        let url = format!("sqlite://{}", dir.join("locks.db").display());
        Client::connect(url.parse::<SqliteConfig>().unwrap())
            .await
            .unwrap()
    }

    /// The fences of the rows in the lock file, read through a connection
    /// of the test's own.
    async fn fences(path: &Path) -> Vec<i64> {
        let url = format!("sqlite://{}", path.display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let fences = sqlx::query_scalar("SELECT fence FROM distlock_leases ORDER BY fence")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        fences
    }

    /// A grant of lock `lock` for `ttl` whose reply was lost: its row is in
    /// the file, the client keeps no record of it (its presence file closed
    /// with the acquire's future), and its undo is armed. The undo and the
    /// grant's fence.
    async fn lost_grant(client: &Client, lock: &str, ttl: Duration) -> (Undo, i64) {
        let name = LockName::new(lock).unwrap();
        let ttl_checked = Capabilities::new(BACKEND).effective_ttl(ttl).unwrap();
        let request = LockRequest::new(name.clone(), ttl_checked);
        let Attempt::Acquired(lease) = client.try_grant(Kind::Lock, &request, 1).await.unwrap()
        else {
            panic!("{lock} is free");
        };
        let fence = lease.fence().get();
        client.forget(fence, None, false);
        let fence = i64::try_from(fence).unwrap();
        let undo = Undo::arm(client, Kind::Lock, &name, 0, lease.owner(), fence, ttl);
        (undo, fence)
    }

    /// The undo's first attempt fails retryably: another operation of the
    /// client holds its one writer connection (one waiting for the file's
    /// write lock, say), so the undo's wait for it times out. It is retried
    /// until its deadline, the grant's TTL from now, and removes the row
    /// once the connection is free.
    #[tokio::test]
    async fn an_undo_that_first_fails_retryably_is_retried_until_it_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let client = connect(dir.path()).await;
        // Long enough for both waits below, each one operation's bound.
        let ttl = client.limit * 4;
        let (undo, fence) = lost_grant(&client, "undo-retried", ttl).await;
        let busy = client.writer.acquire().await.unwrap();
        // On paused time, while the undo waits for the connection the
        // runtime is idle, so its timers fire at once: after one operation's
        // bound (`limit`, which each attempt is cut to) its first attempt has
        // failed, well before its deadline.
        tokio::time::pause();
        drop(undo);
        tokio::time::sleep(client.limit).await;
        tokio::time::resume();
        assert_eq!(fences(&path).await, [fence], "the undo ran while blocked");
        drop(busy);
        // It ends by its deadline at the latest, the row removed or not.
        assert!(
            client.cleanups.finish(ttl).await,
            "the undo outlived its TTL"
        );
        assert_eq!(
            fences(&path).await,
            Vec::<i64>::new(),
            "the undo gave up after its first attempt failed"
        );
        client.close().await;
    }

    /// An acquire cut short before its commit ran rolls back: its fence goes
    /// back to the counter, and the next grant gets it, presence file
    /// included. The cut acquire's undo (armed; it cannot know the commit
    /// never ran) finds no row of its own and leaves that file alone: the
    /// next grant keeps its proof of life (the file stays locked), so its
    /// name is not free to another process while it is held.
    #[tokio::test]
    async fn the_undo_of_a_grant_that_never_committed_leaves_its_fences_next_holder_alone() {
        let dir = tempfile::tempdir().unwrap();
        let client = connect(dir.path()).await;
        let ttl = client.limit * 4;
        let name = LockName::new("undo-rolled-back").unwrap();
        let request = LockRequest::new(
            name.clone(),
            Capabilities::new(BACKEND).effective_ttl(ttl).unwrap(),
        );
        let Attempt::Acquired(lease) = client.try_grant(Kind::Lock, &request, 1).await.unwrap()
        else {
            panic!("the name is free");
        };
        let fence = i64::try_from(lease.fence().get()).unwrap();
        // The undo of an earlier, rolled-back grant of the same fence: same
        // name, slot and fence, another owner.
        let undo = Undo::arm(&client, Kind::Lock, &name, 0, OwnerToken::new(), fence, ttl);
        drop(undo);
        assert!(client.cleanups.finish(ttl).await, "the undo did not end");
        let presence = client.presence.as_ref().expect("a presence directory");
        assert!(
            presence.is_held(lease.fence().get()),
            "the holder's presence file was closed or removed by another grant's undo"
        );
        client.release(&lease).await.unwrap();
        client.close().await;
    }

    /// Once the file was replaced under the client (restored from a backup),
    /// an undo writes nothing and is done at once, while the client's writer
    /// pool is still open: it does not keep `close` waiting until its limit.
    #[tokio::test]
    async fn an_undo_on_a_replaced_file_is_done_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locks.db");
        let client = connect(dir.path()).await;
        // Longer than the wait below: an undo retried until its deadline
        // outlasts it.
        let ttl = client.limit * 4;
        let (undo, _) = lost_grant(&client, "undo-replaced", ttl).await;
        let copy = dir.path().join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::rename(&copy, &path).unwrap();
        let refused = client
            .holders(Kind::Lock, &LockName::new("any").unwrap())
            .await;
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("was replaced")),
            "{refused:?}"
        );
        assert!(!client.writer.is_closed());
        drop(undo);
        assert!(
            client.cleanups.finish(client.limit).await,
            "the undo of a grant on a replaced file kept retrying"
        );
        client.close().await;
    }

    /// With the writer pool closed (a client not closed through `close`),
    /// an undo is done at once: it has nothing to write through.
    #[tokio::test]
    async fn an_undo_through_a_closed_pool_is_done_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let client = connect(dir.path()).await;
        // Longer than the wait below, as above.
        let ttl = client.limit * 4;
        let (undo, _) = lost_grant(&client, "undo-closed-pool", ttl).await;
        client.writer.close().await;
        drop(undo);
        assert!(
            client.cleanups.finish(client.limit).await,
            "the undo through a closed pool kept retrying"
        );
        client.close().await;
    }
}
