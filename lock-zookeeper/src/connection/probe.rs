//! What connect checks on the server: that this client may queue under the
//! lock root (its credentials), refused with a clear error otherwise; and
//! whether the servers keep TTL nodes, which `set_remaining` needs.

use std::time::Duration;

use lockcore::LockError;
use zookeeper_client as zk;

use crate::connection::requests::{ATTEMPTS, delete_node, retry};
use crate::error::{BACKEND, connection_lost, map};

/// Refuses a client that may not create and delete nodes under the lock
/// root (another identity's root: wrong or missing digest credentials),
/// which would fail every acquire with `NoAuth`: better said at connect.
/// The server judges: an ephemeral probe node is created and deleted.
/// `sasl`: whether the credentials are SASL's (the advice differs).
pub(crate) async fn may_queue_under(
    client: &zk::Client,
    root: &str,
    sasl: bool,
) -> Result<(), LockError> {
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
             whose ACL lets only {} create and delete there: {}",
            if me.is_empty() {
                "identity unknown"
            } else {
                &me
            },
            if owners.is_empty() { "nobody" } else { &owners },
            match sasl {
                true => "check the SASL credentials (user and password)",
                false =>
                    "check the digest credentials \
                          (user:password; a wrong password is another identity with the same user name)",
            },
        ),
    ))
}

/// How long a TTL probe node lives if its delete never comes (the client
/// died between the two): the servers delete it then.
const PROBE_TTL: Duration = Duration::from_secs(1);

/// Whether the servers keep TTL nodes (`zookeeper.extendedTypesEnabled=true`),
/// which a lease kept by `set_remaining` is (see [`crate::locks::remaining`]):
/// a TTL probe node is created and deleted, both sent at once (one round
/// trip). `false`, said in one log line, when the servers refuse it.
pub(crate) async fn keeps_ttl_nodes(client: &zk::Client, root: &str) -> Result<bool, LockError> {
    let probe = crate::keys::paths::probe(root);
    let mode = zk::CreateMode::Persistent
        .with_acls(zk::Acls::anyone_all())
        .with_ttl(PROBE_TTL);
    let mut last = zk::Error::ConnectionLoss;
    for _ in 0..ATTEMPTS {
        let created = client.create(&probe, &[], &mode);
        let deleted = client.delete(&probe, None);
        let (created, _) = (created.await, deleted.await);
        match created {
            Ok(_) | Err(zk::Error::NodeExists) => return Ok(true),
            Err(e @ (zk::Error::Unimplemented | zk::Error::BadArguments(_))) => {
                tracing::info!(root, error = %e, "{NO_TTL_NODES}");
                return Ok(false);
            }
            // A probe created unseen goes at its TTL.
            Err(e) if connection_lost(&e) => last = e,
            Err(e) => {
                return Err(map(
                    format!("checking whether ZooKeeper keeps TTL nodes under {root}"),
                    e,
                ));
            }
        }
    }
    Err(map(
        format!("checking whether ZooKeeper keeps TTL nodes under {root}"),
        last,
    ))
}

/// What a client of servers without TTL nodes cannot do, and the setting
/// that turns them on.
pub(crate) const NO_TTL_NODES: &str = "ZooKeeper refuses TTL nodes (its servers run without \
    -Dzookeeper.extendedTypesEnabled=true): set_remaining is unsupported, and with it jobs' \
    at_least and LockGuard::release_no_sooner_than";
