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
            "{shown} is not a ZooKeeper URL: expected zk:// or zookeeper://"
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
