//! The test environment, read in one place: every variable the kit and the
//! suite read, under one scheme. `LOCK_TEST_<STORE>_URL` names an external
//! store by a URL `distlock::connect` accepts; every knob is `LOCK_TEST_*`.
//!
//! | variable | meaning | was |
//! |---|---|---|
//! | `LOCK_TEST_REDIS_URL` | `redis://host:port[/db]`: use this Redis | |
//! | `LOCK_TEST_REDIS_CLUSTER_URL` | `redis+cluster://host:port[,host:port...]`: use this Redis Cluster | |
//! | `LOCK_TEST_POSTGRES_URL` | `postgres://user@host:port/db`: use this PostgreSQL | |
//! | `LOCK_TEST_ETCD_URL` | `etcd://host:port[,host:port]` (`etcds://` for TLS): use this etcd | `LOCK_TEST_ETCD_ENDPOINTS` (`http://host:port,...`) |
//! | `LOCK_TEST_ZOOKEEPER_URL` | `zk://host:port[,host:port][/root]` (`zks://...?tls_ca=PATH` for TLS): use this ZooKeeper | `LOCK_TEST_ZOOKEEPER` (`host:port,...`) |
//! | `LOCK_TEST_ZOOKEEPER_TLS` | `1`: standalone ZooKeepers the kit launches serve TLS only (a CA of their own; URL `zks://...?tls_ca=PATH`) | |
//! | `LOCK_TEST_SQLITE_URL` | `sqlite://PATH`: the lock file of a helper process | `LOCK_TEST_SQLITE_PATH` (`PATH`) |
//! | `LOCK_TEST_TIME_SCALE` | stretch every timing (e.g. `2` on a slow machine) | |
//! | `LOCK_TEST_EXPECT_SKIPS` | more cases expected to skip here (CI against external stores) | |
//! | `LOCK_TEST_PARTIAL` | `1`: a missing store binary skips instead of failing (never with `CI=true`) | |
//! | `LOCK_TEST_NEMESIS_SEED` | replay a nemesis run (decimal or `0x` hex) | `LOCK_NEMESIS_SEED` |
//! | `LOCK_TEST_LOG` | the suite's cases log to stderr at this filter (`RUST_LOG` syntax, e.g. `lock_zookeeper=debug`), for a soak's failed runs | |
//! | `LOCK_TEST_ZK_TRIALS` | rounds of lock-zookeeper's ensemble tests | `LOCK_ZK_TRIALS` |
//! | `LOCK_TEST_ETCD_FAILOVER_RUNS` | leader kills per lock-etcd failover test | `ETCD_FAILOVER_RUNS` |
//! | `LOCK_TEST_FAILOVERS` | primary kills per run of the replicated stores' failover nemesis | |
//! | `LOCK_TEST_TMPDIR` | where launched stores keep their data | |
//! | `LOCK_TEST_PG_BIN` | the PostgreSQL server binaries | |
//!
//! An old name is still read for one release: its value is converted to the
//! new form, with a one-line warning naming the new variable. When both are
//! set, the new one wins (and the warning says the old one is ignored).

use std::collections::HashSet;
use std::io::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// One variable of the test environment.
#[derive(Clone, Copy)]
pub struct Var {
    name: &'static str,
    old: Option<&'static str>,
    /// Turns a value given under the old name into the new form.
    upgrade: fn(&str) -> String,
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl std::fmt::Display for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn unchanged(value: &str) -> String {
    value.to_owned()
}

impl Var {
    const fn new(name: &'static str) -> Var {
        Var {
            name,
            old: None,
            upgrade: unchanged,
        }
    }

    const fn renamed(name: &'static str, old: &'static str, upgrade: fn(&str) -> String) -> Var {
        Var {
            name,
            old: Some(old),
            upgrade,
        }
    }

    /// The variable's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The name it had before this scheme, still read for one release.
    pub const fn old_name(&self) -> Option<&'static str> {
        self.old
    }

    /// The value, trimmed; unset and empty are `None`. Falls back to the old
    /// name (converted to the new form), warning once per process.
    pub fn get(&self) -> Option<String> {
        let value = read(self.name);
        let Some(old) = self.old else { return value };
        match (value, read(old)) {
            (Some(value), Some(_)) => {
                warn_once(old, &format!("{old} is ignored: {} is set", self.name));
                Some(value)
            }
            (None, Some(legacy)) => {
                let value = (self.upgrade)(&legacy);
                warn_once(
                    old,
                    &format!(
                        "{old} is deprecated and goes away in the next release: use {}={value}",
                        self.name
                    ),
                );
                Some(value)
            }
            (value, None) => value,
        }
    }

    /// Whether it is set (under either name) to something non-empty.
    pub fn is_set(&self) -> bool {
        self.get().is_some()
    }

    /// A count (runs, trials), `default` when unset; at least 1.
    ///
    /// # Panics
    /// When the value is not a whole number, saying so.
    pub fn count(&self, default: usize) -> usize {
        match self.get() {
            None => default,
            Some(text) => text
                .parse::<usize>()
                .unwrap_or_else(|e| panic!("{}={text:?} is not a whole number: {e}", self.name)),
        }
        .max(1)
    }
}

fn read(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Writes `line` to stderr once per `key` and process, past libtest's output
/// capture (a warning only seen in failing runs would not be seen).
fn warn_once(key: &str, line: &str) {
    static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if warned
        .get_or_insert_with(HashSet::new)
        .insert(key.to_owned())
    {
        let _ = writeln!(std::io::stderr(), "warning: {line}");
    }
}

/// `http://a:2379,https://b:2379` (the etcd client's endpoints) as
/// `etcd://a:2379,b:2379` (`etcds://` if any endpoint is `https://`).
fn etcd_url_from_endpoints(endpoints: &str) -> String {
    let mut tls = false;
    let hosts: Vec<&str> = endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if let Some(host) = e.strip_prefix("https://") {
                tls = true;
                host
            } else {
                e.strip_prefix("http://").unwrap_or(e)
            }
        })
        .map(|host| host.trim_end_matches('/'))
        .collect();
    let scheme = if tls { "etcds" } else { "etcd" };
    format!("{scheme}://{}", hosts.join(","))
}

/// A ZooKeeper connect string `a:2181,b:2181[/root]` as `zk://a:2181,b:2181[/root]`.
fn zk_url_from_connect_string(connect: &str) -> String {
    format!("zk://{connect}")
}

/// A lock file's path as `sqlite://PATH`.
fn sqlite_url_from_path(path: &str) -> String {
    format!("sqlite://{path}")
}

/// The Redis to use instead of launching one.
pub const REDIS_URL: Var = Var::new("LOCK_TEST_REDIS_URL");
/// The Redis Cluster to use instead of launching one.
pub const REDIS_CLUSTER_URL: Var = Var::new("LOCK_TEST_REDIS_CLUSTER_URL");
/// The PostgreSQL to use instead of launching one.
pub const POSTGRES_URL: Var = Var::new("LOCK_TEST_POSTGRES_URL");
/// The etcd to use instead of launching one.
pub const ETCD_URL: Var = Var::renamed(
    "LOCK_TEST_ETCD_URL",
    "LOCK_TEST_ETCD_ENDPOINTS",
    etcd_url_from_endpoints,
);
/// The ZooKeeper to use instead of launching one.
pub const ZOOKEEPER_URL: Var = Var::renamed(
    "LOCK_TEST_ZOOKEEPER_URL",
    "LOCK_TEST_ZOOKEEPER",
    zk_url_from_connect_string,
);
/// The SQLite lock file a helper process uses (its parent's).
pub const SQLITE_URL: Var = Var::renamed(
    "LOCK_TEST_SQLITE_URL",
    "LOCK_TEST_SQLITE_PATH",
    sqlite_url_from_path,
);
/// `1`: the standalone ZooKeepers the kit launches serve clients over TLS
/// only, with a certificate from a CA made for each (the store's URL names
/// its PEM file). For running the conformance suite over TLS.
pub const ZOOKEEPER_TLS: Var = Var::new("LOCK_TEST_ZOOKEEPER_TLS");
/// Stretches every timing of the suite and the kit (default 1).
pub const TIME_SCALE: Var = Var::new("LOCK_TEST_TIME_SCALE");
/// Cases expected to skip in this environment (comma- or space-separated),
/// on top of a `suite!` invocation's `expect_skips`.
pub const EXPECT_SKIPS: Var = Var::new("LOCK_TEST_EXPECT_SKIPS");
/// `1`: a store whose binaries are missing skips instead of failing (local
/// partial runs only; never with `CI=true`).
pub const PARTIAL: Var = Var::new("LOCK_TEST_PARTIAL");
/// The seed of a nemesis run to replay.
pub const NEMESIS_SEED: Var =
    Var::renamed("LOCK_TEST_NEMESIS_SEED", "LOCK_NEMESIS_SEED", unchanged);
/// What the suite's cases log to stderr (`RUST_LOG` syntax): what the
/// adapter decided in a failed soak run.
pub const LOG: Var = Var::new("LOCK_TEST_LOG");
/// Rounds of lock-zookeeper's ensemble tests.
pub const ZK_TRIALS: Var = Var::renamed("LOCK_TEST_ZK_TRIALS", "LOCK_ZK_TRIALS", unchanged);
/// Primary kills per run of the failover nemesis (Redis, PostgreSQL).
pub const FAILOVERS: Var = Var::new("LOCK_TEST_FAILOVERS");
/// Leader kills per lock-etcd failover test.
pub const ETCD_FAILOVER_RUNS: Var = Var::renamed(
    "LOCK_TEST_ETCD_FAILOVER_RUNS",
    "ETCD_FAILOVER_RUNS",
    unchanged,
);
/// Where launched stores keep their data (default: the system temp dir).
pub const TMPDIR: Var = Var::new("LOCK_TEST_TMPDIR");
/// The PostgreSQL server binaries (default: the newest installed).
pub const PG_BIN: Var = Var::new("LOCK_TEST_PG_BIN");

/// Every variable, in the order of the table above.
pub const ALL: &[Var] = &[
    REDIS_URL,
    REDIS_CLUSTER_URL,
    POSTGRES_URL,
    ETCD_URL,
    ZOOKEEPER_URL,
    ZOOKEEPER_TLS,
    SQLITE_URL,
    TIME_SCALE,
    EXPECT_SKIPS,
    PARTIAL,
    NEMESIS_SEED,
    LOG,
    ZK_TRIALS,
    FAILOVERS,
    ETCD_FAILOVER_RUNS,
    TMPDIR,
    PG_BIN,
];

/// `LOCK_TEST_TIME_SCALE` (default 1; a value that is not a positive number
/// counts as 1, with a warning).
pub fn time_scale() -> f64 {
    let Some(text) = TIME_SCALE.get() else {
        return 1.0;
    };
    match text.parse::<f64>() {
        Ok(scale) if scale.is_finite() && scale > 0.0 => scale,
        _ => {
            warn_once(
                TIME_SCALE.name,
                &format!("{TIME_SCALE}={text:?} is not a positive number: timings are not scaled"),
            );
            1.0
        }
    }
}

/// `d` stretched by the time scale.
pub fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_scale())
}

/// Whether this runs in CI (`CI=true`): nothing is skipped for lack of a store.
pub fn ci() -> bool {
    read("CI").is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Whether a missing store may be skipped: `LOCK_TEST_PARTIAL=1`, and not CI.
pub fn partial_run_allowed() -> bool {
    PARTIAL.get().is_some_and(|v| v == "1") && !ci()
}

/// The case names `LOCK_TEST_EXPECT_SKIPS` lists.
pub fn expect_skips() -> Vec<String> {
    EXPECT_SKIPS
        .get()
        .unwrap_or_default()
        .split([',', ' ', '\n', '\t'])
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_values_become_urls_connect_accepts() {
        assert_eq!(
            etcd_url_from_endpoints("http://127.0.0.1:2379"),
            "etcd://127.0.0.1:2379"
        );
        assert_eq!(
            etcd_url_from_endpoints("http://a:1, http://b:2/"),
            "etcd://a:1,b:2"
        );
        assert_eq!(
            etcd_url_from_endpoints("https://a:1,https://b:2"),
            "etcds://a:1,b:2"
        );
        assert_eq!(
            zk_url_from_connect_string("zk1:2181,zk2:2181/locks"),
            "zk://zk1:2181,zk2:2181/locks"
        );
        assert_eq!(sqlite_url_from_path("/tmp/x.db"), "sqlite:///tmp/x.db");
    }

    #[test]
    fn every_variable_follows_the_scheme() {
        let mut seen = HashSet::new();
        for var in ALL {
            assert!(var.name().starts_with("LOCK_TEST_"), "{var}");
            assert!(seen.insert(var.name()), "{var} listed twice");
            if let Some(old) = var.old_name() {
                assert!(seen.insert(old), "{old} listed twice");
            }
        }
        for store in [
            REDIS_URL,
            REDIS_CLUSTER_URL,
            POSTGRES_URL,
            ETCD_URL,
            ZOOKEEPER_URL,
            SQLITE_URL,
        ] {
            assert!(store.name().ends_with("_URL"), "{store}");
        }
    }
}
