//! What a Redis restart keeps, and what Redis drops when memory runs
//! short: so what fencing and exclusion survive. Read at connect, where a
//! server that breaks a guarantee is refused or warned about.

use std::fmt;

use super::con::Con;
use lockcore::LockError;

use crate::RedisConfig;
use crate::error;

/// Reads the server's persistence and eviction settings through `con`,
/// each within `limit`: refuses non-durable persistence when the config
/// requires durable fences, and a server that may evict lock keys (or
/// whose eviction policy cannot be read at all, neither by `CONFIG GET`
/// nor by `INFO memory`) unless the config accepts it; warns about the
/// rest. Persistence that cannot be read is warned about, never refused.
pub(crate) async fn check(
    config: &RedisConfig,
    endpoint: &str,
    con: &mut Con,
    limit: std::time::Duration,
) -> Result<(Persistence, Eviction), LockError> {
    let persistence = tokio::time::timeout(limit, Persistence::probe(con))
        .await
        .unwrap_or_else(|_| Persistence::Unknown("CONFIG GET timed out".into()));
    if !persistence.is_durable() {
        if config.require_durable_fences {
            return Err(LockError::config(format!(
                "{endpoint} persists with {persistence}; durable fences need \
                 `appendonly yes` and `appendfsync always`"
            )));
        }
        tracing::warn!(
            endpoint = %endpoint,
            persistence = %persistence,
            "redis without `appendfsync always`: after a crash, fencing tokens stay \
             monotonic only if the server clock does not step back, and held locks may be forgotten"
        );
    }
    let allowed = config.allow_maxmemory_eviction;
    let eviction = match tokio::time::timeout(limit, Eviction::probe(con)).await {
        Ok(eviction) => eviction,
        Err(_) if allowed => Eviction::Unknown(format!("no answer within {limit:?}")),
        Err(_) => return Err(error::timed_out("reading maxmemory-policy", limit)),
    };
    if !allowed && let Some(refusal) = eviction.refusal(endpoint) {
        return Err(LockError::config(refusal));
    }
    match &eviction {
        Eviction::Evicts { .. } => tracing::warn!(
            endpoint = %endpoint,
            eviction = %eviction,
            "redis may evict lock keys when memory runs short (accepted with \
             allow_maxmemory_eviction): a second client can then be granted a lock that is \
             still held; only fencing tells the holders apart"
        ),
        Eviction::Unknown(why) => tracing::warn!(
            endpoint = %endpoint,
            why = %why,
            "could not read maxmemory / maxmemory-policy (accepted with \
             allow_maxmemory_eviction): unless the server runs with `maxmemory-policy \
             noeviction` or no maxmemory, it may evict held locks"
        ),
        Eviction::Unlimited | Eviction::Refuses { .. } => {}
    }
    Ok((persistence, eviction))
}

/// The text of [`FENCE_ASSUMPTION`], for `concat!`.
macro_rules! fence_assumption {
    () => {
        "fences survive any restart with `appendonly yes` + `appendfsync always`; \
with `everysec`, RDB snapshots or no persistence, a lost or rolled-back counter restarts at the \
server's clock in microseconds, so fences still grow unless the Redis host's clock stepped back \
across the restart"
    };
}

/// The assumption under which fencing tokens stay monotonic across a Redis
/// restart (what [`Capabilities::fence_durability`](lockcore::Capabilities)
/// reports).
pub const FENCE_ASSUMPTION: &str = fence_assumption!();

/// What `fence_durability` says under an evicting `maxmemory-policy`
/// that the user accepted, naming the policy.
macro_rules! evicting {
    (volatile $policy:literal) => {
        concat!(
            "maxmemory-policy ",
            $policy,
            " with a maxmemory limit (accepted with allow_maxmemory_eviction): when memory runs \
short Redis evicts keys that carry a TTL, held lock keys included, so a second client can be \
granted a lock that is still held (each holder has its own fence, and resources that check \
fences refuse the older one); fence counters carry no TTL and stay; ",
            fence_assumption!()
        )
    };
    (unknown) => {
        concat!(
            "maxmemory-policy unknown (neither CONFIG GET nor INFO memory could read it; accepted \
with allow_maxmemory_eviction): if the server has a maxmemory limit and a policy other than \
noeviction, it evicts held lock keys when memory runs short (a second client can be granted a \
lock that is still held), and under allkeys-* policies fence counters too; ",
            fence_assumption!()
        )
    };
    (allkeys $policy:literal) => {
        concat!(
            "maxmemory-policy ",
            $policy,
            " with a maxmemory limit (accepted with allow_maxmemory_eviction): when memory runs \
short Redis evicts any key: held lock keys (a second client can be granted a lock that is still \
held), fence counters (the next fence restarts at the server's clock in microseconds, so fences \
grow only while that clock does not step back) and `fenced_apply` fence keys (an evicted one \
accepts older tokens again); ",
            fence_assumption!()
        )
    };
}

/// The server's persistence settings, read at connect with `CONFIG GET`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Persistence {
    /// AOF with an fsync per write: the fence counter survives a crash of
    /// the process or the machine.
    AofAlways,
    /// AOF fsynced once a second: a process crash loses nothing (the page
    /// cache survives); a power loss or kernel crash loses up to a second.
    AofEverysec,
    /// AOF left to the OS to flush: a machine crash can lose more.
    AofNo,
    /// RDB snapshots only: a crash loses everything since the last snapshot.
    Snapshots,
    /// No persistence: a restart forgets every lock and counter.
    None,
    /// The settings could not be read (`CONFIG` renamed or denied by ACL).
    Unknown(String),
}

impl Persistence {
    /// Whether the fence counter survives a crash of the Redis machine
    /// without relying on its clock.
    pub fn is_durable(&self) -> bool {
        matches!(self, Persistence::AofAlways)
    }

    pub(crate) async fn probe(con: &mut Con) -> Persistence {
        let reply: Result<(Vec<String>, Vec<String>, Vec<String>), _> = redis::pipe()
            .cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .query_async(con)
            .await;
        let (aof, fsync, save) = match reply {
            Ok(r) => r,
            Err(e) => return Persistence::Unknown(e.to_string()),
        };
        let value = |pair: &[String]| pair.get(1).cloned().unwrap_or_default();
        match (value(&aof).as_str(), value(&fsync).as_str()) {
            ("yes", "always") => Persistence::AofAlways,
            ("yes", "everysec") => Persistence::AofEverysec,
            ("yes", _) => Persistence::AofNo,
            ("no", _) if !value(&save).trim().is_empty() => Persistence::Snapshots,
            ("no", _) => Persistence::None,
            (other, _) => Persistence::Unknown(format!("appendonly = {other:?}")),
        }
    }
}

impl fmt::Display for Persistence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Persistence::AofAlways => f.write_str("AOF, appendfsync always"),
            Persistence::AofEverysec => f.write_str("AOF, appendfsync everysec"),
            Persistence::AofNo => f.write_str("AOF, appendfsync no"),
            Persistence::Snapshots => f.write_str("RDB snapshots only"),
            Persistence::None => f.write_str("no persistence"),
            Persistence::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// What the server does when it runs out of memory, read at connect with
/// `CONFIG GET maxmemory` and `maxmemory-policy`, or where `CONFIG` is
/// denied (an ACL with `-@dangerous`), from `INFO memory`.
///
/// Under any policy but `noeviction`, Redis deletes keys to make room once
/// `maxmemory` is reached: `volatile-*` policies pick among keys with a TTL,
/// which every held lock key has; `allkeys-*` among all keys, fence keys
/// included. Either way a lock can vanish while its holder still holds a
/// valid lease, so `connect` refuses such a server, and one whose policy it
/// cannot read at all, unless
/// [`RedisConfig::allow_maxmemory_eviction`](crate::RedisConfig::allow_maxmemory_eviction).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Eviction {
    /// `maxmemory 0`: no limit, nothing is evicted.
    Unlimited,
    /// A limit with `noeviction`: no key is ever dropped. At the limit,
    /// new grants are refused with a retryable error; held locks renew
    /// and release as usual.
    Refuses {
        /// The limit in bytes.
        maxmemory: u64,
    },
    /// A limit with an evicting policy: keys can vanish before their TTL.
    Evicts {
        /// The limit in bytes.
        maxmemory: u64,
        /// The `maxmemory-policy`, e.g. `volatile-lru`.
        policy: String,
    },
    /// The settings could not be read (neither `CONFIG GET` nor `INFO
    /// memory` is allowed, or the server did not answer): only with
    /// `allow_maxmemory_eviction`, which accepts that it may evict.
    Unknown(String),
}

impl Eviction {
    /// Whether Redis may delete lock or fence keys to make room.
    pub fn evicts(&self) -> bool {
        matches!(self, Eviction::Evicts { .. })
    }

    /// `CONFIG GET`, or where that is denied, `INFO memory`.
    pub(crate) async fn probe(con: &mut Con) -> Eviction {
        let config = match Self::config_get(con).await {
            Ok(eviction) => return eviction,
            Err(why) => why,
        };
        match Self::info_memory(con).await {
            Ok(eviction) => eviction,
            Err(info) => Eviction::Unknown(format!("CONFIG GET: {config}; INFO memory: {info}")),
        }
    }

    async fn config_get(con: &mut Con) -> Result<Eviction, String> {
        let reply: Result<(Vec<String>, Vec<String>), _> = redis::pipe()
            .cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory")
            .cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(con)
            .await;
        let (limit, policy) = reply.map_err(|e| denial(&e))?;
        let value = |pair: &[String]| pair.get(1).cloned().unwrap_or_default();
        Self::read(&value(&limit), value(&policy))
    }

    async fn info_memory(con: &mut Con) -> Result<Eviction, String> {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(con)
            .await
            .map_err(|e| denial(&e))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        };
        match (field("maxmemory"), field("maxmemory_policy")) {
            (Some(limit), Some(policy)) => Self::read(&limit, policy),
            _ => Err("the reply has no maxmemory / maxmemory_policy".into()),
        }
    }

    fn read(limit: &str, policy: String) -> Result<Eviction, String> {
        let Ok(maxmemory) = limit.parse::<u64>() else {
            return Err(format!("maxmemory = {limit:?}"));
        };
        Ok(match (maxmemory, policy) {
            (0, _) => Eviction::Unlimited,
            (maxmemory, policy) if policy == "noeviction" => Eviction::Refuses { maxmemory },
            (maxmemory, policy) => Eviction::Evicts { maxmemory, policy },
        })
    }

    /// Why and how to fix, for the connect error under an evicting policy
    /// or one that could not be read.
    pub(crate) fn refusal(&self, endpoint: &str) -> Option<String> {
        let (maxmemory, policy) = match self {
            Eviction::Evicts { maxmemory, policy } => (maxmemory, policy),
            Eviction::Unknown(why) => {
                return Some(format!(
                    "{endpoint}: could not read maxmemory / maxmemory-policy ({why}), so whether \
                     Redis may evict held lock keys when memory runs short is unknown. Let the \
                     user read them: `ACL SETUSER <user> +info` (INFO memory); or, with the \
                     server known to run `maxmemory-policy noeviction` or no maxmemory, accept \
                     it: RedisConfig::allow_maxmemory_eviction(true), or \
                     `allow_maxmemory_eviction=true` in the URL's query"
                ));
            }
            Eviction::Unlimited | Eviction::Refuses { .. } => return None,
        };
        let victims = if policy.starts_with("volatile-") {
            "keys with a TTL, and every held lock key has one"
        } else {
            "any key, held lock keys and fence keys included"
        };
        Some(format!(
            "{endpoint} runs with maxmemory {maxmemory} bytes and maxmemory-policy {policy}: \
             when memory runs short Redis evicts {victims}, so a second client could be granted \
             a lock that is still held. Fix the server: `CONFIG SET maxmemory-policy noeviction` \
             (a full server then refuses new locks instead of dropping held ones) or \
             `CONFIG SET maxmemory 0`, and the same in redis.conf; or keep locks on a Redis of \
             their own. To accept the risk: RedisConfig::allow_maxmemory_eviction(true), or \
             `allow_maxmemory_eviction=true` in the URL's query"
        ))
    }

    /// What `fence_durability` says: [`FENCE_ASSUMPTION`], or under an
    /// evicting policy what that policy adds, naming it.
    pub(crate) fn fence_assumption(&self) -> &'static str {
        let policy = match self {
            Eviction::Evicts { policy, .. } => policy,
            Eviction::Unknown(_) => return evicting!(unknown),
            Eviction::Unlimited | Eviction::Refuses { .. } => return FENCE_ASSUMPTION,
        };
        match policy.as_str() {
            "volatile-lru" => evicting!(volatile "volatile-lru"),
            "volatile-lfu" => evicting!(volatile "volatile-lfu"),
            "volatile-random" => evicting!(volatile "volatile-random"),
            "volatile-ttl" => evicting!(volatile "volatile-ttl"),
            "allkeys-lru" => evicting!(allkeys "allkeys-lru"),
            "allkeys-lfu" => evicting!(allkeys "allkeys-lfu"),
            "allkeys-random" => evicting!(allkeys "allkeys-random"),
            _ => evicting!(allkeys "(a policy this version does not know)"),
        }
    }
}

impl fmt::Display for Eviction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Eviction::Unlimited => f.write_str("no maxmemory limit"),
            Eviction::Refuses { maxmemory } => {
                write!(f, "maxmemory {maxmemory} bytes, noeviction")
            }
            Eviction::Evicts { maxmemory, policy } => {
                write!(f, "maxmemory {maxmemory} bytes, {policy}")
            }
            Eviction::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// What a denied or failed read says: the server's error code and words.
pub(crate) fn denial(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_memory_is_read_like_config_get() {
        assert_eq!(
            Eviction::read("0", "allkeys-lru".into()),
            Ok(Eviction::Unlimited)
        );
        assert_eq!(
            Eviction::read("1024", "noeviction".into()),
            Ok(Eviction::Refuses { maxmemory: 1024 })
        );
        assert_eq!(
            Eviction::read("1024", "volatile-ttl".into()),
            Ok(Eviction::Evicts {
                maxmemory: 1024,
                policy: "volatile-ttl".into()
            })
        );
        assert!(Eviction::read("lots", "noeviction".into()).is_err());
    }

    #[test]
    fn the_accepted_assumption_names_the_policy() {
        for policy in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
        ] {
            let eviction = Eviction::Evicts {
                maxmemory: 1 << 20,
                policy: policy.into(),
            };
            let text = eviction.fence_assumption();
            assert!(
                text.starts_with(&format!("maxmemory-policy {policy} ")),
                "{text}"
            );
            assert!(text.ends_with(FENCE_ASSUMPTION), "{text}");
            let refusal = eviction.refusal("redis://h:1").unwrap();
            assert!(
                refusal.contains(policy) && refusal.contains("noeviction"),
                "{refusal}"
            );
        }
        for safe in [Eviction::Unlimited, Eviction::Refuses { maxmemory: 1 }] {
            assert_eq!(safe.fence_assumption(), FENCE_ASSUMPTION);
            assert_eq!(safe.refusal("redis://h:1"), None);
            assert!(!safe.evicts());
        }
        let unknown = Eviction::Unknown("denied".into());
        assert!(
            unknown
                .fence_assumption()
                .starts_with("maxmemory-policy unknown ")
        );
        assert!(unknown.fence_assumption().ends_with(FENCE_ASSUMPTION));
        let refusal = unknown.refusal("redis://h:1").unwrap();
        assert!(refusal.contains("+info") && refusal.contains("allow_maxmemory_eviction"));
        assert!(!unknown.evicts(), "not known to evict");
    }
}
