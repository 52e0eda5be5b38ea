//! What connect checks on the server: that this client may queue under the
//! lock root (its credentials), refused with a clear error otherwise.

use lockcore::LockError;
use zookeeper_client as zk;

use crate::connection::requests::{delete_node, retry};
use crate::error::{BACKEND, map};

/// Refuses a client that may not create and delete nodes under the lock
/// root (another identity's root: wrong or missing digest credentials),
/// which would fail every acquire with `NoAuth`: better said at connect.
/// The server judges: an ephemeral probe node is created and deleted.
pub(crate) async fn may_queue_under(client: &zk::Client, root: &str) -> Result<(), LockError> {
    let probe = crate::keys::paths::probe(root);
    let mode = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let checking = |e| map(format!("checking access to the lock root {root}"), e);
    let refused = match retry(|| client.create(&probe, &[], &mode)).await {
        Ok(_) | Err(zk::Error::NodeExists) => match delete_node(client, &probe).await {
            Ok(_) => return Ok(()),
            Err(zk::Error::NoAuth) => "delete",
            Err(e) => return Err(checking(e)),
        },
        Err(zk::Error::NoAuth) => "create",
        Err(e) => return Err(checking(e)),
    };
    // Digest ids carry a password hash: name users only.
    let user = |scheme: &str, id: &str| match scheme {
        "digest" => format!("digest:{}", id.split(':').next().unwrap_or_default()),
        _ => format!("{scheme}:{id}"),
    };
    let needed = zk::Permission::CREATE | zk::Permission::DELETE;
    let owners = match client.get_acl(root).await {
        Ok((acl, _)) => (acl.iter())
            .filter(|a| a.permission().has(needed))
            .map(|a| user(a.scheme(), a.id()))
            .collect::<Vec<_>>()
            .join(", "),
        Err(_) => String::new(),
    };
    let me = match client.list_auth_users().await {
        Ok(me) => me
            .iter()
            .map(|u| user(u.scheme(), u.user()))
            .collect::<Vec<_>>()
            .join(", "),
        Err(_) => String::new(),
    };
    Err(LockError::store(
        BACKEND,
        format!(
            "ZooKeeper does not let this client ({}) {refused} nodes under the lock root {root}, \
             whose ACL lets only {} create and delete there: check the digest credentials \
             (user:password; a wrong password is another identity with the same user name)",
            if me.is_empty() {
                "identity unknown"
            } else {
                &me
            },
            if owners.is_empty() { "nobody" } else { &owners },
        ),
    ))
}
