//! Reader-writer locks on Redis: their keys, apart from the lock and the
//! semaphore of the same name, one fence counter above the floor, a lost
//! grant reply given back, shares renewed in the one batch script with
//! locks and permits (`shares.rs`); a waiting writer's intent in the store,
//! refreshed while it waits, gone with its grant or when it stops waiting,
//! lapsing on the server's clock when its process is cut off (`intents.rs`).

mod intents;
mod shares;

use std::time::Duration;

use lock_redis::RedisBackend;
use lock_redis::redis::{self, AsyncCommands};
use lockcore::backend::LockRequest;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Access, Attempt, HolderLabel, Lease, LockBackend, LockError, LockName};
use tokio::time::Instant;

use crate::support::LONG;

/// A request for `access` to `name`, labelled `reader` or `writer`.
fn request(backend: &RedisBackend, name: &LockName, access: Access, ttl: Duration) -> LockRequest {
    LockRequest::new(
        name.clone(),
        backend.capabilities().effective_ttl(ttl).unwrap(),
    )
    .with_label(
        HolderLabel::new(match access {
            Access::Read => "reader",
            Access::Write => "writer",
        })
        .unwrap(),
    )
    .with_access(access)
}

/// `access` to `name` at once (it must be admitted).
async fn share(backend: &RedisBackend, name: &LockName, access: Access, ttl: Duration) -> Lease {
    match backend
        .try_acquire(&request(backend, name, access, ttl))
        .await
        .unwrap()
    {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => panic!("{access} of {name} should be granted"),
    }
}

/// Whether one attempt at `access` to `name` is refused (a grant is
/// released at once).
async fn refused(backend: &RedisBackend, name: &LockName, access: Access) -> bool {
    match backend
        .try_acquire(&request(backend, name, access, LONG))
        .await
        .unwrap()
    {
        Attempt::Acquired(lease) => {
            backend.release(&lease).await.unwrap();
            false
        }
        Attempt::Held { .. } => true,
    }
}

/// The shares key of `name`; the others add a suffix to it.
fn base(name: &LockName) -> String {
    format!("distlock:{{{}}}:rw", name.as_str())
}

/// The waiting writers' intents of `name`, as the server has them.
async fn intents(con: &redis::aio::MultiplexedConnection, name: &LockName) -> Vec<String> {
    con.clone()
        .zrange(format!("{}:intents", base(name)), 0, -1)
        .await
        .unwrap()
}

/// A writer waiting for `name` (up to `wait`) on a task of its own.
fn writer_waits(
    backend: &RedisBackend,
    name: &LockName,
    ttl: Duration,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<Option<Lease>, LockError>> {
    let backend = backend.clone();
    let request = request(&backend, name, Access::Write, ttl);
    tokio::spawn(async move {
        let policy = WaitPolicy::new(Instant::now() + wait);
        backend.acquire(&request, &policy).await
    })
}
