//! Fences: the fence floor that keeps them growing across a restore, and
//! resource-side fencing for data kept in etcd.
//!
//! A grant's fence is its key's create revision plus the fence offset in
//! force when the key was written: `<prefix>/fence-floor` holds it (absent:
//! 0), every write of a new lock entry or permit compares it (so it always
//! uses the current one) and records it in the entry (so `inspect`, `evict`
//! and the holder agree on the fence). Restoring an older snapshot moves
//! revisions back; [`raise_fence_floor`](lockcore::LockBackend::raise_fence_floor)
//! sets the offset to the floor, so every entry written afterwards has a
//! fence above it. Entries already waiting in line were written with the
//! old offset: the raise leaves a marker in each queue with waiters (put,
//! then deleted), which reaches every waiting client on its queue's watch
//! in order with the queue's other deletes; a waiter whose entry carries an
//! older offset rewrites it (same key, same create revision, so it keeps its
//! place) before it takes the lock. A client that sees a raise resumes no
//! session granted before it (a restore brings sessions back from the
//! backup, with keys only the backup remembers; see `session`).
//!
//! The fence offset as this client knows it is [`floor`]'s.

pub(crate) mod floor;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lockcore::{Fenced, FencingToken, Lease, LockError, StaleToken};

use crate::connection::client::Inner;
use crate::error::protocol;
use crate::keys::Keys;
use crate::locks::grant::Grant;

impl Inner {
    /// Sets the fence offset to at least `floor` (compare-and-set, never
    /// lower), then tells every queue with waiters.
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let key = self.keys.fence_floor();
        let offset = loop {
            let reply = self
                .txn("fence floor", Txn::new().and_then([self.floor.get()]))
                .await?;
            self.floor.learn_from(&reply)?;
            // The compare and the offset it holds at, read together: a raise
            // learned in between must not be written over with a lower one.
            let (unchanged, current) = self.floor.guard();
            if current >= floor.get() {
                break current;
            }
            let set = Txn::new().when([unchanged]).and_then([TxnOp::put(
                key.clone(),
                floor.get().to_string(),
                None,
            )]);
            if self.txn("raise the fence floor", set).await?.succeeded() {
                self.floor.raised(floor.get());
                tracing::info!(%floor, "fence floor raised");
                break floor.get();
            }
        };
        self.mark_queues(offset).await
    }

    /// Puts and deletes a marker in every queue with waiters, so each
    /// waiting client learns the offset in order with the queue's deletes.
    async fn mark_queues(&self, offset: u64) -> Result<(), LockError> {
        let (start, end) = self.keys.all();
        let reserved = [start.as_slice(), b"/"].concat();
        let everything = GetOptions::new().with_range(end).with_keys_only();
        let reply = crate::error::timed(
            self.timeout,
            "list queues",
            self.conn.kv()?.get(start.clone(), Some(everything)),
        )
        .await?;
        let mut counts: std::collections::BTreeMap<Vec<u8>, usize> = Default::default();
        for kv in reply
            .kvs()
            .iter()
            .filter(|kv| !kv.key().starts_with(&reserved))
        {
            if let Some(end) = kv.key().iter().rposition(|b| *b == b'/') {
                *counts.entry(kv.key()[..=end].to_vec()).or_default() += 1;
            }
        }
        for queue in counts.into_iter().filter(|(_, n)| *n > 1).map(|(q, _)| q) {
            let marker = Keys::floor_marker(&queue, offset);
            self.txn(
                "floor marker",
                Txn::new().and_then([TxnOp::put(marker.clone(), Vec::new(), None)]),
            )
            .await?;
            self.txn(
                "floor marker",
                Txn::new().and_then([TxnOp::delete(marker, None)]),
            )
            .await?;
        }
        Ok(())
    }

    /// See [`EtcdBackend::fenced_write`](crate::EtcdBackend::fenced_write).
    pub(crate) async fn fenced_write(
        &self,
        fence_key: impl Into<Vec<u8>>,
        token: FencingToken,
        ops: impl Into<Vec<TxnOp>>,
    ) -> Result<Fenced<TxnResponse>, LockError> {
        let (key, ops) = (fence_key.into(), ops.into());
        // Fixed-width digits: etcd compares values as bytes.
        let recorded = format!("{:020}", token.get());
        let mut write = vec![TxnOp::put(
            key.clone(),
            recorded.clone(),
            None::<PutOptions>,
        )];
        write.extend(ops);
        let first = Compare::version(key.clone(), CompareOp::Equal, 0);
        // etcd has no "less or equal": below the next token.
        let next = format!("{:020}", u128::from(token.get()) + 1);
        let not_older = Compare::value(key.clone(), CompareOp::Less, next);
        let txn = Txn::new()
            .when([first])
            .and_then(write.clone())
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([not_older])
                    .and_then(write)
                    .or_else([TxnOp::get(key.clone(), None)]),
            )]);
        let reply = self.txn("fenced write", txn).await?;
        if reply.succeeded() {
            return Ok(Ok(reply));
        }
        let nested = reply.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Txn(nested) => Some(nested),
            _ => None,
        });
        let Some(nested) = nested else {
            return Err(protocol("a fenced write reply without its branch"));
        };
        if nested.succeeded() {
            return Ok(Ok(reply));
        }
        let highest = nested
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Get(get) => get
                    .kvs()
                    .first()
                    .and_then(|kv| crate::fence::floor::parse(kv.value())),
                _ => None,
            })
            .and_then(FencingToken::new)
            .ok_or_else(|| protocol("the fence key of a refused write"))?;
        Ok(Err(StaleToken { token, highest }))
    }

    /// See [`EtcdBackend::fence_compare`](crate::EtcdBackend::fence_compare).
    pub(crate) fn fence_compare(&self, lease: &Lease) -> Compare {
        match lease.extension::<Grant>() {
            Some(grant) => {
                Compare::create_revision(grant.key.clone(), CompareOp::Equal, grant.revision)
            }
            // A lease we did not grant is no etcd grant: compare against a
            // revision that never matches (create revisions are >= 0).
            None => Compare::create_revision(self.keys.queue(lease.name()), CompareOp::Equal, -1),
        }
    }
}
