//! Resource-side fencing for data kept in ZooKeeper: a write carrying a
//! fencing token older than the newest one applied is refused, in the same
//! transaction as the write.

use lockcore::{Fenced, FencingToken, LockError, StaleToken};
use zookeeper_client as zk;

use crate::connection::requests::ATTEMPTS;
use crate::error::{BACKEND, connection_lost, map};

/// Applies the operations `write` adds to a ZooKeeper multi only if `token`
/// is not older than the last token applied through `fence_node`, and
/// records `token` there, in one transaction: the fence node's version is
/// checked by the same multi, so no other writer slips between the check
/// and the write.
///
/// Equal tokens pass (one holder writes many times); older ones get
/// [`StaleToken`], the refusal of every fenced write in distlock.
/// `fence_node` is a node of your choosing, one per protected resource,
/// holding the newest token as decimal text (created open, `anyone` may
/// write, if missing: create it yourself first with the ACL you want). A
/// resource shared by a semaphore's holders is fenced per slot, with one
/// fence node per slot (`/app/jobs/fence-<slot>`).
///
/// ```no_run
/// # async fn example(backend: &lock_zookeeper::ZooKeeperBackend, guard: &lockcore::LockGuard) -> Result<(), lockcore::LockError> {
/// use lock_zookeeper::{fenced_write, zk};
///
/// let client = backend.client()?;
/// let written = fenced_write(&client, "/app/orders/42-fence", guard.fencing_token(), |multi| {
///     multi.add_set_data("/app/orders/42", b"shipped", None)
/// })
/// .await?;
/// match written {
///     Ok(_) => println!("written"),
///     Err(stale) => println!("refused: a newer holder (token {}) wrote first", stale.highest),
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// An operation of `write` that fails fails the whole transaction (nothing
/// is written, the fence included): [`LockError::Store`] naming it.
/// [`LockError::Unavailable`] when the connection broke before the reply: the
/// transaction may or may not have been applied (a retry with the same token
/// passes the fence again). [`LockError::Store`] when `fence_node` holds
/// something that is not a token.
pub async fn fenced_write<F>(
    client: &zk::Client,
    fence_node: &str,
    token: FencingToken,
    write: F,
) -> Result<Fenced<Vec<zk::MultiWriteResult>>, LockError>
where
    F: Fn(&mut zk::MultiWriter<'_>) -> Result<(), zk::Error>,
{
    let failed = |e| map(format!("fenced write through {fence_node}"), e);
    for _ in 0..ATTEMPTS {
        let version = match client.get_data(fence_node).await {
            Ok((data, stat)) => {
                let highest = parse(fence_node, &data)?;
                if token < highest {
                    return Ok(Err(StaleToken { token, highest }));
                }
                Some(stat.version)
            }
            Err(zk::Error::NoNode) => None,
            Err(e) if connection_lost(&e) => continue,
            Err(e) => return Err(failed(e)),
        };
        let mut multi = client.new_multi_writer();
        let recorded = token.get().to_string();
        let fenced = match version {
            Some(version) => multi.add_set_data(fence_node, recorded.as_bytes(), Some(version)),
            None => {
                let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                multi.add_create(fence_node, recorded.as_bytes(), &open)
            }
        };
        fenced.map_err(|e| {
            LockError::config_caused_by(format!("fence node {fence_node:?} is not a valid path"), e)
        })?;
        write(&mut multi).map_err(|e| {
            LockError::config_caused_by("fenced_write: an operation could not be added", e)
        })?;
        match multi.commit().await {
            Ok(mut results) => {
                results.remove(0);
                return Ok(Ok(results));
            }
            // Another writer moved the fence since it was read: read again.
            Err(zk::MultiWriteError::OperationFailed {
                index: 0,
                source: zk::Error::BadVersion | zk::Error::NodeExists | zk::Error::NoNode,
            }) => continue,
            Err(zk::MultiWriteError::OperationFailed { index: 0, source }) => {
                return Err(failed(source));
            }
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                return Err(map(
                    format!(
                        "fenced write through {fence_node}: operation {} failed",
                        index - 1
                    ),
                    source,
                ));
            }
            Err(zk::MultiWriteError::RequestFailed { source }) => return Err(failed(source)),
        }
    }
    Err(LockError::unavailable(
        BACKEND,
        format!("the fence {fence_node} kept changing under the write"),
    ))
}

fn parse(fence_node: &str, data: &[u8]) -> Result<FencingToken, LockError> {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .and_then(FencingToken::new)
        .ok_or_else(|| {
            LockError::store(
                BACKEND,
                format!(
                    "fence node {fence_node} holds {:?}, not a fencing token",
                    String::from_utf8_lossy(data)
                ),
            )
        })
}
