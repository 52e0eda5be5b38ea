//! Renewals: per session, one keep-alive (shared by every renewal waiting
//! for it) and one check that each renewed key still exists with its
//! create revision, however many locks a `Locker` holds. A renewal of a
//! lock on a retired session moves it to a new one instead.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{GetOptions, LeaseTimeToLiveOptions, Txn, TxnOp, TxnOpResponse};
use lockcore::backend::Moment;
use lockcore::{Lease, LockError};

use crate::connection::MAX_TXN_OPS;
use crate::connection::client::Inner;
use crate::connection::session::{Attached, Entry, Kind, Status, Use};
use crate::error::timed;
use crate::locks::grant::Grant;

/// Keys checked per transaction of gets (the fence floor's read is one
/// more); a renewal of more keys on one session asks the session's lease
/// which keys it carries instead, in one request.
const CHECK_BATCH: usize = MAX_TXN_OPS - 1;

/// Which renewed keys a session carries, as of a keep-alive sent at `sent`.
struct Checked {
    sent: Moment,
    /// Key → the session it is on.
    present: HashMap<Vec<u8>, i64>,
    /// The session moved keys were written to, kept until they are booked.
    _target: Option<Use>,
}

impl Inner {
    /// Renews each lease whose grant this client holds: per session, one
    /// keep-alive (shared) and one check that each key still exists with its
    /// create revision, after the keep-alive (a key that exists after it
    /// existed throughout, so exactly its grant was extended).
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut results: Vec<Option<Result<Lease, LockError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        let mut by_session: HashMap<i64, Vec<usize>> = HashMap::new();
        for (i, lease) in leases.iter().enumerate() {
            match self.held(lease) {
                Some(entry) => by_session.entry(entry.session).or_default().push(i),
                None => results[i] = Some(Err(not_held(lease))),
            }
        }
        let groups = futures_util::future::join_all(by_session.into_iter().map(
            |(session, at)| async move {
                let group: Vec<&Lease> = at.iter().map(|&i| &leases[i]).collect();
                (at, self.renew_on(session, &group).await)
            },
        ))
        .await;
        for (at, outcomes) in groups {
            for (i, outcome) in at.into_iter().zip(outcomes) {
                results[i] = Some(outcome);
            }
        }
        results
            .into_iter()
            .zip(leases)
            .map(|(r, lease)| r.unwrap_or_else(|| Err(not_held(lease))))
            .collect()
    }

    /// The book's entry of a grant this client holds.
    fn held(&self, lease: &Lease) -> Option<Entry> {
        let grant = Grant::of(lease)?;
        let entry = self.sessions.entry(&grant.key, grant.revision)?;
        matches!(entry.kind, Kind::Held { .. }).then_some(entry)
    }

    async fn renew_on(&self, session: i64, leases: &[&Lease]) -> Vec<Result<Lease, LockError>> {
        let grants: Vec<&Grant> = leases
            .iter()
            .filter_map(|l| l.extension::<Grant>())
            .collect();
        let outcome = match self.sessions.status(session) {
            Some((Status::Live, _)) => self.refresh_and_check(session, &grants).await,
            Some((Status::Retired, ttl)) => self.move_on(session, ttl, &grants).await,
            _ => Ok(None),
        };
        match outcome {
            Ok(Some(Checked { sent, present, .. })) => leases
                .iter()
                .zip(&grants)
                .map(|(lease, grant)| {
                    let at = present.get(&grant.key).copied();
                    if let Some(on) = at
                        && self.sessions.renewed(&grant.key, grant.revision, on, sent)
                    {
                        Ok(lease.renewed(sent))
                    } else {
                        self.lost(lease, grant);
                        Err(not_held(lease))
                    }
                })
                .collect(),
            Ok(None) => leases.iter().map(|l| Err(not_held(l))).collect(),
            Err(e) => leases.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// One keep-alive of `session`, then which of `grants` it carries:
    /// `None` if etcd says the session is gone.
    async fn refresh_and_check(
        &self,
        session: i64,
        grants: &[&Grant],
    ) -> Result<Option<Checked>, LockError> {
        let Some(handle) = self.sessions.handle(session) else {
            return Ok(None);
        };
        let Some(sent) = self.sessions.refresh(&handle).await? else {
            return Ok(None);
        };
        let present = if grants.len() <= CHECK_BATCH {
            self.check_exact(grants).await?
        } else {
            self.check_attached(session, grants).await?
        };
        let on_session = present
            .into_iter()
            .filter(|(_, lease)| *lease == session)
            .collect();
        Ok(Some(Checked {
            sent,
            present: on_session,
            _target: None,
        }))
    }

    /// Which grants' keys exist with their create revision, and on which
    /// lease: one transaction of gets (linearizable), which reads the fence
    /// floor too (a raise retires the sessions from before it).
    async fn check_exact(&self, grants: &[&Grant]) -> Result<HashMap<Vec<u8>, i64>, LockError> {
        let only_keys = GetOptions::new().with_keys_only();
        let mut gets: Vec<TxnOp> = grants
            .iter()
            .map(|g| TxnOp::get(g.key.clone(), Some(only_keys.clone())))
            .collect();
        gets.push(self.floor.get());
        let reply = self.txn("renew check", Txn::new().and_then(gets)).await?;
        self.floor.learn_from(&reply)?;
        let mut present = HashMap::new();
        for (grant, op) in grants.iter().zip(reply.op_responses()) {
            if let TxnOpResponse::Get(get) = op
                && let Some(kv) = get.kvs().first()
                && kv.create_revision() == grant.revision
            {
                present.insert(grant.key.clone(), kv.lease());
            }
        }
        Ok(present)
    }

    /// Which grants' keys `session`'s lease carries: one request however
    /// many keys. The lease's leader tracks them; a key only this client
    /// writes, attached to its session, is the book's grant of that key.
    async fn check_attached(
        &self,
        session: i64,
        grants: &[&Grant],
    ) -> Result<HashMap<Vec<u8>, i64>, LockError> {
        let reply = timed(
            self.timeout,
            "renew check",
            self.conn
                .lease()?
                .time_to_live(session, Some(LeaseTimeToLiveOptions::new().with_keys())),
        )
        .await?;
        if reply.ttl() <= 0 {
            return Ok(HashMap::new());
        }
        let attached: std::collections::HashSet<&[u8]> =
            reply.keys().iter().map(Vec::as_slice).collect();
        Ok(grants
            .iter()
            .filter(|g| attached.contains(g.key.as_slice()))
            .map(|g| (g.key.clone(), session))
            .collect())
    }

    /// Renewal of grants on retired session `from`: they move to a fresh
    /// one (each key keeps its create revision), which counts from its last
    /// refresh.
    async fn move_on(
        &self,
        from: i64,
        ttl: Duration,
        grants: &[&Grant],
    ) -> Result<Option<Checked>, LockError> {
        let target = self.sessions.for_entry(ttl).await?;
        let refreshed = target.refreshed;
        let keys: Vec<Attached> = grants
            .iter()
            .map(|g| Attached {
                key: g.key.clone(),
                revision: g.revision,
                value: g.value.clone(),
            })
            .collect();
        let moved = self
            .sessions
            .move_to(from, target.session.id, &keys)
            .await?;
        let on = target.session.id;
        Ok(Some(Checked {
            sent: refreshed,
            present: moved.into_iter().map(|key| (key, on)).collect(),
            _target: Some(target),
        }))
    }

    /// The grant is gone: forget it and fire its loss signal.
    fn lost(&self, lease: &Lease, grant: &Grant) {
        if let Some(entry) = self.sessions.forget(&grant.key, grant.revision) {
            entry.lost.cancel();
        }
        if let Some(signal) = lease.loss_signal() {
            signal.cancel();
        }
    }
}

fn not_held(lease: &Lease) -> LockError {
    LockError::NotHeld {
        name: lease.name().clone(),
    }
}
