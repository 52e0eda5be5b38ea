//! The fence floor: `raise_fence_floor` lifts every later fence, of every
//! name and semaphore slot, above a floor (after a restore). Each grant
//! reads its Cluster slot's floor key in the same script (`next_fence`).

use lockcore::{FencingToken, LockError};

use super::RAISE_FLOOR;
use crate::connection::client::Client;
use crate::connection::script::prepare;
use crate::keys;

/// Floor keys raised by one script.
const FLOOR_CHUNK: usize = 4096;

impl Client {
    /// Raises the fence floor of every Cluster slot to `floor` (checked
    /// against [`MAX_FENCE`](super::MAX_FENCE) by the caller).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        let floor_keys: Vec<String> = (0..keys::SLOTS)
            .map(|slot| keys::floor_key(&self.prefix, slot))
            .collect();
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
