//! Reading a `postgres://` URL: this crate's options through lockcore's
//! `StoreUrl` (the one option vocabulary, old `lock_*` spellings still read
//! with a warning), and libpq's own parameters handed on to sqlx, without
//! ever showing the password.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{StoreUrl, parse_duration};
use sqlx::postgres::PgConnectOptions;

use super::{OWN_OPTIONS, PostgresConfig};

/// `url` as `StoreUrl` may read and show it: an `@` past the host (in the
/// path or query) percent-encoded, which changes no value (both decode it)
/// and leaves the redaction no second candidate for where the user info
/// ends. With no user info before such an `@`, the URL is refused showing
/// nothing of it: it is a password with an unescaped `/`, `?` or `#`, and a
/// redaction could not tell where it ends either.
pub(crate) fn unambiguous(url: &str) -> Result<Cow<'_, str>, LockError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(Cow::Borrowed(url));
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    if !tail.contains('@') {
        return Ok(Cow::Borrowed(url));
    }
    if !authority.contains('@') {
        return Err(LockError::config(format!(
            "<a {}-byte URL, not shown>: it holds an @ after a /, ? or # and no user info before them (a password with an unescaped /, ? or #?); percent-encode them (%2F, %3F, %23)",
            url.len()
        )));
    }
    Ok(Cow::Owned(format!(
        "{scheme}://{authority}{}",
        tail.replace('@', "%40")
    )))
}

/// The query parameters sqlx reads.
const SQLX_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// libpq's other connection parameters: sqlx ignores them, so they are
/// dropped with a warning, not refused (a URL shared with libpq tools keeps
/// working here).
const LIBPQ_ONLY: &[&str] = &[
    "passfile",
    "require_auth",
    "channel_binding",
    "client_encoding",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "requiressl",
    "sslnegotiation",
    "sslcompression",
    "sslpassword",
    "sslcertmode",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslkeylogfile",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
];

/// This crate's options as a URL gives them (`None`: not given).
pub(crate) struct Options {
    schema: Option<String>,
    table: Option<String>,
    pool_size: Option<u32>,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    create_schema: Option<bool>,
    turnstiles: Option<u32>,
    failover_lock_delay: Option<Duration>,
    /// `tls_ca`, `tls_cert`, `tls_key` as the libpq parameters they stand for.
    tls: Vec<(&'static str, String)>,
}

impl Options {
    /// Takes this crate's options (new names and old) out of `url`.
    pub(crate) fn take(url: &mut StoreUrl) -> Result<Options, LockError> {
        let shown = url.redacted();
        let bad = |name: &str, why: &str| {
            LockError::config(format!(
                "{}: URL option {name}: {why}",
                without_query(&shown)
            ))
        };
        let number = |name: &str, value: Option<String>, max: u32| {
            value
                .map(|v| {
                    v.parse::<u32>()
                        .ok()
                        .filter(|n| *n <= max)
                        .ok_or_else(|| bad(name, &format!("expected a whole number up to {max}")))
                })
                .transpose()
        };
        let pool_size = number(
            "pool_size",
            url.take_renamed("pool_size", "lock_pool_size"),
            u32::MAX,
        )?;
        if pool_size == Some(0) {
            return Err(bad("pool_size", "expected at least 1 connection"));
        }
        let turnstiles = number(
            "turnstiles",
            url.take_renamed("turnstiles", "lock_turnstiles"),
            PostgresConfig::MAX_TURNSTILES,
        )?;
        let create_schema = url
            .take_renamed("create_schema", "lock_create_schema")
            .map(|v| match v.as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(bad("create_schema", "expected true or false")),
            })
            .transpose()?;
        let timeout =
            url.take_duration_renamed("timeout", "lock_op_timeout_ms", Duration::from_millis(1))?;
        // libpq's `connect_timeout` is whole seconds; a duration works too.
        let connect_timeout = url
            .take("connect_timeout")
            .map(|v| match v.parse::<u64>() {
                Ok(seconds) => Ok(Duration::from_secs(seconds)),
                Err(_) => parse_duration(&v).ok_or_else(|| {
                    bad(
                        "connect_timeout",
                        "expected a duration such as 500ms or 5s, or whole seconds",
                    )
                }),
            })
            .transpose()?;
        // The old name is read only when the new one is not given.
        let old_connect_timeout = url.take_duration_renamed(
            "connect_timeout",
            "lock_connect_timeout_ms",
            Duration::from_millis(1),
        )?;
        let connect_timeout = connect_timeout.or(old_connect_timeout);
        if timeout.is_some_and(|t| t.is_zero()) {
            return Err(bad("timeout", "must be positive"));
        }
        if connect_timeout.is_some_and(|t| t.is_zero()) {
            return Err(bad("connect_timeout", "must be positive"));
        }
        let failover_lock_delay = url.take_duration("failover_lock_delay")?;
        let mut tls = Vec::new();
        for (name, libpq) in [
            ("tls_ca", "sslrootcert"),
            ("tls_cert", "sslcert"),
            ("tls_key", "sslkey"),
        ] {
            if let Some(path) = url.take_path(name)? {
                tls.push((libpq, path.to_string_lossy().into_owned()));
            }
        }
        Ok(Options {
            schema: url.take_renamed("schema", "lock_schema"),
            table: url.take_renamed("table", "lock_table"),
            pool_size,
            timeout,
            connect_timeout,
            create_schema,
            turnstiles,
            failover_lock_delay,
            tls,
        })
    }

    /// Sets what the URL gave on `config`.
    pub(crate) fn apply(self, config: &mut PostgresConfig) {
        if let Some(schema) = self.schema {
            config.schema = schema;
        }
        if let Some(table) = self.table {
            config.table = table;
        }
        if let Some(pool_size) = self.pool_size {
            config.pool_size = pool_size;
        }
        if let Some(timeout) = self.timeout {
            config.op_timeout = timeout;
        }
        if let Some(timeout) = self.connect_timeout {
            config.connect_timeout = timeout;
        }
        if let Some(create) = self.create_schema {
            config.create_schema = create;
        }
        if let Some(turnstiles) = self.turnstiles {
            config.turnstiles = turnstiles;
        }
        if let Some(delay) = self.failover_lock_delay {
            config.failover_lock_delay = (!delay.is_zero()).then_some(delay);
        }
    }
}

/// The parameters left once this crate's options are taken (`rest`, in
/// order), checked: sqlx's are kept, with `tls_*` added as their libpq
/// names; libpq's others are dropped with a warning; anything else is an
/// unknown option, named (with the known ones) unless it follows a
/// password, which it may be part of (split at an unescaped `&`).
pub(crate) fn libpq_parameters(
    shown: &str,
    rest: Vec<(String, String)>,
    options: &Options,
) -> Result<Vec<(String, String)>, LockError> {
    let mut past_password = false;
    let mut kept = Vec::with_capacity(rest.len() + options.tls.len());
    for (key, value) in rest {
        if SQLX_PARAMS.contains(&key.as_str()) || key.starts_with("options[") {
            past_password |= key == "password";
            kept.push((key, value));
        } else if LIBPQ_ONLY.contains(&key.as_str()) {
            if past_password {
                tracing::warn!(
                    "ignoring a libpq parameter sqlx does not read, after the password (not shown: it may be part of it)"
                );
            } else {
                tracing::warn!(parameter = %key, "ignoring a libpq parameter sqlx does not read");
            }
        } else if past_password {
            return Err(LockError::config(format!(
                "{}: an unknown URL option after the password (not shown: it may be part of the password; percent-encode a password's '&' as %26)",
                without_query(shown)
            )));
        } else {
            return Err(LockError::config(format!(
                "{}: unknown postgres URL option {key:?} (known: {}, and libpq's parameters)",
                without_query(shown),
                OWN_OPTIONS.join(", ")
            )));
        }
    }
    for (libpq, path) in &options.tls {
        let aliases: &[&str] = match *libpq {
            "sslrootcert" => &["sslrootcert", "ssl-root-cert", "ssl-ca"],
            "sslcert" => &["sslcert", "ssl-cert"],
            _ => &["sslkey", "ssl-key"],
        };
        if kept.iter().any(|(key, _)| aliases.contains(&key.as_str())) {
            return Err(LockError::config(format!(
                "{}: both a tls_* option and libpq's {libpq}: give one",
                without_query(shown)
            )));
        }
        kept.push(((*libpq).to_owned(), path.clone()));
    }
    Ok(kept)
}

/// sqlx's options from `url` with its query replaced by `libpq`.
pub(crate) fn sqlx_options(
    url: &str,
    shown: &str,
    libpq: Vec<(String, String)>,
) -> Result<PgConnectOptions, LockError> {
    let mut parsed = url::Url::parse(url).map_err(|e| {
        LockError::config_caused_by(
            format!("{} is not a PostgreSQL URL", without_query(shown)),
            // The url crate names what is wrong, never the text.
            e.to_string(),
        )
    })?;
    if libpq.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(libpq);
    }
    PgConnectOptions::from_str(parsed.as_str()).map_err(|e| {
        LockError::config_caused_by(
            format!("{}: invalid connection settings", without_query(shown)),
            // sqlx's message names the bad parameter, never the password.
            e.to_string(),
        )
    })
}

/// A redacted URL without its query (a value there may be a secret given
/// the wrong name).
pub(crate) fn without_query(shown: &str) -> &str {
    shown.split('?').next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use lockcore::LockError;

    use crate::PostgresConfig;

    #[test]
    fn an_at_past_the_host_is_never_shown_and_refused_without_user_info() {
        // The parser reads a user info: accepted, shown by nobody.
        let config =
            PostgresConfig::from_url("postgres://u:s3cret@h:5432/db?application_name=a@b").unwrap();
        let options = config.connect_options();
        assert_eq!(options.get_application_name(), Some("a@b"));
        for url in [
            // A password's tail would be the database, a parameter's name.
            "postgres://u:12/s3cret@h/db",
            "postgres://u:12?s3cret@h/db",
            "postgres://h:5432/db?user=u&password=s3cret@x",
        ] {
            let err = PostgresConfig::from_url(url).unwrap_err();
            let text = format!("{err} {err:?}");
            assert!(
                matches!(err, LockError::InvalidConfig { .. }),
                "{url}: {text}"
            );
            assert!(!text.contains("s3cret"), "{url}: {text}");
            assert!(text.contains("percent-encode"), "{url}: {text}");
        }
    }

    #[test]
    fn tls_options_are_libpqs_ssl_parameters() {
        let config = PostgresConfig::from_url(
            "postgres://u@h/db?sslmode=verify-full&tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem",
        )
        .unwrap();
        let options = config.connect_options();
        let shown = format!("{options:?}");
        for path in ["/ca.pem", "/c.pem", "/k.pem"] {
            assert!(shown.contains(path), "{path}: {shown}");
        }
        let err = PostgresConfig::from_url("postgres://u@h/db?tls_ca=/a.pem&sslrootcert=/b.pem")
            .unwrap_err();
        assert!(err.to_string().contains("give one"), "{err}");
    }
}
