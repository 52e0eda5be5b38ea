//! Resource-side fencing for data kept in etcd itself: a compare that holds
//! only while a grant still holds its lock, for the caller's own `Txn`.

use etcd_client::{Compare, CompareOp};
use lockcore::Lease;

use crate::EtcdBackend;
use crate::client::Grant;

impl EtcdBackend {
    /// The key that represents `lease`'s grant in etcd (`None` for a lease
    /// this backend did not grant).
    pub fn key_of(&self, lease: &Lease) -> Option<Vec<u8>> {
        Some(lease.extension::<Grant>()?.key.clone())
    }

    /// A `Compare` that holds only while `lease`'s grant still holds the
    /// lock: the grant's key exists with the grant's create revision. Add it to your own `Txn` so a write into etcd happens
    /// only under the lock (resource-side fencing, done atomically by etcd).
    /// The transaction needs a write or a plain (linearizable) range: etcd
    /// answers a transaction of compares alone from the member's local,
    /// possibly stale, state.
    ///
    /// ```no_run
    /// # async fn demo(backend: lock_etcd::EtcdBackend, lease: lockcore::Lease) -> Result<(), etcd_client::Error> {
    /// use etcd_client::{Txn, TxnOp};
    /// let txn = Txn::new()
    ///     .when([backend.fence_compare(&lease)])
    ///     .and_then([TxnOp::put("inventory/sku-42", "41", None)]);
    /// let applied = backend.etcd_client().txn(txn).await?.succeeded();
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
