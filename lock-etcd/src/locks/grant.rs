//! A grant: what a lock entry, permit slot or reader-writer grant this
//! client wrote carries in its [`Lease`], and how a write of a new entry is judged (a session gone,
//! or a reply lost: its session is retired), and what a write in flight
//! may have put, undone when its caller is dropped before the reply.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};
use lockcore::backend::{CancellationToken, LockRequest, Moment};
use lockcore::{Lease, LockError};

use crate::connection::client::Inner;
use crate::connection::session::{Entry, Kind, Paid};
use crate::error::{self, BACKEND, lease_not_found};
use crate::keys::record::Record;

/// What a granted lock, permit or reader-writer share carries in its
/// [`Lease`] extension.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) key: Vec<u8>,
    pub(crate) revision: i64,
    pub(crate) value: Arc<[u8]>,
}

impl Grant {
    /// The grant `lease` carries, if the lease's owner and fence are the
    /// grant's own: a lease rebuilt with another owner or fence is no grant
    /// of this backend's, and acts on nothing.
    pub(crate) fn of(lease: &Lease) -> Option<&Grant> {
        let grant = lease.extension::<Grant>()?;
        let record = Record::decode(&grant.value)?;
        let fence = Record::fence(record.offset, grant.revision).ok()?;
        (record.owner == lease.owner() && fence == lease.fence()).then_some(grant)
    }
}

/// What a grant `Txn` in flight may write (on one session or several):
/// undone if its caller is dropped before the reply.
#[derive(Debug, Default)]
pub(crate) struct Sending {
    sessions: Vec<i64>,
    keys: Vec<(Vec<u8>, Arc<[u8]>)>,
}

impl Sending {
    /// The `Txn` writes on `session`.
    pub(crate) fn on(&mut self, session: i64) {
        if !self.sessions.contains(&session) {
            self.sessions.push(session);
        }
    }

    /// The `Txn` may put `key` with `value`.
    pub(crate) fn may_write(&mut self, key: &[u8], value: &Arc<[u8]>) {
        self.keys.push((key.to_vec(), value.clone()));
    }

    /// Deletes what may have landed (each key only while it holds our
    /// value), and retires the sessions so that whatever lands later goes
    /// with them, as after a lost reply.
    pub(crate) fn undo(self, inner: &Arc<Inner>) {
        if self.sessions.is_empty() {
            return;
        }
        for session in self.sessions {
            inner.sessions.retire(session);
        }
        for (key, value) in self.keys {
            let inner = inner.clone();
            inner.conn.clone().cleanup(async move {
                let txn = Txn::new()
                    .when([Compare::value(key.clone(), CompareOp::Equal, value.to_vec())])
                    .and_then([TxnOp::delete(key, None)]);
                if let Err(e) = inner.txn("undo a dropped acquire", txn).await {
                    tracing::debug!(error = %e, "undoing a dropped acquire failed; its session is retired");
                }
            });
        }
    }
}

/// A grant `Txn` in flight: what it may write ([`Sending`]) is undone if
/// this is dropped before the reply is in, as when the caller's future is
/// dropped mid-flight (a timeout around it, a cancelled wait). Without it,
/// a grant landing after that stays on a session the client keeps alive
/// for its other locks: a holder nobody knows of, for as long as it lives.
pub(crate) struct InFlight<'a> {
    inner: &'a Arc<Inner>,
    pub(crate) sending: Sending,
}

impl<'a> InFlight<'a> {
    /// Nothing yet: what the `Txn` may write goes into `sending`.
    pub(crate) fn new(inner: &'a Arc<Inner>) -> Self {
        InFlight {
            inner,
            sending: Sending::default(),
        }
    }

    /// A `Txn` that may put `key` with `value` on `session`.
    pub(crate) fn entry(
        inner: &'a Arc<Inner>,
        session: i64,
        key: &[u8],
        value: &Arc<[u8]>,
    ) -> Self {
        let mut in_flight = InFlight::new(inner);
        in_flight.sending.on(session);
        in_flight.sending.may_write(key, value);
        in_flight
    }

    /// The reply is in, and says what was written: nothing to undo.
    pub(crate) fn answered(&mut self) {
        self.sending = Sending::default();
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        std::mem::take(&mut self.sending).undo(self.inner);
    }
}

impl Inner {
    /// A grant this client just wrote on `session`: recorded as held (its
    /// session's keeper keeps it, and its loss reaches the lease), then the
    /// lease.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grant_held(
        &self,
        request: &LockRequest,
        record: &Record,
        session: i64,
        key: Vec<u8>,
        revision: i64,
        value: Arc<[u8]>,
        refreshed: Moment,
        number: Option<(Vec<u8>, u32)>,
    ) -> Result<Lease, LockError> {
        let lost = CancellationToken::new();
        self.sessions.record(
            key.clone(),
            Entry {
                session,
                revision,
                value: value.clone(),
                kind: Kind::Held {
                    paid: Paid {
                        from: refreshed,
                        ttl: request.ttl().get(),
                    },
                },
                lost: lost.clone(),
                number,
            },
        );
        self.lease(request, record, key, revision, value, refreshed, lost)
    }

    /// The lease of a grant: entry `key`, created at `revision` with `value`
    /// (`record`), on a session last proved alive by a request sent at
    /// `refreshed`: the lease counts from there, on the clock that read it
    /// (not the request's: the proof is older than the request).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lease(
        &self,
        request: &LockRequest,
        record: &Record,
        key: Vec<u8>,
        revision: i64,
        value: Arc<[u8]>,
        refreshed: Moment,
        lost: CancellationToken,
    ) -> Result<Lease, LockError> {
        let fence = Record::fence(record.offset, revision)?;
        Ok(Lease::new(
            request.name().clone(),
            record.owner,
            fence,
            request.ttl(),
            refreshed,
        )
        .with_clock(self.clock.clone())
        .with_loss_signal(lost)
        .with_extension(Grant {
            key,
            revision,
            value,
        }))
    }

    /// The reply of a write of new entries on `session`: `Ok(None)` if etcd
    /// says the session is gone (nothing was written). A write without an
    /// answer may land later, unseen: its session is retired.
    pub(crate) fn written(
        &self,
        reply: Result<Result<TxnResponse, etcd_client::Error>, tokio::time::error::Elapsed>,
        session: i64,
        what: &str,
    ) -> Result<Option<TxnResponse>, LockError> {
        match reply {
            Ok(Ok(reply)) => Ok(Some(reply)),
            Ok(Err(e)) if lease_not_found(&e) => {
                self.sessions.gone(session);
                Ok(None)
            }
            Ok(Err(e)) => {
                let e = error::map(e);
                if e.is_retryable() {
                    self.sessions.retire(session);
                }
                Err(e)
            }
            Err(_) => {
                self.sessions.retire(session);
                Err(LockError::unavailable(
                    BACKEND,
                    format!("{what} got no answer within {:?}", self.timeout),
                ))
            }
        }
    }
}
