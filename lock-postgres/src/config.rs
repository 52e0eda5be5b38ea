//! `PostgresConfig`: where the locks live and how the backend talks to the server.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::redact_url;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::ident::Ident;
use crate::urls::{ambiguous_userinfo, known_to_sqlx};

/// URL query parameters this crate reads (and strips before sqlx sees the URL).
const OWN_PARAMS: &[&str] = &[
    "lock_schema",
    "lock_table",
    "lock_pool_size",
    "lock_op_timeout_ms",
    "lock_create_schema",
    "lock_turnstiles",
    "lock_connect_timeout_ms",
    "connect_timeout",
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
/// Extra URL parameters read by this crate: `lock_schema`, `lock_table`,
/// `lock_pool_size`, `lock_op_timeout_ms`, `lock_create_schema` (`true`/`false`),
/// `lock_turnstiles`, `lock_connect_timeout_ms`; and libpq's `connect_timeout`
/// (whole seconds), which sqlx ignores.
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
}

impl PostgresConfig {
    /// Default schema of the lock table.
    pub const DEFAULT_SCHEMA: &'static str = "public";
    /// Default lock table name; its sequence is `<table>_fence_seq`.
    pub const DEFAULT_TABLE: &'static str = "distlock_locks";
    /// Default number of turnstile connections per backend instance.
    pub const DEFAULT_TURNSTILES: u32 = 8;

    /// Connections in the pool `connect` builds (`lock_pool_size`).
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
        }
    }

    /// Parses a `postgres://` or `postgresql://` URL.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a URL that does not parse or a bad
    /// `lock_*` parameter; the message never contains the password.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        // An `@` past a `/`, `?` or `#`: a URL parser and a redaction may
        // disagree on where the user info ends, so nothing of it is shown.
        let ambiguous = ambiguous_userinfo(url);
        let shown = if ambiguous {
            format!("<a {}-byte URL, not shown>", url.len())
        } else {
            redact_url(url)
        };
        // Only `scheme://...`: anything else (`postgres:/u:pw@h`, a libpq
        // `host=.. password=..` string) would parse as a host-less URL whose
        // path, the password's tail included, becomes the database name.
        let scheme_ok = ["postgres://", "postgresql://"].iter().any(|prefix| {
            url.get(..prefix.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
        });
        if !scheme_ok {
            return Err(LockError::config(format!(
                "expected a postgres:// or postgresql:// URL, not {shown}"
            )));
        }
        let mut parsed = url::Url::parse(url).map_err(|e| {
            LockError::config_caused_by(
                format!("{shown} is not a PostgreSQL URL"),
                // The url crate names what is wrong, never the text.
                e.to_string(),
            )
        })?;
        // Where the redaction sees a user info and the parser none, the
        // parser took part of a password for the host, path or query.
        if ambiguous && parsed.username().is_empty() && parsed.password().is_none() {
            return Err(LockError::config(format!(
                "{shown}: it holds an @ after a /, ? or # and no user info (a password with an unescaped /, ? or #?); percent-encode them"
            )));
        }
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        // A value after a password may be part of it (split at an
        // unescaped `&`): errors do not show it.
        let password_at = pairs.iter().position(|(k, _)| k == "password");
        let (own, rest): (Vec<_>, Vec<_>) = pairs
            .into_iter()
            .enumerate()
            .partition(|(_, (k, _))| OWN_PARAMS.contains(&k.as_str()));
        let rest = known_to_sqlx(rest.into_iter().map(|(_, pair)| pair).collect());
        if rest.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(rest);
        }
        let options = PgConnectOptions::from_str(parsed.as_str()).map_err(|e| {
            LockError::config_caused_by(
                format!("{shown}: invalid connection settings"),
                // sqlx's message names the bad parameter, never the password.
                e.to_string(),
            )
        })?;
        let mut config = Self::from_options(options);
        for (at, (key, value)) in own {
            let shown = if password_at.is_some_and(|p| p < at) {
                "(not shown: it follows the password)".to_owned()
            } else {
                format!("{value:?}")
            };
            let bad = |why: &str| LockError::config(format!("URL parameter {key}={shown}: {why}"));
            match key.as_str() {
                "lock_schema" => config.schema = value,
                "lock_table" => config.table = value,
                "lock_pool_size" => {
                    config.pool_size = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad("expected a positive integer"))?;
                }
                "lock_op_timeout_ms" => {
                    config.op_timeout = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .map(Duration::from_millis)
                        .ok_or_else(|| bad("expected a positive number of milliseconds"))?;
                }
                "lock_connect_timeout_ms" => {
                    config.connect_timeout = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .map(Duration::from_millis)
                        .ok_or_else(|| bad("expected a positive number of milliseconds"))?;
                }
                "connect_timeout" => {
                    config.connect_timeout = value
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .map(Duration::from_secs)
                        .ok_or_else(|| bad("expected a positive number of seconds"))?;
                }
                "lock_create_schema" => {
                    config.create_schema =
                        value.parse().map_err(|_| bad("expected true or false"))?;
                }
                "lock_turnstiles" => {
                    config.turnstiles = value
                        .parse()
                        .ok()
                        .filter(|n| *n <= Self::MAX_TURNSTILES)
                        .ok_or_else(|| {
                        bad(&format!(
                            "expected a number of connections from 0 to {}",
                            Self::MAX_TURNSTILES
                        ))
                    })?;
                }
                _ => {} // only OWN_PARAMS were partitioned out
            }
        }
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

    /// The largest [`turnstiles`](Self::turnstiles) setting.
    pub const MAX_TURNSTILES: u32 = 64;

    /// Validated identifiers: `(schema, table, sequence)`.
    pub(crate) fn idents(&self) -> Result<(Ident, Ident, Ident), LockError> {
        let schema = Ident::new("schema", &self.schema, Ident::MAX_BYTES)?;
        let table = Ident::new(
            "table",
            &self.table,
            Ident::MAX_BYTES - crate::schema::SEQUENCE_SUFFIX.len(),
        )?;
        let sequence = table.with_suffix(crate::schema::SEQUENCE_SUFFIX);
        Ok((schema, table, sequence))
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
    fn own_parameters_are_read_and_stripped() {
        let config = PostgresConfig::from_url(
            "postgresql://u@h:1/d?lock_schema=locks&lock_table=t1&lock_pool_size=3&lock_op_timeout_ms=250&lock_create_schema=false&lock_turnstiles=0&application_name=app",
        )
        .unwrap();
        assert_eq!(
            (config.schema.as_str(), config.table.as_str()),
            ("locks", "t1")
        );
        assert_eq!(config.pool_size, 3);
        assert_eq!(config.op_timeout, Duration::from_millis(250));
        assert!(!config.create_schema);
        assert_eq!(config.turnstiles, 0);
        let Source::Options(options) = &config.source else {
            panic!("expected options")
        };
        assert_eq!(options.get_application_name(), Some("app"));
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
