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

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lockcore::{Fenced, FencingToken, Lease, LockError, StaleToken};

use crate::EtcdBackend;
use crate::client::{Grant, Inner};
use crate::error::protocol;
use crate::keys::Keys;

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
}

impl EtcdBackend {
    /// The key that represents `lease`'s grant in etcd (`None` for a lease
    /// this backend did not grant).
    pub fn key_of(&self, lease: &Lease) -> Option<Vec<u8>> {
        Some(lease.extension::<Grant>()?.key.clone())
    }

    /// Runs `ops` in one etcd transaction only if `token` is not older than
    /// the last token recorded under `fence_key`, and records `token` there
    /// in the same transaction: the one vocabulary of resource-side fencing
    /// across distlock's adapters (a paused holder's late write is refused
    /// once a newer holder wrote). Equal tokens pass (one holder writes many
    /// times). `fence_key` is a key of your choosing, one per protected
    /// resource; a resource shared by a semaphore's holders is fenced per
    /// slot, with one fence key per slot (`orders/42/fence/<slot>`). `ops`
    /// must not touch `fence_key`.
    ///
    /// ```no_run
    /// # async fn demo(backend: lock_etcd::EtcdBackend, guard: lockcore::LockGuard) -> Result<(), lockcore::LockError> {
    /// use lock_etcd::etcd_client::TxnOp;
    /// let write = [TxnOp::put("orders/42/status", "shipped", None)];
    /// match backend.fenced_write("orders/42/fence", guard.fencing_token(), write).await? {
    ///     Ok(_) => println!("written"),
    ///     Err(stale) => println!("refused: a newer holder (token {}) wrote first", stale.highest),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The store's, as [`LockError`]; a write refused for its token is
    /// `Ok(Err(StaleToken))`.
    pub async fn fenced_write(
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
        let reply = self.inner.txn("fenced write", txn).await?;
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
                    .and_then(|kv| crate::floor::parse(kv.value())),
                _ => None,
            })
            .and_then(FencingToken::new)
            .ok_or_else(|| protocol("the fence key of a refused write"))?;
        Ok(Err(StaleToken { token, highest }))
    }

    /// A `Compare` that holds only while `lease`'s grant still holds the
    /// lock: the grant's key exists with the grant's create revision. Add it
    /// to your own `Txn` so a write into etcd happens only under the lock,
    /// atomically (stronger than [`fenced_write`](Self::fenced_write): a lost
    /// lock refuses the write even before anyone else took it). The
    /// transaction needs a write or a plain (linearizable) range: etcd
    /// answers a transaction of compares alone from the member's local,
    /// possibly stale, state.
    ///
    /// ```no_run
    /// # async fn demo(backend: lock_etcd::EtcdBackend, lease: lockcore::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// use etcd_client::{Txn, TxnOp};
    /// let txn = Txn::new()
    ///     .when([backend.fence_compare(&lease)])
    ///     .and_then([TxnOp::put("inventory/sku-42", "41", None)]);
    /// let applied = backend.etcd_client()?.txn(txn).await?.succeeded();
    /// // `applied == false`: the lock was lost (expired, released or evicted); nothing was written.
    /// # Ok(()) }
    /// ```
    pub fn fence_compare(&self, lease: &Lease) -> Compare {
        match lease.extension::<Grant>() {
            Some(grant) => {
                Compare::create_revision(grant.key.clone(), CompareOp::Equal, grant.revision)
            }
            // A lease we did not grant is no etcd grant: compare against a
            // revision that never matches (create revisions are >= 0).
            None => {
                Compare::create_revision(self.inner.keys.queue(lease.name()), CompareOp::Equal, -1)
            }
        }
    }
}
