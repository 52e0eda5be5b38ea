//! The stores the CLI tests run `distlock` against: the default SQLite file
//! and the kit's shared Redis, PostgreSQL, etcd and ZooKeeper, with what
//! each backend declares (the TTL it enforces, its expiry slack) for bounds.

use std::process::{Child, Output};
use std::time::Duration;

use lock_conformance::kit::scaled;

use super::Shell;

/// A store to run `distlock` against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Sqlite,
    Redis,
    Postgres,
    Etcd,
    ZooKeeper,
}

impl Store {
    /// `--url` for the kit's shared instance, with a session of `ttl` on
    /// ZooKeeper (its leases are its sessions); `None`: the default file.
    pub fn url(self, ttl: Duration) -> Option<String> {
        use lock_conformance::kit::stores;
        match self {
            Store::Sqlite => None,
            Store::Redis => Some(stores::redis::shared().url()),
            Store::Postgres => Some(stores::postgres::shared().url()),
            Store::Etcd => Some(stores::etcd::shared().url()),
            Store::ZooKeeper => Some(with_session(stores::zookeeper::shared().url(), ttl)),
        }
    }

    /// The kit's shared instance (`None`: the default file has none).
    pub fn kit(self) -> Option<std::sync::Arc<lock_conformance::kit::stores::Store>> {
        use lock_conformance::kit::stores;
        match self {
            Store::Sqlite => None,
            Store::Redis => Some(stores::redis::shared()),
            Store::Postgres => Some(stores::postgres::shared()),
            Store::Etcd => Some(stores::etcd::shared()),
            Store::ZooKeeper => Some(stores::zookeeper::shared()),
        }
    }

    /// [`url`](Self::url) through the fault proxy at `via`.
    pub fn url_via(self, ttl: Duration, via: std::net::SocketAddr) -> Option<String> {
        let url = self.kit()?.url_via(via);
        Some(match self {
            Store::ZooKeeper => with_session(url, ttl),
            _ => url,
        })
    }

    /// `distlock --ttl TTL [--url URL]` on this store, then `rest`.
    pub fn args(self, ttl: Duration, rest: &[&str]) -> Vec<String> {
        let mut args = vec!["--ttl".to_owned(), ms(ttl)];
        if let Some(url) = self.url(ttl) {
            args.extend(["--url".to_owned(), url]);
        }
        args.extend(rest.iter().map(|s| (*s).to_owned()));
        args
    }

    /// The TTL the store enforces for `ttl`, and how long after it the
    /// store may still hold an abandoned lease, as the backend declares.
    pub fn declared(self, ttl: Duration) -> (Duration, Duration) {
        let Some(url) = self.url(ttl) else {
            return (ttl, Duration::ZERO);
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let backend = distlock::connect(&url).await.unwrap();
            let capabilities = backend.capabilities();
            let _ = backend.close().await;
            let effective = capabilities.effective_ttl(ttl).unwrap().get();
            (effective, capabilities.slack_for(effective))
        })
    }

    /// How long a second `run` may wait for a lease its holder stopped
    /// renewing: the enforced TTL, the slack, and room for a loaded host.
    pub fn takeover_wait(self, ttl: Duration) -> Duration {
        let (effective, slack) = self.declared(ttl);
        effective + slack + scaled(Duration::from_secs(10))
    }
}

/// `d` as `distlock` reads it: `1500ms`.
pub fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// `distlock --ttl TTL [--url URL] ARGS...` started from `shell`, its
/// output piped.
pub fn spawn(shell: &Shell, store: Store, ttl: Duration, args: &[&str]) -> Child {
    let args = store.args(ttl, args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    shell.spawn(&args)
}

/// `distlock --ttl TTL [--url URL] ARGS...` run to its end from `shell`.
pub fn output(shell: &Shell, store: Store, ttl: Duration, args: &[&str]) -> Output {
    let args = store.args(ttl, args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    shell.output(&args)
}

/// One test per store for each case given, in a module named after it.
#[macro_export]
macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            use super::Store;
            #[test]
            #[cfg(feature = "sqlite")]
            fn sqlite() { super::$case(Store::Sqlite) }
            #[test]
            #[cfg(feature = "redis")]
            fn redis() { super::$case(Store::Redis) }
            #[test]
            #[cfg(feature = "postgres")]
            fn postgres() { super::$case(Store::Postgres) }
            #[test]
            #[cfg(feature = "etcd")]
            fn etcd() { super::$case(Store::Etcd) }
            #[test]
            #[cfg(feature = "zookeeper")]
            fn zookeeper() { super::$case(Store::ZooKeeper) }
        }
    )*};
}

/// A ZooKeeper URL of the kit (which may carry options already) with a
/// session of `ttl`: its leases are its sessions.
fn with_session(url: String, ttl: Duration) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}session_timeout={}", ms(ttl))
}
