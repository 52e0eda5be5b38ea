//! The command connection, and the one rule that keeps replies honest: every
//! script echoes a per-request nonce, and a connection that timed out or
//! returned someone else's reply is replaced, never reused.
//!
//! A multiplexed connection matches replies to requests by order. TCP never
//! loses a reply, but a middlebox or a bug that did would shift every later
//! reply onto the wrong request: an acquire of one name could read the
//! grant of another. The nonce turns that into an error instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use lockcore::LockError;
use redis::aio::ConnectionManager;
use redis::{ErrorKind, FromRedisValue, ScriptInvocation, ServerErrorKind, Value};

use super::con::{Con, Opener};
use super::target::{self, Target};
use crate::error::{self, BACKEND};

/// A process-wide counter: nonces are unique among the requests any
/// connection of this process has in flight.
static NONCE: AtomicU64 = AtomicU64::new(1);

/// A fresh request nonce.
pub(crate) fn nonce() -> String {
    NONCE.fetch_add(1, Ordering::Relaxed).to_string()
}

/// The connection lock commands go through, replaced after a timeout or a
/// mismatched reply, and gone once the client is closed.
pub(crate) struct Commands {
    target: Arc<Target>,
    opener: Opener,
    timeout: Duration,
    current: RwLock<Current>,
    /// For a Cluster, the connection [`for_caller`](Self::for_caller)
    /// hands out: to the first node given.
    caller: Option<ConnectionManager>,
}

/// The connection in use, its generation, whether this client opened it (a
/// caller's own connection, `RedisConfig::connection`, is only dropped at
/// close, never ended for the caller), and whether the client is closed.
struct Current {
    generation: u64,
    con: Con,
    /// The server `con` connects to (it moves with Sentinel).
    to: redis::ConnectionAddr,
    ours: bool,
    closed: bool,
}

impl Commands {
    /// Commands over `con`, which this client opened if `ours`; `opener`
    /// opens its replacements. For a Cluster, `caller` is what
    /// [`for_caller`](Self::for_caller) hands out.
    pub(crate) fn new(
        target: Arc<Target>,
        opener: Opener,
        timeout: Duration,
        (con, ours): (Con, bool),
        caller: Option<ConnectionManager>,
    ) -> Self {
        Commands {
            opener,
            caller,
            timeout,
            current: RwLock::new(Current {
                generation: 0,
                to: target.client().get_connection_info().addr().clone(),
                con,
                ours,
                closed: false,
            }),
            target,
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Current> {
        // Every update under this lock is a plain assignment.
        self.current.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The current connection and its generation; `None` once closed.
    pub(crate) fn get(&self) -> Option<(u64, Con)> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        (!current.closed).then(|| (current.generation, current.con.clone()))
    }

    /// The connection for the caller's own commands: the current one, or
    /// once the client is closed, a new one that is the caller's alone,
    /// connected on first use. For a Cluster, a connection to the first
    /// node given (see [`for_caller_cluster`](Self::for_caller_cluster)).
    pub(crate) fn for_caller(&self) -> ConnectionManager {
        if let Some(caller) = &self.caller {
            return caller.clone();
        }
        match self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .con
            .clone()
        {
            Con::Single(con) => con,
            #[cfg(feature = "cluster")]
            Con::Cluster(_) => unreachable!("a Cluster client has a caller connection"),
        }
    }

    /// For a Cluster, the Cluster connection for the caller's own commands
    /// (routed by key like the client's).
    #[cfg(feature = "cluster")]
    pub(crate) fn for_caller_cluster(&self) -> Option<redis::cluster_async::ClusterConnection> {
        match self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .con
            .clone()
        {
            Con::Cluster(con) => Some(con),
            Con::Single(_) => None,
        }
    }

    /// Whether requests go to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .con
            .is_cluster()
    }

    /// A new connection, connected on first use, and the server it
    /// connects to.
    fn lazy(&self) -> Option<(Con, redis::ConnectionAddr)> {
        self.opener.lazy(&self.target)
    }

    /// After a failed request (Sentinel): asks the sentinels, and replaces
    /// connection `generation` if it is not to the primary they name.
    async fn follow(&self, generation: u64) {
        self.target.refresh().await;
        let primary = self.target.client();
        let stale = {
            let current = self.current.read().unwrap_or_else(|p| p.into_inner());
            current.generation == generation && &current.to != primary.get_connection_info().addr()
        };
        if stale {
            self.replace(generation, "the primary moved");
        }
    }

    /// Replaces connection `generation` (if still current) with a new one,
    /// connected on first use.
    fn replace(&self, generation: u64, why: &str) {
        let mut current = self.write();
        if current.generation != generation || current.closed {
            return;
        }
        if let Some((con, to)) = self.lazy() {
            tracing::debug!(why, "replacing the redis command connection");
            *current = Current {
                generation: generation + 1,
                con,
                to,
                ours: true,
                closed: false,
            };
        }
    }

    /// Closes the connection: one this client opened is ended with `QUIT`
    /// (within the operation timeout), so the server has let it go when
    /// this returns; a caller's own is only dropped. Later requests fail
    /// with [`closed`]; [`for_caller`](Self::for_caller) hands out a new,
    /// unconnected one. Idempotent.
    pub(crate) async fn close(&self) {
        let (mut con, ours) = {
            let mut current = self.write();
            if current.closed {
                return;
            }
            current.closed = true;
            current.generation += 1;
            let spare = self
                .lazy()
                .map_or_else(|| current.con.clone(), |(con, _)| con);
            (std::mem::replace(&mut current.con, spare), current.ours)
        };
        // A Cluster connection closes its node connections once dropped.
        if ours && !con.is_cluster() {
            let quit = redis::cmd("QUIT");
            let quit = quit.query_async::<Value>(&mut con);
            if let Ok(Err(e)) = tokio::time::timeout(self.timeout, quit).await
                && !(e.is_connection_dropped() || e.is_io_error())
            {
                tracing::debug!(error = %e, "QUIT at close failed; the connection is dropped");
            }
        }
    }

    /// Runs a plain command (one without a nonce: a read of the server's
    /// state, never of lock data) within the operation timeout.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        what: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, LockError> {
        let Some((_, mut con)) = self.get() else {
            return Err(closed());
        };
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut con)).await {
            Err(_) => Err(error::timed_out(what, self.timeout)),
            Ok(reply) => reply.map_err(error::map),
        }
    }

    /// Runs `invocation`, whose first argument is `nonce`, within the
    /// operation timeout, and checks the reply echoes the nonce before
    /// decoding the rest of it as `T`.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &str,
        nonce: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.invoke_tracked(what, nonce, invocation)
            .await
            .map_err(|(e, _)| e)
    }

    /// [`invoke`](Self::invoke), also telling on error whether the server
    /// may have run the script anyway (the request went out, no answer came).
    pub(crate) async fn invoke_tracked<T: FromRedisValue>(
        &self,
        what: &str,
        nonce: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, (LockError, bool)> {
        self.send(what, nonce, async |con| {
            invocation.invoke_async::<Value>(con).await
        })
        .await
    }

    /// [`invoke_tracked`](Self::invoke_tracked), followed on the same
    /// connection, in the same request, by `WAIT replicas within` (the
    /// lossless mode): also returns how many replicas acknowledged every
    /// write this connection made so far, the script's among them.
    pub(crate) async fn invoke_replicated<T: FromRedisValue>(
        &self,
        what: &str,
        nonce: &str,
        invocation: &ScriptInvocation<'_>,
        (replicas, within): (u32, Duration),
    ) -> Result<(T, u32), (LockError, bool)> {
        let mut acked = 0;
        let seen = &mut acked;
        let reply = self
            .send(what, nonce, async |con| {
                let mut pipe = redis::pipe();
                pipe.invoke_script(invocation)
                    .cmd("WAIT")
                    .arg(replicas)
                    .arg(u64::try_from(within.as_millis()).unwrap_or(u64::MAX).max(1));
                let (reply, count) = match pipe.query_async::<(Value, u32)>(con).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        invocation.load_async(con).await?;
                        pipe.query_async::<(Value, u32)>(con).await?
                    }
                    other => other?,
                };
                *seen = count;
                Ok(reply)
            })
            .await?;
        Ok((reply, acked))
    }

    /// Sends one request through the current connection: replaces the
    /// connection after a timeout or a reply that does not echo `nonce`.
    async fn send<T: FromRedisValue>(
        &self,
        what: &str,
        nonce: &str,
        request: impl AsyncFnOnce(&mut Con) -> redis::RedisResult<Value>,
    ) -> Result<T, (LockError, bool)> {
        let Some((generation, mut con)) = self.get() else {
            return Err((closed(), false));
        };
        let reply = tokio::time::timeout(self.timeout, request(&mut con)).await;
        match reply {
            Err(_) => {
                self.replace(generation, "timeout");
                Err((error::timed_out(what, self.timeout), true))
            }
            Ok(Err(e)) => {
                let maybe_ran = e.is_timeout() || e.is_connection_dropped();
                if e.is_timeout() {
                    self.replace(generation, "response timeout");
                } else if self.target.moves() && target::calls_for_refresh(&e) {
                    self.follow(generation).await;
                }
                Err((error::map(e), maybe_ran))
            }
            Ok(Ok(reply)) => match echoed(nonce, reply) {
                Some(rest) => T::from_redis_value(rest)
                    .map_err(|e| (error::unexpected(format!("{what} reply: {e}")), false)),
                None => {
                    self.replace(generation, "mismatched reply");
                    Err((mismatch(what), true))
                }
            },
        }
    }
}

/// The reply without its leading nonce, if it starts with `nonce`.
pub(crate) fn echoed(nonce: &str, reply: Value) -> Option<Value> {
    let Value::Array(mut items) = reply else {
        return None;
    };
    if items.is_empty() || String::from_redis_value_ref(&items[0]).ok()? != nonce {
        return None;
    }
    items.remove(0);
    Some(Value::Array(items))
}

/// The error of every call on a closed client.
pub(crate) fn closed() -> LockError {
    LockError::unavailable(BACKEND, "this client was closed")
}

/// The error for a reply that belongs to another request.
pub(crate) fn mismatch(what: &str) -> LockError {
    LockError::unavailable(
        BACKEND,
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{what}: the reply belongs to another request (a reply was lost in transit); the connection is dropped"
            ),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_requests_own_reply_is_accepted() {
        let reply = |n: &str| {
            Value::Array(vec![
                Value::BulkString(n.as_bytes().to_vec()),
                Value::Int(1),
                Value::Int(42),
            ])
        };
        let rest = echoed("7", reply("7")).unwrap();
        assert_eq!(<(i64, i64)>::from_redis_value(rest).unwrap(), (1, 42));
        assert!(echoed("7", reply("8")).is_none());
        assert!(echoed("7", Value::Int(1)).is_none());
        assert!(echoed("7", Value::Array(vec![])).is_none());
        assert_ne!(nonce(), nonce());
    }
}
