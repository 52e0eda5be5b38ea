//! Where things live in ZooKeeper: lock names as path segments under the
//! root, the queue nodes and their data, and the ACLs nodes are created
//! with.

pub(crate) mod acls;
pub(crate) mod names;
pub(crate) mod paths;
