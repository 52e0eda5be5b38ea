//! The checks a `zk://` URL passes before [`StoreUrl`](lockcore::backend::StoreUrl)
//! reads it, so that no error shows a part of the URL that may hold a
//! password: the scheme, the user info (up to the last `@`, as
//! [`redact_url`](lockcore::backend::redact_url) reads it, so a password may
//! hold `#/?@:` unescaped), the hosts, and the options' names. And the old
//! duration forms, read for one more release.

use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::StoreUrl;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use super::connect_string;

/// What a password may hold unescaped, but `StoreUrl` reads as the end of
/// the user info.
const USERINFO_ENDS: &AsciiSet = &CONTROLS.add(b'#').add(b'/').add(b'?').add(b'@');

/// `scheme://rest` with its user info percent-encoded where `StoreUrl`
/// would cut it, once the parts an error may show are known to hold no
/// secret.
///
/// # Errors
/// [`LockError::InvalidConfig`] showing no part of the URL but its scheme
/// (only when it is a scheme's word).
pub(super) fn normalized(scheme: &str, rest: &str) -> Result<String, LockError> {
    if !super::SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        let shown = match scheme_word(scheme) {
            true => format!("{scheme}://"),
            false => "this".to_owned(),
        };
        return Err(LockError::config(format!(
            "{shown} is not a ZooKeeper URL: expected zk://, zookeeper:// or zks:// (TLS)"
        )));
    }
    // The user info ends at the last `@` if no `/`, `?` or `#` comes before
    // the user name's `:` (else that `@` is in the path or the query).
    let userinfo_end = rest.rfind('@').filter(|&at| {
        let userinfo = &rest[..at];
        match (userinfo.find(['/', '?', '#']), userinfo.find(':')) {
            (Some(delimiter), Some(colon)) => colon < delimiter,
            (Some(_), None) => false,
            (None, _) => true,
        }
    });
    let (userinfo, after) = match userinfo_end {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    if after.contains('#') {
        return Err(LockError::config(
            "a ZooKeeper URL has no #fragment (write a # in the password as %23); the URL is not shown",
        ));
    }
    let (before_query, query) = after.split_once('?').unwrap_or((after, ""));
    let hosts = before_query.split('/').next().unwrap_or_default();
    if hosts.contains('@') || !connect_string(hosts) {
        return Err(LockError::config(
            "a ZooKeeper URL's hosts must be a connect string, host:port[,host:port...] (the one given is not shown)",
        ));
    }
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(key, _)| key);
        if !option_word(key) {
            return Err(LockError::config(format!(
                "a ZooKeeper URL option whose name is not shown (known: {})",
                super::ZooKeeperConfig::URL_OPTIONS.join(", ")
            )));
        }
    }
    Ok(match userinfo {
        Some(userinfo) => format!(
            "{scheme}://{}@{after}",
            utf8_percent_encode(userinfo, USERINFO_ENDS)
        ),
        None => format!("{scheme}://{after}"),
    })
}

/// A URL that passed [`normalized`] but that `StoreUrl` refuses (a bad
/// escape, an `@` in the path): said without showing it.
pub(super) fn unparsable() -> LockError {
    LockError::config(
        "a ZooKeeper URL that does not parse (not shown): percent-encode '@' in the path, \
         and write escapes as %XX of UTF-8",
    )
}

/// A host of a URL as the connect string writes it (IPv6 in brackets).
pub(super) fn host(host: &lockcore::backend::Host) -> String {
    let name = match host.name.contains(':') {
        true => format!("[{}]", host.name),
        false => host.name.clone(),
    };
    match host.port {
        Some(port) => format!("{name}:{port}"),
        None => name,
    }
}

/// Option `name` as a duration: `30s`, `250ms`, `1m`; or, until the next
/// release, a form this adapter read before (`2minutes`, `1m 30s`, `2sec`),
/// with a one-line warning.
///
/// # Errors
/// A value that is neither, not shown.
pub(super) fn take_duration(url: &mut StoreUrl, name: &str) -> Result<Option<Duration>, LockError> {
    let mut strict = url.clone();
    let refused = match strict.take_duration(name) {
        Ok(value) => {
            *url = strict;
            return Ok(value);
        }
        Err(refused) => refused,
    };
    let value = url.take(name).unwrap_or_default();
    let old = humantime::parse_duration(&value).map_err(|_| refused)?;
    tracing::warn!(
        url = %url.redacted(),
        "URL option {name}: write the duration as 30s, 250ms or 1m; this form is read until the next release"
    );
    Ok(Some(old))
}

/// `auth=digest` or `auth=sasl` (the `sasl` feature): how the URL's
/// credentials authenticate; `None` when not given (digest).
///
/// # Errors
/// Another value (not shown: it may be a misplaced secret), or `sasl`
/// without the feature.
pub(super) fn auth_scheme(url: &mut StoreUrl) -> Result<Option<super::Scheme>, LockError> {
    let Some(value) = url.take("auth") else {
        return Ok(None);
    };
    match value.to_ascii_lowercase().as_str() {
        "digest" => Ok(Some(super::Scheme::Digest)),
        #[cfg(feature = "sasl")]
        "sasl" => Ok(Some(super::Scheme::Sasl)),
        #[cfg(not(feature = "sasl"))]
        "sasl" => Err(LockError::config(
            "auth=sasl needs lock-zookeeper's `sasl` feature (distlock's `zookeeper-sasl`)",
        )),
        _ => Err(LockError::config(
            "URL option auth must be digest or sasl (the value given is not shown)",
        )),
    }
}

/// TLS from the URL: `zks://` turns it on and needs `tls_ca`, the PEM file
/// of the CA the servers' certificates chain to; `tls_cert` and `tls_key`
/// (together) name a client certificate and its key. They are handed to
/// the config's builder methods.
///
/// # Errors
/// A TLS option on a `zk://` URL, `zks://` without `tls_ca` or without the
/// `tls` feature, a file that cannot be read, bad PEM.
pub(super) fn certificates(
    url: &mut StoreUrl,
    config: super::ZooKeeperConfig,
) -> Result<super::ZooKeeperConfig, LockError> {
    let ca = url.take_path("tls_ca")?;
    let cert = url.take_path("tls_cert")?;
    let key = url.take_path("tls_key")?;
    if url.scheme() != "zks" {
        if ca.is_some() || cert.is_some() || key.is_some() {
            return Err(LockError::config(
                "URL options tls_ca, tls_cert and tls_key need a zks:// URL (TLS)",
            ));
        }
        return Ok(config);
    }
    let Some(ca) = ca else {
        return Err(LockError::config(
            "a zks:// URL needs tls_ca=PATH, the PEM file of the CA that signed the servers' \
             certificates (ZooKeeper's client trusts no system roots)",
        ));
    };
    #[cfg(not(feature = "tls"))]
    {
        let _ = (ca, cert, key, config);
        Err(LockError::config(
            "zks:// needs lock-zookeeper's `tls` feature (distlock's `zookeeper-tls`)",
        ))
    }
    #[cfg(feature = "tls")]
    {
        let config = config.tls_root_cert_pem(pem("tls_ca", &ca)?)?;
        match (cert, key) {
            (None, None) => Ok(config),
            (Some(cert), Some(key)) => {
                config.tls_client_identity_pem(pem("tls_cert", &cert)?, pem("tls_key", &key)?)
            }
            _ => Err(LockError::config(
                "URL options tls_cert and tls_key go together",
            )),
        }
    }
}

/// The contents of the PEM file `path` that option `option` names (a path
/// is no secret: it is shown).
#[cfg(feature = "tls")]
fn pem(option: &str, path: &std::path::Path) -> Result<Vec<u8>, LockError> {
    std::fs::read(path).map_err(|e| {
        LockError::config_caused_by(format!("cannot read {option} {}", path.display()), e)
    })
}

/// Whether `scheme` is a URL scheme's word (safe to show).
fn scheme_word(scheme: &str) -> bool {
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Whether `key` looks like an option's name (lower-case words joined by
/// `_`): safe to show in an error, unlike a piece of a mistyped URL.
fn option_word(key: &str) -> bool {
    (1..=32).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}
