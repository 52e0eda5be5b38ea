//! `etcd://` and `etcds://` URLs, read through [`StoreUrl`], the one parser
//! and option vocabulary of every adapter:
//!
//! | option | meaning | value | read until the next release |
//! |---|---|---|---|
//! | `timeout` | the longest one etcd request may take (default 5s) | a duration: `500ms`, `2s` | a bare number of seconds (`timeout=1.5`) |
//! | `connect_timeout` | the longest connecting to an endpoint may take (default 3s) | a duration | |
//! | `prefix` | the key prefix (default `distlock/`); the URL's path says the same | text | |
//! | `tls_ca` | PEM file of the CA to trust (implies TLS) | a path | `ca` |
//! | `tls_cert`, `tls_key` | PEM files of the client's certificate and key (together) | a path | `cert`, `key` |
//! | `tls_domain` | the name the servers' certificates must carry (implies TLS) | text | `domain` |
//! | `password_file` | read the password from this file's first line | a path | |
//!
//! A password holding `/`, `?`, `#` or `@` is percent-encoded (`%2F`,
//! `%3F`, `%23`, `%40`). Written raw, it is still read (the user info runs to
//! the last `@`, as [`redact_url`] hides it) until the next release, with a
//! warning.

use std::path::Path;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{StoreUrl, parse_duration, redact_url};

use super::{EtcdConfig, TlsConfig};

/// The schemes an etcd URL may have.
const SCHEMES: [&str; 2] = ["etcd", "etcds"];

/// Every option the URL knows, as the error for an unknown one lists them.
const KNOWN: [&str; 8] = [
    "timeout",
    "connect_timeout",
    "prefix",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "tls_domain",
    "password_file",
];

/// The characters a raw password may hold that end the user info for
/// [`StoreUrl`]: percent-encoded before it reads the URL.
const ENDS_USERINFO: [char; 4] = ['/', '?', '#', '@'];

impl EtcdConfig {
    /// Parses `etcd://[user[:password]@]host:port[,host:port...][/prefix][?options]`
    /// (`etcds://` for TLS). `user`, `password` and `prefix` are
    /// percent-decoded; an empty path keeps the default prefix, and an `@`
    /// in it is written `%40`.
    ///
    /// Options: `timeout` and `connect_timeout` (durations: `500ms`, `2s`),
    /// `prefix`, `tls_ca`, `tls_cert` and `tls_key` (PEM files), `tls_domain`,
    /// `password_file` (the crate docs have the table).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] saying what is wrong (no password, and
    /// no option's value, is repeated in the message).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let encoded = encode_raw_password(url);
        let mut url = StoreUrl::parse(&encoded, &SCHEMES).map_err(|e| {
            if encoded == url {
                e
            } else {
                // Said of the URL as given: the encoded one reads differently.
                LockError::config(format!(
                    "{} is not a usable etcd URL (percent-encode the password's '/', '?', '#' and '@')",
                    redact_url(url)
                ))
            }
        })?;
        let tls = url.scheme() == "etcds";
        if url.hosts().is_empty() {
            return Err(LockError::config(format!(
                "{}: an etcd URL needs host:port endpoints separated by commas",
                shown(&url)
            )));
        }
        // Without a scheme: `endpoints()` adds https:// once TLS is on (an
        // `etcds://` URL, or a TLS option).
        let endpoints: Vec<String> = url
            .hosts()
            .iter()
            .map(|host| {
                let name = if host.name.contains(':') {
                    format!("[{}]", host.name)
                } else {
                    host.name.clone()
                };
                match host.port {
                    Some(port) => format!("{name}:{port}"),
                    None => name,
                }
            })
            .collect();
        let mut config = EtcdConfig::new(endpoints);
        let password = url.take_password()?;
        match (url.user(), password) {
            (Some(user), password) => {
                config = config.user(user, password.unwrap_or_default());
            }
            (None, Some(_)) => {
                return Err(LockError::config(format!(
                    "{}: a password without a user name",
                    shown(&url)
                )));
            }
            (None, None) => {}
        }
        let path = url
            .path()
            .strip_prefix('/')
            .unwrap_or(url.path())
            .to_owned();
        match (url.take("prefix"), path.is_empty()) {
            (Some(_), false) => {
                return Err(LockError::config(format!(
                    "{}: the prefix is given twice, as the path and as prefix=: give one",
                    shown(&url)
                )));
            }
            (Some(prefix), true) => config = config.prefix(prefix),
            (None, false) => config = config.prefix(path),
            (None, true) => {}
        }
        if let Some(timeout) = take_timeout(&mut url)? {
            config = config.request_timeout(timeout);
        }
        if let Some(timeout) = url.take_duration("connect_timeout")? {
            config = config.connect_timeout(timeout);
        }
        let mut tls_config = tls.then(TlsConfig::new);
        if let Some(ca) = take_file(&mut url, "tls_ca", "ca")? {
            tls_config = Some(tls_config.unwrap_or_default().ca_pem(ca));
        }
        if let Some(domain) = url.take_renamed("tls_domain", "domain") {
            tls_config = Some(tls_config.unwrap_or_default().domain(domain));
        }
        let cert = take_file(&mut url, "tls_cert", "cert")?;
        let key = take_file(&mut url, "tls_key", "key")?;
        match (cert, key) {
            (Some(cert), Some(key)) => {
                tls_config = Some(tls_config.unwrap_or_default().identity_pem(cert, key));
            }
            (None, None) => {}
            _ => {
                return Err(LockError::config(format!(
                    "{}: tls_cert and tls_key must be given together",
                    shown(&url)
                )));
            }
        }
        if let Some(tls_config) = tls_config {
            config = config.tls(tls_config);
        }
        url.finish(&KNOWN)?;
        config.validate()?;
        Ok(config)
    }
}

/// `url` with a raw password's `/`, `?`, `#` and `@` percent-encoded (with a
/// warning), so [`StoreUrl`] reads the user info as far as the last `@`.
fn encode_raw_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some(at) = userinfo_end(rest) else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    if !userinfo.contains(ENDS_USERINFO) {
        return url.to_owned();
    }
    let shown = redact_url(url);
    tracing::warn!(
        // Without the query: an option's value may be a secret.
        url = %shown.split('?').next().unwrap_or_default(),
        "the etcd URL's user info holds a raw '/', '?', '#' or '@': percent-encode them \
         (%2F, %3F, %23, %40); the raw form is read until the next release"
    );
    let mut encoded = String::with_capacity(url.len() + 8);
    encoded.push_str(scheme);
    encoded.push_str("://");
    for c in userinfo.chars() {
        match c {
            '/' => encoded.push_str("%2F"),
            '?' => encoded.push_str("%3F"),
            '#' => encoded.push_str("%23"),
            '@' => encoded.push_str("%40"),
            c => encoded.push(c),
        }
    }
    encoded.push_str(&rest[at..]);
    encoded
}

/// Where the user info of the part after `scheme://` ends: at its last
/// `@`, unless a `/`, `?` or `#` comes before the user name's `:` (then that
/// `@` is in the path or query). As [`redact_url`] reads it.
fn userinfo_end(rest: &str) -> Option<usize> {
    rest.rfind('@').filter(|&at| {
        let userinfo = &rest[..at];
        match (userinfo.find(['/', '?', '#']), userinfo.find(':')) {
            (Some(delimiter), Some(colon)) => colon < delimiter,
            (Some(_), None) => false,
            (None, _) => true,
        }
    })
}

/// `timeout`, a duration; a bare number (the old form) is read as seconds,
/// with a warning.
fn take_timeout(url: &mut StoreUrl) -> Result<Option<Duration>, LockError> {
    let Some(value) = url.take("timeout") else {
        return Ok(None);
    };
    if let Some(timeout) = parse_duration(&value) {
        return Ok(Some(timeout));
    }
    let seconds = value
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            LockError::config(format!(
                "{}: URL option timeout: expected a duration such as 500ms, 2s or 1m",
                shown(url)
            ))
        })?;
    tracing::warn!(
        url = %shown(url),
        "URL option timeout is a duration now (timeout=2s); a bare number of seconds is read until the next release"
    );
    Ok(Some(seconds))
}

/// The contents of the PEM file option `name` (or its old spelling `old`).
fn take_file(url: &mut StoreUrl, name: &str, old: &str) -> Result<Option<Vec<u8>>, LockError> {
    let Some(path) = url.take_renamed(name, old) else {
        return Ok(None);
    };
    if path.is_empty() {
        return Err(LockError::config(format!(
            "{}: URL option {name}: expected a file path",
            shown(url)
        )));
    }
    // The path is not repeated: a value may be a secret given the wrong name.
    std::fs::read(Path::new(&path)).map(Some).map_err(|e| {
        LockError::config_caused_by(
            format!(
                "{}: cannot read the file URL option {name} names",
                shown(url)
            ),
            e,
        )
    })
}

/// The URL as an error may show it: redacted, without its query (an
/// option's value may be a secret given the wrong name).
fn shown(url: &StoreUrl) -> String {
    let redacted = url.redacted();
    redacted.split('?').next().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests;
