//! Renewing leases in batches: sessions are the leases, so a batch costs
//! one `sync` per session plus what each lease needs to prove its node is
//! still its own.

use std::sync::Arc;

use lockcore::{Lease, LockError};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::connection::Client;
use crate::connection::session::Session;
use crate::error::map;
use crate::error::{closed, not_held};
use crate::locks::held::{Held, Over, gone};

/// A lease's place in a batch, and its grant.
type Indexed = (usize, Arc<Held>);

impl Client {
    /// Renews `leases`: one `sync` per session, which proves the session
    /// alive at the leader after it was sent (the lease keeps its margin for
    /// what the leader may not have heard), plus, for each lease, proof that
    /// its node is still this grant's. The keeper's watch on the node is
    /// that proof when it was set before the `sync` and has not fired by its
    /// reply (see [`Held::watched_through`]); a node not watched yet (held
    /// for less than a twentieth of the session) is read instead, in the
    /// same round trip. So renewing any number of watched leases costs one
    /// request.
    ///
    /// A session whose fence floor was raised while it was disconnected
    /// (a restore) is retired instead (see [`crate::fence::floor`]): its leases
    /// are lost.
    ///
    /// A kept lease (`set_remaining`) is a TTL node, no longer its
    /// session's: renewing it sets its remaining time to its TTL again, as
    /// stores with a TTL per lock renew.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        if self.is_closed() {
            return leases.iter().map(|_| Err(closed())).collect();
        }
        let now = Instant::now();
        let mut verdicts: Vec<Option<Result<Lease, LockError>>> = Vec::with_capacity(leases.len());
        let mut expired = Vec::new();
        let mut kept = Vec::new();
        let mut sessions: Vec<(Arc<Session>, Vec<Indexed>)> = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            let held = self.held(lease);
            match held {
                Some(held) if held.kept().is_some() => {
                    kept.push(i);
                    verdicts.push(None);
                    continue;
                }
                // Past its deadline unrenewed: its client deletes the node.
                Some(held) if held.expire_if_due(now) => expired.push(held.clone()),
                Some(held) if held.over() == Over::No && !held.session.is_ended() => {
                    let entry = (i, held.clone());
                    match (sessions.iter_mut()).find(|(s, _)| Arc::ptr_eq(s, &held.session)) {
                        Some((_, group)) => group.push(entry),
                        None => sessions.push((held.session.clone(), vec![entry])),
                    }
                    verdicts.push(None);
                    continue;
                }
                _ => {}
            }
            verdicts.push(Some(Err(not_held(lease))));
        }
        let renewals = sessions
            .iter()
            .map(|(session, group)| self.renew_on(session, leases, group));
        // Past its deadline: deleted in the background, tried again while
        // the connection is in trouble (the renewal answers "not held" now).
        for held in &expired {
            self.delete_expired_later(held);
        }
        let kept = kept.into_iter().map(|i| async move {
            let lease = &leases[i];
            (i, self.set_remaining(lease, lease.ttl()).await)
        });
        let (renewed, kept) = futures_util::future::join(
            futures_util::future::join_all(renewals),
            futures_util::future::join_all(kept),
        )
        .await;
        for (i, verdict) in renewed.into_iter().flatten().chain(kept) {
            verdicts[i] = Some(verdict);
        }
        (verdicts.into_iter().zip(leases))
            .map(|(verdict, lease)| verdict.unwrap_or_else(|| Err(not_held(lease))))
            .collect()
    }

    /// Renews the leases `group` of `leases` (by index, with their grant),
    /// all of `session`.
    async fn renew_on(
        &self,
        session: &Session,
        leases: &[Lease],
        group: &[Indexed],
    ) -> Vec<(usize, Result<Lease, LockError>)> {
        let client = match session.client() {
            Ok(client) => client,
            Err(e) => {
                let failed = |(i, held): &Indexed| {
                    (*i, Err(map(format!("renewing {}", held.path), e.clone())))
                };
                return group.iter().map(failed).collect();
            }
        };
        let client = &client;
        // Each lease's send time, on its own clock, and this process's
        // monotonic one for the watches: all read before the sync leaves.
        let sent: Vec<_> = group.iter().map(|(i, _)| leases[*i].now()).collect();
        let sent_at = Instant::now();
        let synced = client.sync(&self.config.root);
        // Requests go out in call order: these reads come after the sync.
        let reads: Vec<_> = (group.iter())
            .map(|(_, held)| (!held.watched_before(sent_at)).then(|| client.check_stat(&held.path)))
            .collect();
        let synced = match synced.await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e),
        };
        // Under a raised floor the session is retired: its leases are lost.
        let synced = match synced {
            Ok(()) => match session.floor_holds().await {
                Ok(true) => Ok(()),
                Ok(false) => Err(zk::Error::SessionExpired),
                Err(e) => return group.iter().map(|(i, _)| (*i, Err(e.clone()))).collect(),
            },
            Err(e) => Err(e),
        };
        // Each lease's proof, all at once: a node whose watch went (its
        // release, a write) is read, and those reads go out together, so a
        // batch taken while many of its locks are being released still
        // costs one round trip, not one per lock in series.
        let synced = &synced;
        let proofs = (group.iter().zip(reads)).map(|((_, held), read)| async move {
            match (synced, read) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), Some(read)) => read.await.map(|stat| self.is_ours(held, stat)),
                (Ok(()), None) => match held.watched_through(sent_at) {
                    Some(alive) => Ok(alive),
                    // The watch went in between, or fired for a write: read
                    // the node after all.
                    None => client
                        .check_stat(&held.path)
                        .await
                        .map(|s| self.is_ours(held, s)),
                },
            }
        });
        let proofs = futures_util::future::join_all(proofs).await;
        let mut renewed = Vec::with_capacity(group.len());
        for (((i, held), ours), sent) in group.iter().zip(proofs).zip(sent) {
            let (i, lease) = (*i, &leases[*i]);
            let verdict = match ours {
                Ok(true) => {
                    let lease = lease.renewed(sent);
                    if held.extend(Instant::now(), lease.deadline()) {
                        Ok(lease)
                    } else {
                        Err(not_held(&lease))
                    }
                }
                Ok(false) | Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                    gone(held);
                    Err(not_held(lease))
                }
                Err(e) => Err(map(format!("renewing {}", held.path), e)),
            };
            renewed.push((i, verdict));
        }
        renewed
    }

    /// Whether `stat` (read after a `sync`) is `held`'s node: this grant's
    /// `czxid`, this session's ephemeral.
    fn is_ours(&self, held: &Held, stat: Option<zk::Stat>) -> bool {
        stat.is_some_and(|s| s.czxid == held.czxid && s.ephemeral_owner == held.session.id())
    }
}
