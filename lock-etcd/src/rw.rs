//! Reader-writer locks: readers share a name, a writer holds it alone, and
//! a writer waiting in line keeps new readers out. Where the keys live is
//! `keys::rw`'s; waiting is [`waiter`]'s.
//!
//! Every grant is one `Txn` that puts the grant's key (attached to the
//! client's session, like a lock entry) under compares that say the rules
//! hold at that revision:
//!
//! - a **read**: no key under `held/write/`, and none under `line/write/`
//!   (for a reader in line: none created before its own entry);
//! - a **write**: no key under `held/`, and none under `line/` (for a
//!   writer in line: none created before its own entry).
//!
//! A waiter's grant deletes its entry in line in the same `Txn`, compared
//! unchanged (create revision and value). etcd compares a key range key by
//! key, and an empty range as one key of create revision 0, so "every
//! writer in line came after us" fails on an empty line: a reader's `Txn`
//! from the line asks "no writer in line" first, and the other in a nested
//! `Txn` of its failure branch.
//!
//! The grant's key is new, so its create revision is the revision of the
//! `Txn` that decided it. Its fence is that revision plus the fence offset,
//! as a lock's (the floor compared in every grant): fences grow in grant
//! order, reads and writes alike, and every fence of the name, past or
//! future, comes from the one revision counter. A waiter's place in line
//! has no bearing on its fence.
//!
//! A grant is then held like a lock entry: renewed, released, moved onto a
//! lease of its own and lost through the same book (`session`), and a
//! grant whose reply was lost goes with its retired session.

mod waiter;

use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lockcore::backend::{CancellationToken, LockRequest};
use lockcore::{Access, Attempt, Holder, Lease, LockError, LockName, OwnerToken};

use crate::connection::client::Inner;
use crate::connection::session::{Attached, Entry, Kind};
use crate::error::{BACKEND, protocol};
use crate::keys::record::Record;
use crate::keys::rw::RwKeys;
use crate::keys::{Keys, empty, range_end, unchanged};
use crate::locks::grant::{InFlight, Sending};

pub(crate) use waiter::acquire;

/// `Txn`s per attempt: a fence floor that moved, a session gone, a key
/// name still taken each cost one more.
const TRIES: usize = 3;

/// What a grant `Txn` that granted nothing found.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Our new entry in line, if the `Txn` queued us.
    pub(crate) queued: Option<Attached>,
    /// Our entry in line is no longer there as we wrote it (its session
    /// expired, an operator cleared it).
    pub(crate) gone: bool,
    /// A `Txn` right away may grant: the rules admit us, or something else
    /// refused (the fence floor moved, a key name was still taken, the
    /// session was gone).
    pub(crate) again: bool,
    /// The keys that refused us, as the `Txn` read them at `at`: until each
    /// is deleted, another grant `Txn` would be refused too.
    pub(crate) ahead: Ahead,
}

/// The keys that keep a waiter out, read at revision `at`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Ahead {
    pub(crate) at: i64,
    pub(crate) keys: std::collections::HashSet<Vec<u8>>,
}

/// What a grant `Txn` came to.
pub(crate) enum Admission {
    Granted(Lease),
    Refused(Refusal),
}

/// The prefixes of the grants that exclude `access`, and of the waiters
/// that go before it: a read waits for writers, a write for everyone.
fn blockers(keys: &RwKeys, access: Access) -> (Vec<u8>, Vec<u8>) {
    match access {
        Access::Read => (keys.held_by(Access::Write), keys.waiting_for(Access::Write)),
        Access::Write => (keys.held(), keys.line()),
    }
}

/// The compares under which `access` is granted, for a waiter whose entry
/// in line was created at `mine` (`None`: not in line), and for a reader
/// in line a second set to try if the first fails (see the module doc).
fn rules(keys: &RwKeys, access: Access, mine: Option<i64>) -> (Vec<Compare>, Option<Vec<Compare>>) {
    let (held, waiting) = blockers(keys, access);
    let Some(mine) = mine else {
        return (vec![empty(&held), empty(&waiting)], None);
    };
    // Every key of the range created no earlier than ours (a writer's own
    // entry is in it, so it is never empty).
    let after = Compare::create_revision(waiting.clone(), CompareOp::Greater, mine - 1)
        .with_range(range_end(&waiting));
    match access {
        Access::Read => (
            vec![empty(&held), empty(&waiting)],
            Some(vec![empty(&held), after]),
        ),
        Access::Write => (vec![empty(&held), after], None),
    }
}

/// Whether the lock's keys `seen` (all of them, with their create
/// revisions, at one revision) admit `access` for the waiter whose entry
/// was created at `mine`.
#[cfg(test)]
fn admits<'a>(
    keys: &RwKeys,
    seen: impl IntoIterator<Item = (&'a [u8], i64)>,
    access: Access,
    mine: Option<i64>,
) -> bool {
    refusing(keys, seen, access, mine).next().is_none()
}

/// Those of the lock's keys `seen` that keep `access` out for the waiter
/// whose entry was created at `mine`: grants it excludes, and waiters that
/// go before it.
fn refusing<'a>(
    keys: &RwKeys,
    seen: impl IntoIterator<Item = (&'a [u8], i64)>,
    access: Access,
    mine: Option<i64>,
) -> impl Iterator<Item = &'a [u8]> {
    let (held, waiting) = blockers(keys, access);
    seen.into_iter()
        .filter(move |(key, created)| {
            key.starts_with(&held)
                || (key.starts_with(&waiting) && mine.is_none_or(|m| *created < m))
        })
        .map(|(key, _)| key)
}

/// The grant `Txn`: `grant` under `base` and `first`, else (a nested
/// `Txn` in the failure branch) under `base` and `second`, else `reads`.
fn nest(
    (first, second): (Vec<Compare>, Option<Vec<Compare>>),
    base: &[Compare],
    grant: &[TxnOp],
    reads: Vec<TxnOp>,
) -> Txn {
    let under = |rule: Vec<Compare>, failure: Vec<TxnOp>| {
        Txn::new()
            .when([base, rule.as_slice()].concat())
            .and_then(grant.to_vec())
            .or_else(failure)
    };
    match second {
        None => under(first, reads),
        Some(second) => under(first, vec![TxnOp::txn(under(second, reads))]),
    }
}

/// The failure branch's reads of a grant `Txn` whose alternatives nest
/// `depth` deep; `None` if one of them granted.
fn refused(reply: &TxnResponse, depth: usize) -> Result<Option<Vec<TxnOpResponse>>, LockError> {
    if reply.succeeded() {
        return Ok(None);
    }
    let responses = reply.op_responses();
    if depth == 0 {
        return Ok(Some(responses));
    }
    match responses.into_iter().next() {
        Some(TxnOpResponse::Txn(nested)) => refused(&nested, depth - 1),
        _ => Err(protocol("a grant's failure branch without its nested Txn")),
    }
}

fn kvs(response: Option<TxnOpResponse>) -> Result<Vec<KeyValue>, LockError> {
    match response {
        Some(TxnOpResponse::Get(mut get)) => Ok(get.take_kvs()),
        _ => Err(protocol("a grant's failure branch without its reads")),
    }
}

impl Inner {
    /// One attempt at `access`, no waiting: nothing is left in the store
    /// unless granted.
    pub(crate) async fn try_acquire_share(
        self: &Arc<Self>,
        request: &LockRequest,
        access: Access,
    ) -> Result<Attempt, LockError> {
        for _ in 0..TRIES {
            let mut in_flight = InFlight::new(self);
            match self
                .admit(request, access, None, false, &mut in_flight.sending)
                .await?
            {
                Admission::Granted(lease) => return Ok(Attempt::Acquired(lease)),
                Admission::Refused(refusal) if refusal.again => {}
                Admission::Refused(_) => return Ok(Attempt::Held { expires_in: None }),
            }
        }
        Err(LockError::unavailable(
            BACKEND,
            "the etcd session or fence floor kept changing",
        ))
    }

    /// One grant `Txn` for `access`: from `place` in line, or (none) at
    /// once; with `queue`, a refusal puts our entry in line in the same
    /// `Txn`. `sending` holds what it may write while it is in flight.
    pub(crate) async fn admit(
        &self,
        request: &LockRequest,
        access: Access,
        place: Option<&Attached>,
        queue: bool,
        sending: &mut Sending,
    ) -> Result<Admission, LockError> {
        let keys = self.keys.rw(request.name());
        let using = self.sessions.for_entry(request.ttl().get()).await?;
        let (session, refreshed) = (using.session.id, using.refreshed);
        let mut kv = self.conn.kv()?;
        let on_session = || Some(PutOptions::new().with_lease(session));
        let held = keys.held_by(access);
        let n = self.sessions.reserve(session, &held);
        let key = Keys::entry(&held, session, n);
        let (floor, offset) = self.floor.guard();
        let record = Record::new(OwnerToken::new(), offset, request.label());
        let value: Arc<[u8]> = record.encode().into();
        let mut grant = vec![TxnOp::put(key.clone(), value.to_vec(), on_session())];
        let mut base = vec![
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            floor,
        ];
        if let Some(place) = place {
            grant.push(TxnOp::delete(place.key.clone(), None));
            base.extend(unchanged(&place.key, place.revision, &place.value));
        }
        sending.on(session);
        sending.may_write(&key, &value);
        // Refused: queue (if asked; only if the entry name is free), then
        // read what refused us.
        let mut reads = Vec::new();
        let line = queue.then(|| {
            let waiting = keys.waiting_for(access);
            let m = self.sessions.reserve(session, &waiting);
            let entry = Keys::entry(&waiting, session, m);
            let record = Record::new(OwnerToken::new(), offset, request.label());
            let value: Arc<[u8]> = record.encode().into();
            reads.push(TxnOp::txn(
                Txn::new()
                    .when([Compare::create_revision(entry.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(entry.clone(), value.to_vec(), on_session())]),
            ));
            sending.may_write(&entry, &value);
            (waiting, m, entry, value)
        });
        let everything = GetOptions::new()
            .with_range(range_end(keys.base()))
            .with_keys_only();
        reads.push(TxnOp::get(keys.base().to_vec(), Some(everything)));
        reads.push(self.floor.get());
        let rules = rules(&keys, access, place.map(|p| p.revision));
        let depth = usize::from(rules.1.is_some());
        let txn = nest(rules, &base, &grant, reads);
        let reply = tokio::time::timeout(self.timeout, kv.txn(txn)).await;
        *sending = Sending::default();
        let unreserve = || {
            self.sessions.unreserve(session, &held, n);
            if let Some((waiting, m, ..)) = &line {
                self.sessions.unreserve(session, waiting, *m);
            }
        };
        let reply = match self.written(reply, session, "reader-writer acquire") {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                unreserve();
                return Ok(Admission::Refused(Refusal {
                    queued: None,
                    gone: false,
                    again: true,
                    ahead: Ahead::default(),
                }));
            }
            Err(e) => {
                if !e.is_retryable() {
                    unreserve(); // refused: nothing was written
                }
                return Err(e);
            }
        };
        let revision = reply.header().map_or(0, |h| h.revision());
        let Some(responses) = refused(&reply, depth)? else {
            if let Some((waiting, m, ..)) = &line {
                self.sessions.unreserve(session, waiting, *m);
            }
            if let Some(place) = place {
                self.sessions.forget(&place.key, place.revision);
            }
            tracing::debug!(name = %request.name(), %access, revision, "reader-writer lock granted");
            let lease = self.grant_held(
                request,
                &record,
                session,
                key,
                revision,
                value,
                refreshed,
                Some((held, n)),
            )?;
            return Ok(Admission::Granted(lease.with_access(access)));
        };
        let mut responses = responses.into_iter();
        let queued = match line {
            None => None,
            Some((waiting, m, entry, value)) => match responses.next() {
                Some(TxnOpResponse::Txn(put)) if put.succeeded() => {
                    self.sessions.record(
                        entry.clone(),
                        Entry {
                            session,
                            revision,
                            value: value.clone(),
                            kind: Kind::Waiting,
                            lost: CancellationToken::new(),
                            number: Some((waiting, m)),
                        },
                    );
                    Some(Attached {
                        key: entry,
                        revision,
                        value,
                    })
                }
                // The name is still taken (an earlier entry's delete has not
                // landed): it stays reserved, the next try takes another.
                Some(TxnOpResponse::Txn(_)) => None,
                _ => return Err(protocol("a grant's failure branch without its queueing")),
            },
        };
        let seen = kvs(responses.next())?;
        self.floor.learn(&kvs(responses.next())?)?;
        let floor_moved = self.floor.offset() != offset;
        let taken = seen.iter().any(|kv| kv.key() == key.as_slice());
        if !taken {
            self.sessions.unreserve(session, &held, n);
        }
        let mine = place.or(queued.as_ref()).map(|p| p.revision);
        let entries = || seen.iter().map(|kv| (kv.key(), kv.create_revision()));
        let ahead = Ahead {
            at: revision,
            keys: refusing(&keys, entries(), access, mine)
                .map(<[u8]>::to_vec)
                .collect(),
        };
        let admitted = ahead.keys.is_empty();
        let gone = place.is_some_and(|p| {
            let there = seen
                .iter()
                .any(|kv| kv.key() == p.key.as_slice() && kv.create_revision() == p.revision);
            // Admitted, and refused all the same with nothing else to
            // blame: the entry there is not the one we wrote.
            !there || (admitted && !floor_moved && !taken)
        });
        Ok(Admission::Refused(Refusal {
            again: floor_moved || taken || admitted || (queue && queued.is_none()),
            queued,
            gone,
            ahead,
        }))
    }

    /// Every holder of the reader-writer lock `name`, by fence.
    pub(crate) async fn rw_holders(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let keys = self.keys.rw(name);
        let mut holders: Vec<Holder> = self
            .holders_under(&keys.held(), "inspect a reader-writer lock", |key| {
                keys.held_access(key)
            })
            .await?
            .into_iter()
            .map(|(access, holder)| holder.with_access(access))
            .collect();
        holders.sort_by_key(|h| h.fence);
        Ok(holders)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_wait_for_writers_and_writers_for_everyone_ahead() {
        let keys = Keys::new("p/").rw(&LockName::new("a").unwrap());
        let entry = |prefix: Vec<u8>, n| Keys::entry(&prefix, 1, n);
        let reader = (entry(keys.held_by(Access::Read), 0), 5);
        let writer_waiting = (entry(keys.waiting_for(Access::Write), 0), 7);
        let reader_waiting = (entry(keys.waiting_for(Access::Read), 1), 8);
        let writer = (entry(keys.held_by(Access::Write), 0), 9);
        let admits = |seen: &[&(Vec<u8>, i64)], access, mine| {
            admits(
                &keys,
                seen.iter().map(|(k, r)| (k.as_slice(), *r)),
                access,
                mine,
            )
        };
        let line = [&reader, &writer_waiting, &reader_waiting];
        // A new reader, or one behind the writer, waits; one ahead of it does not.
        assert!(!admits(&line, Access::Read, None));
        assert!(!admits(&line, Access::Read, Some(8)));
        assert!(admits(&line, Access::Read, Some(6)));
        // The writer waits for the reader that holds, then goes first.
        assert!(!admits(&line, Access::Write, Some(7)));
        assert!(admits(&[&writer_waiting], Access::Write, Some(7)));
        assert!(!admits(&[&writer_waiting], Access::Write, None));
        // Readers share; a held write keeps everyone out.
        assert!(admits(&[&reader], Access::Read, None));
        assert!(!admits(&[&writer], Access::Read, Some(10)));
        assert!(!admits(&[&writer], Access::Write, None));
        assert!(rules(&keys, Access::Read, Some(3)).1.is_some());
        assert!(rules(&keys, Access::Write, Some(3)).1.is_none());
        assert!(rules(&keys, Access::Read, None).1.is_none());
    }
}
