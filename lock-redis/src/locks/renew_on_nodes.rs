//! `renew_many` on a Redis Cluster: one script per primary. A script may
//! declare keys of one slot only, and names rarely share a slot, so one
//! script per slot would be about one per lease. Instead the leases are
//! grouped by the primary that serves their slot (`CLUSTER SLOTS`, read
//! every few seconds: [`SlotOwners`](crate::connection::cluster::SlotOwners)),
//! and each group's keys are passed as arguments to a script flagged
//! `allow-cross-slot-keys` (Redis 7), routed by one of them. A key that
//! primary no longer serves (its slot moved or is moving) is reported, not
//! touched; those leases are renewed with a script of their slot, which the
//! client routes and redirects, and the slot owners are read again.

use lockcore::backend::Moment;
use lockcore::{Lease, LockError};

use super::value::lease_value;
use super::{IS_LEASE, RENEW_ONE};
use crate::connection::client::Client;
use crate::connection::cluster::SlotOwners;
use crate::connection::script::{CROSS_SLOT, prepare, script};
use crate::keys;
use crate::permits::SLOTS;

script!(RENEW_ON_NODE = [CROSS_SLOT, IS_LEASE, SLOTS, RENEW_ONE] include_str!("scripts/renew_on_node.lua"));

/// What one primary's script said of one lease.
enum Renewal {
    Done(Result<Lease, LockError>),
    /// Not served there: renew it by its slot.
    Elsewhere,
}

impl Client {
    /// [`renew_many`](Client::renew_many) on a Redis Cluster (see the module).
    pub(crate) async fn renew_on_nodes(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        let mut results: Vec<Option<Result<Lease, LockError>>> = vec![None; leases.len()];
        let mut elsewhere: Vec<usize> = Vec::new();
        match self.slot_owners.get(&self.commands).await {
            None => elsewhere.extend(0..leases.len()),
            Some(owners) => {
                let mut by_owner: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
                for (i, lease) in leases.iter().enumerate() {
                    let slot = keys::key_slot(&self.keys(lease.name()).lock);
                    match owners[usize::from(slot)] {
                        SlotOwners::NONE => elsewhere.push(i),
                        owner => by_owner.entry(owner).or_default().push(i),
                    }
                }
                let groups = super::chunked(by_owner.into_values());
                let renewed = futures::future::join_all(
                    groups.iter().map(|group| self.renew_on_node(leases, group)),
                )
                .await;
                for (group, outcomes) in groups.iter().zip(renewed) {
                    for (&i, outcome) in group.iter().zip(outcomes) {
                        match outcome {
                            Renewal::Done(result) => results[i] = Some(result),
                            Renewal::Elsewhere => elsewhere.push(i),
                        }
                    }
                }
            }
        }
        if !elsewhere.is_empty() {
            self.slot_owners.forget();
            let moved: Vec<Lease> = elsewhere.iter().map(|&i| leases[i].clone()).collect();
            let renewed = self.renew_by_slot(&moved).await;
            for (&i, result) in elsewhere.iter().zip(renewed) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(crate::error::unexpected("a lease was not renewed"))))
            .collect()
    }

    /// One primary's script for the leases at `group` of `leases`. A
    /// failed request sends them all to their slots' scripts (the
    /// primary may be gone, or may not know the flag: Redis before 7).
    async fn renew_on_node(&self, leases: &[Lease], group: &[usize]) -> Vec<Renewal> {
        let mut call = prepare(&RENEW_ON_NODE);
        for (n, &i) in group.iter().enumerate() {
            let lease = &leases[i];
            // Only kept kinds get here (`renew_many`).
            let Some((key, holders, slot)) = self.renewal(lease) else {
                continue;
            };
            if n == 0 {
                call.0.key(&key);
            }
            call.0.arg(key).arg(holders).arg(lease_value(lease));
            call.0.arg(lease.ttl().as_millis_ceil()).arg(slot);
        }
        // Each lease on its own clock, read before the request leaves.
        let sent: Vec<Moment> = group.iter().map(|&i| leases[i].now()).collect();
        let codes = match self.invoke::<Vec<i64>>("renew", &call).await {
            Ok(codes) if codes.len() == group.len() => codes,
            Ok(codes) => {
                let e = crate::error::unexpected(format!(
                    "renew answered {} results for {} leases",
                    codes.len(),
                    group.len()
                ));
                return group
                    .iter()
                    .map(|_| Renewal::Done(Err(e.clone())))
                    .collect();
            }
            Err(e) => {
                tracing::debug!(error = %e, "renewal script of one primary failed; renewing by slot");
                return group.iter().map(|_| Renewal::Elsewhere).collect();
            }
        };
        group
            .iter()
            .zip(sent)
            .zip(codes)
            .map(|((&i, sent_at), code)| match code {
                1 => Renewal::Done(Ok(leases[i].renewed(sent_at))),
                -1 => Renewal::Elsewhere,
                _ => Renewal::Done(Err(LockError::NotHeld {
                    name: leases[i].name().clone(),
                })),
            })
            .collect()
    }
}
