//! ACLs of the nodes this backend creates: open, or (with digest
//! credentials) owned by that identity.

use zookeeper_client as zk;

/// ACLs for the lock root and lock parents, and for the queue nodes.
#[derive(Debug, Clone)]
pub(crate) struct Acls {
    pub(crate) dirs: Vec<zk::Acl>,
    pub(crate) nodes: Vec<zk::Acl>,
}

impl Acls {
    /// Open ACLs, or (with digest credentials) nodes only this identity may
    /// touch under parents everyone may read but only it may change.
    pub(crate) fn new(digest: bool) -> Acls {
        if digest {
            Acls {
                dirs: vec![
                    zk::Acl::new(zk::Permission::ALL, zk::AuthId::authed()),
                    zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()),
                ],
                nodes: zk::Acls::creator_all().to_vec(),
            }
        } else {
            Acls {
                dirs: zk::Acls::anyone_all().to_vec(),
                nodes: zk::Acls::anyone_all().to_vec(),
            }
        }
    }
}
