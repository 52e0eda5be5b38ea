//! Semaphores: `permits` slots under `<prefix>/permits/<name>/`, each a key
//! `slot/<i>` taken by one `Txn` that puts it only if it does not exist
//! (attached to the holder's session, like a lock entry; its create
//! revision is the slot's fence), and only if the semaphore's agreed number
//! of permits (`count`, written once, by the first holder) is the one asked
//! for. With no slot taken, a request with another number rewrites it.
//! Waiters follow the slots' deletes on the shared watch (`wait::watch`).

use std::collections::BTreeSet;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use lockcore::backend::LockRequest;
use lockcore::{Attempt, Holder, LockError, LockName, OwnerToken};

use crate::connection::client::Inner;
use crate::keys::record::Record;
use crate::keys::{Keys, empty, range_end};
use crate::locks::grant::InFlight;

/// Tries per attempt: each miss shows which slots are taken.
const TRIES: usize = 8;

/// What a miss showed of the semaphore.
struct Seen {
    /// The agreed number of permits (`None`: none agreed yet).
    count: Option<u32>,
    taken: BTreeSet<u32>,
}

impl Inner {
    pub(crate) async fn try_acquire_permit(
        self: &Arc<Self>,
        request: &LockRequest,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        lockcore::backend::check_permits(request.name(), permits)?;
        let semaphore = self.keys.semaphore(request.name());
        let (count_key, slots) = (Keys::permit_count(&semaphore), Keys::slots(&semaphore));
        let ttl = request.ttl().get();
        // Expect the common case: the count agreed, slot 0 free.
        let mut seen = Seen {
            count: Some(permits),
            taken: BTreeSet::new(),
        };
        for _ in 0..TRIES {
            let agreed = match seen.count {
                Some(count) if count == permits => true,
                // No slot taken: the count may change.
                _ if seen.taken.is_empty() => false,
                Some(existing) => {
                    return Err(LockError::PermitsMismatch {
                        name: request.name().clone(),
                        requested: permits,
                        existing,
                    });
                }
                // Slots without a count (an operator's doing): adopt ours.
                None => false,
            };
            let Some(slot) = (0..permits).find(|i| !seen.taken.contains(i)) else {
                return Ok(Attempt::Held { expires_in: None });
            };
            let using = self.sessions.for_entry(ttl).await?;
            let (session, refreshed) = (&using.session, using.refreshed);
            let key = Keys::slot(&slots, slot);
            let (floor, offset) = self.floor.guard();
            let record = Record::new(OwnerToken::new(), offset, request.label());
            let value: Arc<[u8]> = record.encode().into();
            let put = TxnOp::put(
                key.clone(),
                value.to_vec(),
                Some(PutOptions::new().with_lease(session.id)),
            );
            let free = Compare::create_revision(key.clone(), CompareOp::Equal, 0);
            let count = permits.to_string();
            let txn = if agreed {
                Txn::new()
                    .when([
                        Compare::value(count_key.clone(), CompareOp::Equal, count),
                        free,
                        floor,
                    ])
                    .and_then([put])
            } else {
                // Agree on the count: only while nobody holds a slot.
                let unchanged = match seen.count {
                    Some(old) => {
                        Compare::value(count_key.clone(), CompareOp::Equal, old.to_string())
                    }
                    None => Compare::version(count_key.clone(), CompareOp::Equal, 0),
                };
                Txn::new()
                    .when([unchanged, empty(&slots), free, floor])
                    .and_then([TxnOp::put(count_key.clone(), count, None), put])
            }
            .or_else([
                TxnOp::get(count_key.clone(), None),
                TxnOp::get(
                    slots.clone(),
                    Some(
                        GetOptions::new()
                            .with_range(range_end(&slots))
                            .with_keys_only(),
                    ),
                ),
                self.floor.get(),
            ]);
            let mut in_flight = InFlight::entry(self, session.id, &key, &value);
            let reply = tokio::time::timeout(self.timeout, self.conn.kv()?.txn(txn)).await;
            in_flight.answered();
            let Some(reply) = self.written(reply, session.id, "permit acquire")? else {
                continue; // the session was gone: a new one
            };
            if reply.succeeded() {
                let revision = reply.header().map_or(0, |h| h.revision());
                tracing::debug!(name = %request.name(), slot, revision, "permit acquired");
                return self
                    .grant_held(
                        request, &record, session.id, key, revision, value, refreshed, None,
                    )
                    .map(|lease| Attempt::Acquired(lease.with_slot(slot)));
            }
            self.floor.learn_from(&reply)?;
            seen = Seen::of(&reply.op_responses(), &slots);
        }
        // The slots kept changing under us: a busy semaphore.
        Ok(Attempt::Held { expires_in: None })
    }

    pub(crate) async fn inspect_permits(&self, name: &LockName) -> Result<Vec<Holder>, LockError> {
        let slots = Keys::slots(&self.keys.semaphore(name));
        let mut holders: Vec<Holder> = self
            .holders_under(&slots, "inspect permits", |key| Keys::slot_of(&slots, key))
            .await?
            .into_iter()
            .map(|(slot, holder)| holder.with_slot(slot))
            .collect();
        holders.sort_by_key(|h| h.slot);
        Ok(holders)
    }
}

impl Seen {
    /// The count and the taken slots from a miss's reads.
    fn of(responses: &[TxnOpResponse], slots: &[u8]) -> Seen {
        let mut ranges = responses.iter().filter_map(|r| match r {
            TxnOpResponse::Get(get) => Some(get.kvs()),
            _ => None,
        });
        let count = ranges
            .next()
            .and_then(|kvs| kvs.first())
            .and_then(|kv| kv.value_str().ok()?.parse().ok());
        let taken = ranges
            .next()
            .map(|kvs| {
                kvs.iter()
                    .filter_map(|kv| Keys::slot_of(slots, kv.key()))
                    .collect()
            })
            .unwrap_or_default();
        Seen { count, taken }
    }
}
