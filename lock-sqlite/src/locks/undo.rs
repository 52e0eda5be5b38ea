//! Undoing a grant whose reply was lost: its future was dropped (a
//! timeout, a cancelled acquire) while its commit was under way, so the row
//! may be in the file with no lease to show for it. Its presence file was
//! closed with the future, so others may take the name at once; the row
//! and the file are then removed in the background, through the client's
//! `Cleanups`, which `close` finishes.

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
}

/// Armed before a grant's commit, disarmed once its outcome is known;
/// dropped armed, it undoes the grant.
#[derive(Debug)]
pub(super) struct Undo {
    armed: Option<(Weak<Client>, Grant, Duration)>,
}

impl Undo {
    /// Arms the undo of the grant of `kind` `name`, `slot`, for `ttl`.
    pub(super) fn arm(
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
        };
        Undo {
            armed: Some((client.me.clone(), grant, ttl)),
        }
    }

    /// The grant's outcome is known: nothing to undo.
    pub(super) fn disarm(mut self) {
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
        cleanups.retry(
            client,
            until,
            "undoing an acquire whose reply was lost",
            move |client| {
                let grant = grant.clone();
                async move { client.undo(&grant).await }
            },
        );
    }
}

impl Client {
    /// Deletes `grant`'s row (owner- and fence-checked) and its presence
    /// file. Nothing is written once the file was replaced under this
    /// client.
    async fn undo(&self, grant: &Grant) -> Result<(), LockError> {
        if matches!(self.grants.closed(), Some(Closed::Replaced(_))) || self.writer.is_closed() {
            return Ok(());
        }
        lockcore::backend::timed(BACKEND, "undo", self.limit, async {
            let mut tx = self.begin().await?;
            sqlx::query(sql::RELEASE)
                .bind(grant.kind.as_str())
                .bind(&grant.name)
                .bind(grant.slot)
                .bind(&grant.owner)
                .bind(grant.fence)
                .fetch_optional(&mut *tx)
                .await
                .map_err(error::map)?;
            tx.commit().await.map_err(error::map)
        })
        .await?;
        self.remove_presence(u64::try_from(grant.fence).unwrap_or(0));
        Ok(())
    }
}
