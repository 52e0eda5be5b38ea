//! The fence floor: `raise_fence_floor` lifts every later fence, of every
//! name and semaphore slot, above a floor (after a restore). Each grant
//! reads its Cluster slot's floor key in the same script (`next_fence`).

use futures::StreamExt;
use lockcore::{FencingToken, LockError};

use super::RAISE_FLOOR;
use crate::connection::client::Client;
use crate::connection::cluster::SlotOwners;
use crate::connection::script::{CROSS_SLOT, prepare, script};
use crate::keys;

/// Floor keys raised by one script.
const FLOOR_CHUNK: usize = 4096;

/// On a Redis Cluster, per-slot floor scripts in flight at once.
const CLUSTER_IN_FLIGHT: usize = 256;

script!(RAISE_FLOOR_ON_NODE = [CROSS_SLOT] include_str!("scripts/raise_floor_on_node.lua"));

impl Client {
    /// Raises the fence floor of every Cluster slot to `floor` (checked
    /// against [`MAX_FENCE`](super::MAX_FENCE) by the caller).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let floor_keys: Vec<String> = (0..keys::SLOTS)
            .map(|slot| keys::floor_key(&self.prefix, slot))
            .collect();
        if self.commands.is_cluster() {
            return self.raise_fence_floor_on_nodes(floor, floor_keys).await;
        }
        for chunk in floor_keys.chunks(FLOOR_CHUNK) {
            let mut call = prepare(&RAISE_FLOOR);
            for key in chunk {
                call.0.key(key);
            }
            call.0.arg(floor.get());
            let () = self.invoke("raise fence floor", &call).await?;
        }
        tracing::info!(%floor, "fence floor raised");
        Ok(())
    }

    /// [`raise_fence_floor`](Self::raise_fence_floor) on a Redis Cluster:
    /// one script per primary (per [`FLOOR_CHUNK`] keys) for the floor
    /// keys of the slots it serves, by `CLUSTER SLOTS`; a key it does not
    /// serve (moved, or moving), or every key of a primary that could not
    /// be asked, is raised by a script of its own slot, which the client
    /// routes through `MOVED` and `ASK`.
    async fn raise_fence_floor_on_nodes(
        &self,
        floor: FencingToken,
        floor_keys: Vec<String>,
    ) -> Result<(), LockError> {
        let mut by_slot = Vec::new();
        match self.slot_owners.get(&self.commands).await {
            None => by_slot = floor_keys,
            Some(owners) => {
                let mut by_owner: std::collections::BTreeMap<u16, Vec<String>> = Default::default();
                for (slot, key) in floor_keys.into_iter().enumerate() {
                    match owners[slot] {
                        SlotOwners::NONE => by_slot.push(key),
                        owner => by_owner.entry(owner).or_default().push(key),
                    }
                }
                let chunks: Vec<&[String]> = by_owner
                    .values()
                    .flat_map(|keys| keys.chunks(FLOOR_CHUNK))
                    .collect();
                let raised = futures::future::join_all(chunks.iter().map(|chunk| async move {
                    let mut call = prepare(&RAISE_FLOOR_ON_NODE);
                    call.0.key(&chunk[0]).arg(floor.get());
                    for key in *chunk {
                        call.0.arg(key);
                    }
                    self.invoke::<(Vec<usize>,)>("raise fence floor", &call)
                        .await
                }))
                .await;
                for (chunk, raised) in chunks.iter().zip(raised) {
                    match raised {
                        Ok((missed,)) => by_slot.extend(
                            missed
                                .into_iter()
                                .filter_map(|i| chunk.get(i.checked_sub(1)?).cloned()),
                        ),
                        Err(e) => {
                            tracing::debug!(error = %e, "fence floor script of one primary failed; raising by slot");
                            by_slot.extend(chunk.iter().cloned());
                        }
                    }
                }
            }
        }
        if !by_slot.is_empty() {
            self.slot_owners.forget();
        }
        // One slot per script: each key's own, on the primary owning it.
        let raising = futures::stream::iter(by_slot)
            .map(|key| async move {
                let mut call = prepare(&RAISE_FLOOR);
                call.0.key(&key).arg(floor.get());
                self.invoke::<()>("raise fence floor", &call).await
            })
            .buffer_unordered(CLUSTER_IN_FLIGHT);
        futures::pin_mut!(raising);
        while let Some(raised) = raising.next().await {
            raised?;
        }
        tracing::info!(%floor, "fence floor raised on every Cluster slot");
        Ok(())
    }
}
