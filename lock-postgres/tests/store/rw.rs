//! Reader-writer locks on PostgreSQL, one idea per module: where they
//! live in the store (`layout`), what keeps holders apart and fences
//! growing (`safety`), and waiting, writer intents included (`waiting`).
//! The helpers below are theirs.

mod layout;
mod safety;
mod waiting;

use std::time::Duration;

use lock_postgres::PostgresBackend;
use lockcore::backend::LockRequest;
use lockcore::{Access, Attempt, Lease, LockBackend, LockName, Locker};

/// A request for `access` of the reader-writer lock `name`.
pub(crate) fn request(
    client: &PostgresBackend,
    name: &LockName,
    ttl: Duration,
    access: Access,
) -> LockRequest {
    let ttl = client.capabilities().effective_ttl(ttl).unwrap();
    LockRequest::new(name.clone(), ttl).with_access(access)
}

/// One attempt at `access` of `name`, no waiting.
pub(crate) async fn attempt(
    client: &PostgresBackend,
    name: &LockName,
    ttl: Duration,
    access: Access,
) -> Attempt {
    client
        .try_acquire(&request(client, name, ttl, access))
        .await
        .expect("try_acquire")
}

/// `access` of `name`, which must be free for it.
pub(crate) async fn taken(
    client: &PostgresBackend,
    name: &LockName,
    ttl: Duration,
    access: Access,
) -> Lease {
    match attempt(client, name, ttl, access).await {
        Attempt::Acquired(lease) => lease,
        held => panic!("the {access} of {name}: {held:?}"),
    }
}

/// A locker on `client` whose leases last `ttl`.
pub(crate) fn locker(client: &PostgresBackend, ttl: Duration) -> Locker {
    Locker::new(client.clone()).ttl(ttl)
}
