//! Resource-side fencing for data kept in Redis: a write carrying a fencing
//! token older than the newest one applied is refused, in the same atomic
//! step as the write.

use lockcore::{FencingToken, LockError};
use redis::{Arg, FromRedisValue, Value};

use crate::{connection, error, scripts};

/// The outcome of [`fenced_apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced<T> {
    /// The write ran; this is the command's reply.
    Applied(T),
    /// A newer holder already wrote: the write did not run.
    Stale {
        /// The newest token applied to this resource.
        last: u64,
    },
}

impl<T> Fenced<T> {
    /// The reply, if the write ran.
    pub fn applied(self) -> Option<T> {
        match self {
            Fenced::Applied(reply) => Some(reply),
            Fenced::Stale { .. } => None,
        }
    }
}

/// Runs `command` on `con` only if `token` is not older than the last token
/// applied through `fence_key`, and then records `token` there, all in one
/// script: no other client's write can slip between the check and the write.
///
/// Equal tokens pass (one holder writes many times); older ones get
/// [`Fenced::Stale`]. `fence_key` is a key of your choosing, one per
/// protected resource. On Redis Cluster, give it and the keys `command`
/// touches one hash tag (`{order:42}:fence`, `{order:42}:data`).
///
/// ```no_run
/// # async fn example(con: &mut redis::aio::ConnectionManager, guard: &lockcore::LockGuard) -> Result<(), lockcore::LockError> {
/// use lock_redis::{Fenced, fenced_apply};
///
/// let write = redis::cmd("HSET").arg("{order:42}").arg("status").arg("shipped").clone();
/// match fenced_apply::<i64, _>(con, "{order:42}:fence", guard.fencing_token(), &write).await? {
///     Fenced::Applied(_) => println!("written"),
///     Fenced::Stale { last } => println!("refused: a newer holder (token {last}) wrote first"),
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
pub async fn fenced_apply<T, C>(
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
        return Err(LockError::config("fenced_apply needs a command to run"));
    }
    let nonce = connection::nonce();
    let mut invocation = scripts::FENCED_APPLY.prepare_invoke();
    invocation.key(fence_key).arg(&nonce).arg(token.get());
    for arg in command.args_iter() {
        match arg {
            Arg::Simple(bytes) => invocation.arg(bytes),
            _ => {
                return Err(LockError::config(
                    "fenced_apply cannot run a command with a cursor argument",
                ));
            }
        };
    }
    let reply: Value = invocation.invoke_async(con).await.map_err(error::map)?;
    let reply =
        connection::echoed(&nonce, reply).ok_or_else(|| connection::mismatch("fenced write"))?;
    let (applied, reply): (i64, Value) = FromRedisValue::from_redis_value(reply)
        .map_err(|e| error::unexpected(format!("fenced write reply: {e}")))?;
    if applied == 1 {
        T::from_redis_value(reply)
            .map(Fenced::Applied)
            .map_err(|e| error::unexpected(format!("fenced write reply: {e}")))
    } else {
        let last: String = String::from_redis_value(reply)
            .map_err(|e| error::unexpected(format!("fenced write reply: {e}")))?;
        let last = last
            .parse()
            .map_err(|_| error::unexpected(format!("fence key holds {last:?}")))?;
        Ok(Fenced::Stale { last })
    }
}
