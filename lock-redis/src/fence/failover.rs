//! Failover: a promoted replica may lack the old primary's last writes.
//!
//! With asynchronous replication (Redis's only kind) a replica can be
//! behind when it is promoted: a lock key written just before the crash may
//! be missing, and the name granted again while its holder still works.
//! Fences keep growing regardless: each one is at least the server clock in
//! microseconds (`next_fence`), so unless the promoted host's clock is
//! behind the old one's by more than the failover took, a fence from the
//! new primary is larger than any from the old.
//!
//! A promotion gives the server a new *replication id* (`master_replid`).
//! Every grant script reads it (`era_check`, prepended to them) and
//! compares it with the id its Cluster slot's grants came from
//! (`<prefix>era:{<t>}`): when they differ, the script records the new id
//! and, with a lock delay, the server time before which nothing is
//! granted. The reply carries the id, and the backend remembers the one it
//! last saw ([`Era`]): on another, every lease it holds fires its loss
//! signal at once (its key may be gone), and it holds its own grants for
//! its delay. A resubscription (the pub/sub link dropped, as it does when
//! the primary dies) reads the id too, so holders hear without granting.
//!
//! A restart of the same server also gives it a new id: it is taken for a
//! failover (its holders hear, a lock delay applies), which costs
//! availability, never safety.
//!
//! On a Redis Cluster every primary has its own id, so the client keeps
//! none: the slot's record in the store alone decides, per slot, whether
//! its grants wait out a lock delay, and a holder hears at its next
//! renewal, which finds its key gone (a key the promoted replica has is
//! still its lease, and is renewed there). With a lock delay of at least
//! the longest TTL nobody is granted a name its lost holder still works
//! under: the holder stops by its deadline at the latest, which the delay
//! outlasts.
//!
//! The lossless mode (`wait_replicas`) sends each grant and renewal script
//! with `WAIT n` in one request: a grant is handed out, and a renewal
//! adopted, only once `n` replicas have it, so a promoted replica among
//! them has every lease a client believes it holds.

use std::sync::Arc;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{CancellationToken, Era};

use redis::FromRedisValue;

use crate::connection::background::Pending;
use crate::connection::client::Client;
use crate::connection::script::{Call, prepare, script};
use crate::error::BACKEND;

/// `era_check`: the server's replication id, recorded per slot, and how
/// long grants still wait after a failover.
pub(crate) const ERA_CHECK: &str = include_str!("scripts/era.lua");

script!(ERA_READ = [] "return {ARGV[1], string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''}");

/// How this backend tells one incarnation of the server from another.
#[derive(Debug)]
pub(crate) struct Failover {
    pub(crate) era: Arc<Era>,
    /// `INFO` can be read (the ACL allows it): failovers are seen.
    detects: bool,
    lock_delay: Option<Duration>,
    /// The lossless mode: replicas that must have each grant and renewal,
    /// and how long one `WAIT` may take.
    wait_replicas: Option<(u32, Duration)>,
    /// A Redis Cluster: each primary has its own replication id, so ids
    /// are not compared here (see the module docs).
    per_slot: bool,
}

impl Failover {
    /// Reads the server's replication id through `con` at connect. Where
    /// `INFO` is denied, failovers go unseen (a warning), and a lock delay,
    /// which could not work, is refused.
    ///
    /// For a Redis Cluster (`per_slot`), `con` reaches one of its nodes:
    /// the check is of what the user may run, which is the same on every
    /// node; that node's id and replicas say nothing of the others'.
    pub(crate) async fn probe(
        con: &mut crate::connection::con::Con,
        endpoint: &str,
        config: &crate::RedisConfig,
        closing: CancellationToken,
        per_slot: bool,
    ) -> Result<Failover, LockError> {
        let lock_delay = config.failover_lock_delay;
        // Half the response timeout: the client's own timeout of the whole
        // request (script and WAIT) must not cut a WAIT's answer short.
        let wait_replicas = config
            .wait_replicas
            .map(|n| (n, config.response_timeout / 2));
        let era = Arc::new(Era::new(closing));
        let info = redis::cmd("INFO")
            .arg("replication")
            .query_async::<String>(con)
            .await;
        let detects = match info {
            Ok(_) if per_slot => true,
            Ok(info) => {
                if let Some(id) = replication_id(&info) {
                    era.saw(id);
                }
                let replicas = field(&info, "connected_slaves").and_then(|n| n.parse::<u32>().ok());
                if let (Some((wanted, _)), Some(replicas)) = (wait_replicas, replicas)
                    && replicas < wanted
                {
                    tracing::warn!(
                        endpoint = %endpoint, replicas, wait_replicas = wanted,
                        "fewer replicas are connected than wait_replicas asks for: until \
                         enough are, every grant fails (it would not survive a failover)"
                    );
                }
                true
            }
            Err(e) if lock_delay.is_some() => {
                return Err(LockError::config(format!(
                    "{endpoint}: failover_lock_delay needs the server's replication id, but \
                     INFO replication failed ({}); let the user run it: \
                     `ACL SETUSER <user> +info`",
                    crate::connection::probe::denial(&e)
                )));
            }
            Err(e) => {
                tracing::warn!(
                    endpoint = %endpoint, error = %crate::connection::probe::denial(&e),
                    "INFO replication is denied: a failover to a replica goes unseen, so \
                     holders hear of a lost lock only at their next renewal (allow it with \
                     `ACL SETUSER <user> +info`)"
                );
                false
            }
        };
        Ok(Failover {
            era,
            detects,
            lock_delay,
            wait_replicas,
            per_slot,
        })
    }

    /// What a failover keeps for this backend's grants.
    pub(crate) fn mode(&self) -> lockcore::Failover {
        match (self.wait_replicas, self.lock_delay()) {
            (Some(_), _) => lockcore::Failover::Synchronous,
            (None, Some(delay)) => lockcore::Failover::LockDelay(delay),
            (None, None) => lockcore::Failover::Asynchronous,
        }
    }

    /// The lossless mode is on: a grant is used only once replicas have it.
    pub(crate) fn lossless(&self) -> bool {
        self.wait_replicas.is_some()
    }

    /// The lock delay in force, when failovers are seen.
    fn lock_delay(&self) -> Option<Duration> {
        self.lock_delay.filter(|_| self.detects)
    }

    /// The grant scripts' `delay_ms` argument: the lock delay in ms, 0
    /// for none, -1 when the replication id cannot be read.
    pub(crate) fn script_arg(&self) -> i64 {
        if !self.detects {
            return -1;
        }
        self.lock_delay
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// A grant script (or a resubscription) saw replication id `id` ('':
    /// not read): on another id than before, every lease this backend
    /// holds is lost and its own grants wait out the lock delay.
    pub(crate) fn saw(&self, id: &str, endpoint: &str) {
        if id.is_empty() || self.per_slot || !self.era.saw(id) {
            return;
        }
        if let Some(delay) = self.lock_delay {
            self.era.hold_grants(delay);
        }
        tracing::warn!(
            endpoint = %endpoint, replication_id = %id, lock_delay = ?self.lock_delay,
            "the server has another replication id than before (a failover to a replica, or a \
             restart): every lease held before is taken as lost"
        );
    }
}

impl Client {
    /// Runs a grant script through [`invoke_replicated`](Self::invoke_replicated),
    /// with `pending` the undo of what it may grant: settled once the outcome
    /// is known (a reply, or an error before the script could run), left
    /// to run in the background otherwise.
    pub(crate) async fn invoke_grant<T: FromRedisValue>(
        &self,
        what: &str,
        call: &Call,
        pending: Option<Pending>,
    ) -> Result<(T, Result<(), LockError>), (LockError, bool)> {
        let reply = self.invoke_replicated(what, call).await;
        if !matches!(reply, Err((_, true))) {
            Pending::settled(pending);
        }
        reply
    }

    /// Runs a grant or renewal script. In the lossless mode it goes in one
    /// request with `WAIT`, and the second result says whether enough
    /// replicas acknowledged it (always `Ok` outside that mode). Errors as
    /// [`Commands::invoke_tracked`](crate::connection::commands::Commands::invoke_tracked).
    pub(crate) async fn invoke_replicated<T: FromRedisValue>(
        &self,
        what: &str,
        call: &Call,
    ) -> Result<(T, Result<(), LockError>), (LockError, bool)> {
        let Some((wanted, within)) = self.failover.wait_replicas else {
            let reply = self.commands.invoke_tracked(what, &call.1, &call.0).await?;
            return Ok((reply, Ok(())));
        };
        let (reply, acked) = self
            .commands
            .invoke_replicated(what, &call.1, &call.0, (wanted, within))
            .await?;
        let replicated = if acked >= wanted {
            Ok(())
        } else {
            Err(LockError::unavailable(
                BACKEND,
                format!(
                    "{what}: {acked} of the {wanted} replicas wait_replicas asks for acknowledged \
                     it within {within:?}; it would not survive a failover"
                ),
            ))
        };
        Ok((reply, replicated))
    }

    /// Reads the server's replication id and tells the era (after a
    /// resubscription: the link may have moved to a promoted replica). Not
    /// on a Cluster, whose ids are per primary.
    pub(crate) async fn check_era(&self) -> Result<(), LockError> {
        if self.failover.script_arg() < 0 || self.failover.per_slot {
            return Ok(());
        }
        let call = prepare(&ERA_READ);
        let (id,): (String,) = self.invoke("replication id", &call).await?;
        self.failover.saw(&id, &self.endpoint);
        Ok(())
    }
}

/// `master_replid` in an `INFO replication` reply.
fn replication_id(info: &str) -> Option<&str> {
    field(info, "master_replid").filter(|id| !id.is_empty())
}

/// The value of `name` in an `INFO` reply.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replication_id_is_read_from_info() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\
                    master_replid:dc92e33d878a1e46df035b6a7901b96c210cf2fe\r\n\
                    master_replid2:0000000000000000000000000000000000000000\r\n";
        assert_eq!(
            replication_id(info),
            Some("dc92e33d878a1e46df035b6a7901b96c210cf2fe")
        );
        assert_eq!(replication_id("# Replication\r\nrole:master\r\n"), None);
        assert_eq!(field(info, "connected_slaves"), Some("0"));
        assert_eq!(
            field(info, "master_replid2"),
            Some("0000000000000000000000000000000000000000")
        );
    }
}
