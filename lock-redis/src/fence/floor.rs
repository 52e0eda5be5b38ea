//! The fence floor: `raise_fence_floor` lifts every later fence, of every
//! name and semaphore slot, above a floor (after a restore). Each grant
//! reads its Cluster slot's floor key in the same script (`next_fence`).

use futures::StreamExt;
use lockcore::{FencingToken, LockError};

use super::RAISE_FLOOR;
use crate::connection::client::Client;
use crate::connection::script::prepare;
use crate::keys;

/// Floor keys raised by one script.
const FLOOR_CHUNK: usize = 4096;

/// On a Redis Cluster, floor scripts in flight at once (one key each).
const CLUSTER_IN_FLIGHT: usize = 256;

impl Client {
    /// Raises the fence floor of every Cluster slot to `floor` (checked
    /// against [`MAX_FENCE`](super::MAX_FENCE) by the caller).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let floor_keys: Vec<String> = (0..keys::SLOTS)
            .map(|slot| keys::floor_key(&self.prefix, slot))
            .collect();
        if self.commands.is_cluster() {
            // One slot per script: each key's own, on the primary owning it.
            let raising = futures::stream::iter(floor_keys)
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
            return Ok(());
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
}
