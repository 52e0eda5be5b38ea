//! `PostgresConfig`: where the locks live and how the backend talks to the server.

use std::fmt;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::StoreUrl;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

mod urls;

use crate::keys::ident::Ident;
use crate::keys::schema::SEQUENCE_SUFFIX;
use urls::{Options, libpq_parameters, sqlx_options, unambiguous, without_query};

/// The options this crate reads from a URL (besides libpq's own, which
/// sqlx reads): what an unknown option's error lists.
const OWN_OPTIONS: &[&str] = &[
    "schema",
    "table",
    "pool_size",
    "timeout",
    "connect_timeout",
    "create_schema",
    "turnstiles",
    "failover_lock_delay",
    "password_file",
    "tls_ca",
    "tls_cert",
    "tls_key",
];

/// Where the backend gets its connections.
#[derive(Clone)]
pub(crate) enum Source {
    /// Connect with these options (a pool of our own).
    Options(Box<PgConnectOptions>),
    /// Use the caller's pool.
    Pool(PgPool),
}

/// Configuration of a [`PostgresBackend`](crate::PostgresBackend).
///
/// Built from a URL ([`from_url`](Self::from_url), TLS from `sslmode`,
/// `sslrootcert`, `sslcert`, `sslkey` as libpq spells them), from sqlx
/// [`PgConnectOptions`], or from an existing [`PgPool`]; then adjusted with
/// the setters. `Debug` never prints the password.
///
/// URL options read by this crate (see the README's table): `schema`,
/// `table`, `pool_size`, `timeout`, `connect_timeout` (a duration, or
/// libpq's whole seconds), `create_schema`, `turnstiles`,
/// `failover_lock_delay`, `password_file`,
/// `tls_ca`/`tls_cert`/`tls_key` (libpq's `sslrootcert`/`sslcert`/`sslkey`).
/// The `lock_*` spellings of earlier releases are still read, with a
/// warning.
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) source: Source,
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) pool_size: u32,
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) create_schema: bool,
    pub(crate) turnstiles: u32,
    pub(crate) failover_lock_delay: Option<Duration>,
}

impl PostgresConfig {
    /// Default schema of the lock table.
    pub const DEFAULT_SCHEMA: &'static str = "public";
    /// Default lock table name; its sequence is `<table>_fence_seq`.
    pub const DEFAULT_TABLE: &'static str = "distlock_locks";
    /// Default number of turnstile connections per backend instance.
    pub const DEFAULT_TURNSTILES: u32 = 8;

    /// Connections in the pool `connect` builds (`pool_size`).
    pub const DEFAULT_POOL_SIZE: u32 = 10;

    fn with_source(source: Source) -> Self {
        PostgresConfig {
            source,
            schema: Self::DEFAULT_SCHEMA.into(),
            table: Self::DEFAULT_TABLE.into(),
            pool_size: Self::DEFAULT_POOL_SIZE,
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            create_schema: true,
            turnstiles: Self::DEFAULT_TURNSTILES,
            failover_lock_delay: None,
        }
    }

    /// Parses a `postgres://` or `postgresql://` URL: libpq's form (host,
    /// port, user, password, database, and libpq's parameters such as
    /// `sslmode`, `sslrootcert`, `application_name`, `connect_timeout`), and
    /// this crate's options (see the README's table).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a URL that does not parse, a bad
    /// option value or an unknown option (naming the known ones); the
    /// message never contains the password.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let mut store = StoreUrl::parse(&unambiguous(url)?, &["postgres", "postgresql"])?;
        let shown = store.redacted();
        let options = Options::take(&mut store)?;
        let password = store.take_password()?;
        let libpq = libpq_parameters(&shown, store.take_rest(), &options)?;
        let mut connect = sqlx_options(url, &shown, libpq.clone())?;
        // From `password_file`: the URL carries none (`take_password`
        // refuses both), but a `password=` parameter may.
        if store.password().is_none()
            && let Some(password) = password
        {
            if libpq.iter().any(|(key, _)| key == "password") {
                return Err(LockError::config(format!(
                    "{}: both password_file and a password parameter: give one",
                    without_query(&shown)
                )));
            }
            connect = connect.password(&password);
        }
        let mut config = Self::from_options(connect);
        options.apply(&mut config);
        Ok(config)
    }

    /// Connects with sqlx connect options.
    pub fn from_options(options: PgConnectOptions) -> Self {
        Self::with_source(Source::Options(Box::new(options)))
    }

    /// Uses an existing pool for lock statements. The LISTEN connection is
    /// opened separately (same connect options), so it never takes a slot
    /// of `pool`. `pool_size` is ignored.
    pub fn from_pool(pool: PgPool) -> Self {
        Self::with_source(Source::Pool(pool))
    }

    /// The schema of the lock table (default `public`). Must match
    /// `^[A-Za-z_][A-Za-z0-9_]{0,62}$`; it is also quoted, so case is kept.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The lock table (default `distlock_locks`), at most 53 bytes so its
    /// sequence `<table>_fence_seq` fits PostgreSQL's 63-byte identifiers.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Connections in the backend's own pool (default 10). Waiters do not
    /// hold connections while they wait, so this bounds concurrent
    /// statements, not waiters.
    pub fn pool_size(mut self, connections: u32) -> Self {
        self.pool_size = connections.max(1);
        self
    }

    /// Time limit of each store operation, including the wait for a pooled
    /// connection (default 5 s). A hung server then gives a retryable
    /// [`LockError::Unavailable`] instead of hanging the caller.
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// How long opening one connection may take: TCP, TLS and
    /// authentication (default 5 s). `connect` opens its first connection
    /// itself, so an unreachable server, a wrong password or a missing
    /// database is reported within this time, with its cause.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether `connect` creates the schema, table and sequence when they
    /// are missing (default `true`). Turn it off for a role that may only
    /// use objects an administrator created (see the README for the DDL).
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// Connections this backend may open for **turnstiles** (default 8; 0
    /// turns them off). A waiting `acquire` queues in PostgreSQL's own
    /// lock queue on one of them, so waiters of a name are served first
    /// come, first served, and only one of them at a time asks for the
    /// lease. Each name being waited for uses one while it has waiters on
    /// this instance; beyond this many names, waiters fall back to plain
    /// LISTEN/NOTIFY waiting (correct, not ordered). With 0, waiting is
    /// never ordered and [`capabilities`](lockcore::LockBackend::capabilities)
    /// reports no fairness. At most [`MAX_TURNSTILES`](Self::MAX_TURNSTILES).
    pub fn turnstiles(mut self, connections: u32) -> Self {
        self.turnstiles = connections.min(Self::MAX_TURNSTILES);
        self
    }

    /// After a failover to a standby (a new WAL timeline, see the README's
    /// "Failover to a standby"), grants nothing for `delay` from the moment
    /// a client first sees it (`failover_lock_delay`; off by default). With
    /// asynchronous replication the old primary's last grants may be gone
    /// while their holders still work: a delay of at least the longest TTL
    /// in use, plus the expiry slack and the holders' renewal interval,
    /// lets every such lease run out first, so no two holders overlap, at
    /// the cost of that long without grants. Set it alike on every client:
    /// the first to see the failover records when grants resume.
    /// [`capabilities`](lockcore::LockBackend::capabilities) reports it as
    /// [`Failover::LockDelay`](lockcore::Failover::LockDelay).
    pub fn failover_lock_delay(mut self, delay: Duration) -> Self {
        self.failover_lock_delay = (!delay.is_zero()).then_some(delay);
        self
    }

    /// The largest [`turnstiles`](Self::turnstiles) setting.
    pub const MAX_TURNSTILES: u32 = 64;

    /// Validated identifiers: `(schema, table, sequence)`.
    pub(crate) fn idents(&self) -> Result<(Ident, Ident, Ident), LockError> {
        let schema = Ident::new("schema", &self.schema, Ident::MAX_BYTES)?;
        let table = Ident::new(
            "table",
            &self.table,
            Ident::MAX_BYTES - SEQUENCE_SUFFIX.len(),
        )?;
        let sequence = table.with_suffix(SEQUENCE_SUFFIX);
        Ok((schema, table, sequence))
    }

    /// The sqlx options of a config made from a URL or options.
    #[cfg(test)]
    pub(crate) fn connect_options(&self) -> &PgConnectOptions {
        match &self.source {
            Source::Options(options) => options,
            Source::Pool(_) => panic!("a pool, not options"),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), LockError> {
        self.idents()?;
        if self.op_timeout.is_zero() {
            return Err(LockError::config("op_timeout must be positive"));
        }
        if self.connect_timeout.is_zero() {
            return Err(LockError::config("connect_timeout must be positive"));
        }
        Ok(())
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PostgresConfig");
        match &self.source {
            Source::Options(options) => d.field("server", &Server(options)),
            Source::Pool(pool) => d.field("server", &Server(&pool.connect_options())),
        };
        d.field("schema", &self.schema)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("create_schema", &self.create_schema)
            .field("turnstiles", &self.turnstiles)
            .field("failover_lock_delay", &self.failover_lock_delay)
            .finish()
    }
}

/// Where a server is, without credentials (sqlx's own `Debug` of
/// `PgConnectOptions` prints the password).
pub(crate) struct Server<'a>(pub(crate) &'a PgConnectOptions);

impl fmt::Debug for Server<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

impl fmt::Display for Server<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        let host = match o.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => o.get_host().to_string(),
        };
        write!(
            f,
            "postgres://{}@{}:{}/{} (sslmode {:?})",
            o.get_username(),
            host,
            o.get_port(),
            o.get_database().unwrap_or(""),
            o.get_ssl_mode()
        )
    }
}

#[cfg(test)]
mod option_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_errors_never_show_the_password() {
        let url =
            "postgres://locker:s3cret-pw@db.internal:6543/app?sslmode=require&lock_table=my_locks";
        let config = PostgresConfig::from_url(url).unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("db.internal:6543/app"), "{shown}");
        assert!(shown.contains("Require"), "{shown}");
        assert_eq!(config.table, "my_locks");

        for bad in [
            "postgres://u:s3cret-pw@h/db?sslmode=bogus",
            "postgres://u:s3cret-pw@h/db?lock_pool_size=0",
            "postgres://u:s3cret-pw@h/db?lock_op_timeout_ms=x",
            "postgres://u:s3cret-pw@h/db?timeout=x",
            "postgres://u:s3cret-pw@h/db?lock_turnstiles=65",
            "postgres://u:s3cret-pw@h/db?lock_turnstiles=-1",
            "postgres://u:s3cret-pw@h/db?password=s3cret-pw&sslmode=nope",
            "mysql://u:s3cret-pw@h/db",
            "u:s3cret-pw@h/db",
        ] {
            let err = PostgresConfig::from_url(bad).unwrap_err();
            let text = format!("{err} {err:?}");
            assert!(
                matches!(err, LockError::InvalidConfig { .. }),
                "{bad}: {text}"
            );
            assert!(!text.contains("s3cret"), "{bad}: {text}");
        }
    }

    #[test]
    fn identifiers_are_validated() {
        let base = || PostgresConfig::from_url("postgres://u@h/d").unwrap();
        assert!(base().validate().is_ok());
        assert!(base().table("x".repeat(53)).validate().is_ok());
        for (schema, table) in [
            ("public", "locks\"; DROP TABLE x; --"),
            ("locks\"; DROP TABLE x; --", "t"),
            ("public", ""),
            ("public", "1abc"),
            ("public", "a-b"),
            ("public", "tablé"),
            ("public", &"x".repeat(54)),
            (&"s".repeat(64) as &str, "t"),
        ] {
            let err = base().schema(schema).table(table).validate().unwrap_err();
            assert!(
                matches!(err, LockError::InvalidConfig { .. }),
                "{schema}.{table}: {err}"
            );
        }
    }
}
