//! Resource-side fencing for data kept in Redis: a write carrying a fencing
//! token older than the newest one applied is refused, in the same atomic
//! step as the write.

use lockcore::{Fenced, FencingToken, LockError, StaleToken};
use redis::{Arg, FromRedisValue, Value};

use super::FENCED_WRITE;
use crate::connection::commands;
use crate::error;

/// Runs `command` on `con` only if `token` is not older than the last token
/// applied through `fence_key`, and then records `token` there, all in one
/// script: no other client's write can slip between the check and the write.
///
/// Equal tokens pass (one holder writes many times); older ones get
/// [`StaleToken`], the refusal of every fenced write in distlock. `fence_key`
/// is a key of your choosing, one per protected resource; a resource shared
/// by a semaphore's holders is fenced per slot, with one fence key per slot
/// (`{jobs}:fence:<slot>`). On Redis Cluster, give the fence key and the
/// keys `command` touches one hash tag (`{order:42}:fence`, `{order:42}:data`).
///
/// ```no_run
/// # async fn example(con: &mut redis::aio::ConnectionManager, guard: &lockcore::LockGuard) -> Result<(), lockcore::LockError> {
/// use lock_redis::fenced_write;
///
/// let write = redis::cmd("HSET").arg("{order:42}").arg("status").arg("shipped").clone();
/// match fenced_write::<i64, _>(con, "{order:42}:fence", guard.fencing_token(), &write).await? {
///     Ok(_) => println!("written"),
///     Err(stale) => println!("refused: a newer holder (token {}) wrote first", stale.highest),
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::InvalidConfig`] for an empty command; the command's own
/// error (nothing is written then, the fence included); transport errors as
/// [`LockError::Unavailable`]. A reply that does not echo this call's nonce
/// (a connection that lost a reply) is `Unavailable` too: drop that
/// connection.
pub async fn fenced_write<T, C>(
    con: &mut C,
    fence_key: &str,
    token: FencingToken,
    command: &redis::Cmd,
) -> Result<Fenced<T>, LockError>
where
    T: FromRedisValue,
    C: redis::aio::ConnectionLike,
{
    if command.args_iter().len() == 0 {
        return Err(LockError::config("fenced_write needs a command to run"));
    }
    let nonce = commands::nonce();
    let mut invocation = FENCED_WRITE.prepare_invoke();
    invocation.key(fence_key).arg(&nonce).arg(token.get());
    for arg in command.args_iter() {
        match arg {
            Arg::Simple(bytes) => invocation.arg(bytes),
            _ => {
                return Err(LockError::config(
                    "fenced_write cannot run a command with a cursor argument",
                ));
            }
        };
    }
    let reply: Value = invocation.invoke_async(con).await.map_err(error::map)?;
    let reply =
        commands::echoed(&nonce, reply).ok_or_else(|| commands::mismatch("fenced write"))?;
    let bad = |e: redis::ParsingError| error::unexpected(format!("fenced write reply: {e}"));
    let (applied, reply): (i64, Value) = FromRedisValue::from_redis_value(reply).map_err(bad)?;
    if applied == 1 {
        return T::from_redis_value(reply).map(Ok).map_err(bad);
    }
    let last: String = String::from_redis_value(reply).map_err(bad)?;
    let highest = last
        .parse()
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| error::unexpected(format!("fence key holds {last:?}")))?;
    Ok(Err(StaleToken { token, highest }))
}
