//! Renewing a batch of leases: one transaction, one statement per
//! [`RENEW_CHUNK`] leases, each lease checked on its own row and each
//! answer matched to its lease by the whole grant (kind, name, slot, owner
//! and fence), each renewal stamped on its lease's own clock, read before
//! the batch leaves.

use std::collections::HashMap;

use lockcore::backend::timed;
use lockcore::{Lease, LockError};

use super::clock;
use super::presence::Renewing;
use super::{fence_of, sql};
use crate::connection::Client;
use crate::error::{self, BACKEND};
use crate::keys::{self, Kind};

/// Leases renewed by one statement (bounds the JSON of one batch).
const RENEW_CHUNK: usize = 1000;

/// A row a renewal extended: which grant it is, and its new expiry.
#[derive(Debug)]
struct Renewed {
    kind: String,
    name: String,
    slot: i64,
    owner: String,
    expires_at: i64,
}

impl Renewed {
    /// Whether this row is `lease`'s grant: kind, name, slot and owner, not
    /// only the fence (a batch may hold a forged lease with a real fence).
    fn is(&self, lease: &Lease) -> bool {
        self.kind == Kind::of(lease).as_str()
            && self.name == lease.name().as_str()
            && self.slot == keys::slot_of(lease)
            && self.owner == lease.owner().encode()
    }
}

impl Client {
    /// Renews every lease in one transaction, [`RENEW_CHUNK`] per statement.
    pub(crate) async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let renewed = match self.open() {
            Ok(()) => timed(BACKEND, "renew", self.limit, self.renew_all(leases)).await,
            Err(e) => Err(e),
        };
        match renewed {
            Ok(results) => results,
            Err(e) => leases.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn renew_all(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Result<Lease, LockError>>, LockError> {
        // Before the clock is read: no presence file closes while a renewal
        // may be moving its expiry.
        let renewing: Vec<Option<Renewing>> = leases
            .iter()
            .map(|l| {
                self.presence
                    .as_ref()
                    .map(|p| Renewing::start(p.path(l.fence().get())))
            })
            .collect();
        let sent = Lease::send_times(leases);
        let mut tx = self.begin().await?;
        let now = self.clock.now()?;
        // Fence (unique per grant) → the row renewed under it.
        let mut renewed: HashMap<i64, Renewed> = HashMap::with_capacity(leases.len());
        for chunk in leases.chunks(RENEW_CHUNK) {
            let batch: Vec<serde_json::Value> = (chunk.iter())
                .map(|lease| {
                    serde_json::json!([
                        now.saturating_add(clock::nanos(lease.ttl().get())),
                        Kind::of(lease).as_str(),
                        lease.name().as_str(),
                        keys::slot_of(lease),
                        lease.owner().encode(),
                        fence_of(lease),
                    ])
                })
                .collect();
            let rows: Vec<(String, String, i64, String, i64, i64)> = sqlx::query_as(sql::RENEW)
                .bind(serde_json::Value::Array(batch).to_string())
                .bind(self.clock.boot_id())
                .bind(now)
                .fetch_all(&mut *tx)
                .await
                .map_err(error::map)?;
            renewed.extend(
                rows.into_iter()
                    .map(|(kind, name, slot, owner, fence, expires_at)| {
                        let row = Renewed {
                            kind,
                            name,
                            slot,
                            owner,
                            expires_at,
                        };
                        (fence, row)
                    }),
            );
        }
        tx.commit().await.map_err(error::map)?;
        let results: Vec<Result<Lease, LockError>> = (leases.iter().zip(&renewing).zip(sent))
            .map(|((lease, renewing), sent)| {
                match renewed.get(&fence_of(lease)).filter(|row| row.is(lease)) {
                    Some(row) => {
                        if let Some(renewing) = renewing {
                            renewing.extended(row.expires_at);
                        }
                        self.grants.extend(lease.fence().get(), row.expires_at);
                        Ok(lease.renewed(sent))
                    }
                    None => Err(LockError::NotHeld {
                        name: lease.name().clone(),
                    }),
                }
            })
            .collect();
        for (lease, result) in leases.iter().zip(&results) {
            if result.is_err() {
                self.forget(lease.fence().get(), Some(lease), false);
            }
        }
        Ok(results)
    }
}
