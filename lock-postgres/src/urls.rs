//! Reading a `postgres://` URL without ever showing its password: where
//! its user info may end (a redaction and a URL parser can disagree), and
//! which query parameters reach sqlx (which logs the others with their
//! values).

/// Whether `url`'s user info, read as `redact_url` reads it (everything up
/// to the last `@`, if a `:` comes before any `/`, `?` or `#`), holds a
/// `/`, `?` or `#`: a URL parser ends the host at the first of them, and
/// would take the rest of a password for a path (the database name) or a
/// query; and for an `@` in a query or fragment, the redaction would take
/// the host's `:` for the password's.
pub(crate) fn ambiguous_userinfo(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let Some(at) = rest.rfind('@') else {
        return false;
    };
    let userinfo = &rest[..at];
    match (userinfo.find(['/', '?', '#']), userinfo.find(':')) {
        (Some(delimiter), Some(colon)) => colon < delimiter,
        _ => false,
    }
}

/// The query parameters sqlx reads (the rest it ignores, logging each
/// with its value: a password split at an unescaped `&` would show).
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

/// The parameters sqlx reads, in order; the others are dropped here with
/// a warning naming them, but never their values, nor any name after a
/// password (which may be part of it, split at an unescaped `&`).
pub(crate) fn known_to_sqlx(pairs: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut past_password = false;
    let mut kept = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        let known = SQLX_PARAMS.contains(&key.as_str()) || key.starts_with("options[");
        if known {
            past_password |= key == "password";
            kept.push((key, value));
        } else if past_password {
            tracing::warn!(
                "ignoring an unrecognized connect parameter after the password (not shown: it may be part of it)"
            );
        } else {
            tracing::warn!(parameter = %key, "ignoring unrecognized connect parameter");
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use lockcore::LockError;

    use crate::PostgresConfig;
    use crate::config::Source;

    #[test]
    fn an_at_past_the_host_is_never_shown_and_refused_without_user_info() {
        // The parser reads a user info: accepted, shown by nobody.
        let config =
            PostgresConfig::from_url("postgres://u:s3cret@h:5432/db?application_name=a@b").unwrap();
        let Source::Options(options) = &config.source else {
            panic!("expected options")
        };
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
}
