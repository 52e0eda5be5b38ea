#![doc = include_str!("../README.md")]
mod backend;
mod config;
mod connection;
mod error;
mod fence;
mod keys;
mod locks;
mod permits;
mod rw;
mod wait;

pub use backend::ZooKeeperBackend;
pub use config::ZooKeeperConfig;
pub use fence::write::fenced_write;
/// The ZooKeeper client this backend is built on, re-exported so callers use
/// the same version (see [`ZooKeeperBackend::client`]).
pub use zookeeper_client as zk;

/// Items for this crate's own tests, not part of its API: they may change
/// in any release.
#[doc(hidden)]
pub mod testing {
    pub use crate::keys::names::decode_segment;

    /// `lease` carrying the grant of `from` (the node this backend granted
    /// it): a lease rebuilt around a real grant with another name, owner,
    /// fence or access, which must act on nothing.
    pub fn with_grant_of(lease: lockcore::Lease, from: &lockcore::Lease) -> lockcore::Lease {
        use std::sync::Arc;

        use crate::locks::held::Held;
        match from.extension::<Arc<Held>>() {
            Some(held) => lease.with_extension(held.clone()),
            None => lease,
        }
    }
}
