//! Fences: the fence floor of a lock root (raised after a restore, so
//! fences never go back), and fenced writes to data kept in ZooKeeper.

pub(crate) mod floor;
pub(crate) mod write;

use lockcore::{FencingToken, LockError};

use crate::connection::Client;
use crate::error::map;

impl Client {
    /// Raises the fence floor of this client's lock root (see
    /// [`crate::fence::floor`]).
    pub(crate) async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.capabilities().check_fence_floor(floor)?;
        let live = self.live().await?;
        let raising = |e| {
            map(
                format!("raising the fence floor of {}", self.config.root),
                e,
            )
        };
        crate::fence::floor::raise(
            &live.session.client().map_err(raising)?,
            &self.config.root,
            &self.acls.dirs,
            floor,
        )
        .await
    }
}
