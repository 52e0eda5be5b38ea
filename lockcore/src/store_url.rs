//! `StoreUrl`: the one parser of every store URL, and the one option
//! vocabulary.
//!
//! Every adapter takes `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?options]`
//! and reads its options through this type, so the same idea has the same
//! name and the same syntax on every scheme:
//!
//! | option | meaning | value |
//! |---|---|---|
//! | `timeout` | the longest one store request may take | a duration: `500ms`, `2s`, `1m` |
//! | `connect_timeout` | the longest connecting may take | a duration (a bare number is seconds, as libpq reads it) |
//! | `session_timeout` | a session's timeout, where leases live as long as a session | a duration |
//! | `prefix` | the namespace of every key the adapter writes | text |
//! | `tls_ca`, `tls_cert`, `tls_key` | PEM files: the CA to trust, the client's certificate and key | a path |
//! | `tls_domain` | the name the server's certificate must carry, when not the host's | text |
//! | `password_file` | read the password from this file (first line) instead of the URL | a path |
//!
//! Durations are parsed once, here; booleans are `true`/`false`. An option
//! nobody took is an error naming the options the scheme knows, and an old
//! spelling is still read for one release with a one-line warning naming the
//! new one ([`StoreUrl::take_renamed`]). Errors and `Debug` show the URL only
//! through [`redact_url`](crate::backend::redact_url).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::LockError;
use crate::support::redact_url;

/// A store URL taken apart, its options waiting to be taken.
///
/// ```
/// use std::time::Duration;
/// use lockcore::backend::StoreUrl;
///
/// let mut url = StoreUrl::parse("etcd://u:p%40ss@h1:2379,h2/locks?timeout=500ms", &["etcd", "etcds"])?;
/// assert_eq!(url.password(), Some("p@ss"));
/// assert_eq!(url.hosts().len(), 2);
/// assert_eq!(url.take_duration("timeout")?, Some(Duration::from_millis(500)));
/// url.finish(&["timeout"])?;
/// # Ok::<(), lockcore::LockError>(())
/// ```
#[derive(Clone)]
pub struct StoreUrl {
    raw: String,
    scheme: String,
    user: Option<String>,
    password: Option<String>,
    hosts: Vec<Host>,
    path: String,
    options: Vec<(String, String)>,
}

/// One `host[:port]` of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The host name or address (IPv6 without its brackets).
    pub name: String,
    /// The port, if the URL gives one.
    pub port: Option<u16>,
}

impl StoreUrl {
    /// Takes `url` apart. `schemes` are the schemes the caller serves; any
    /// other is refused.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for text that is not such a URL, another
    /// scheme, a bad port or escape; the message shows the URL redacted.
    pub fn parse(url: &str, schemes: &[&str]) -> Result<StoreUrl, LockError> {
        let shown = redact_url(url);
        let bad = |why: &str| LockError::config(format!("{shown} is not a usable URL: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://..."))?;
        let scheme = scheme.to_ascii_lowercase();
        if !schemes.contains(&scheme.as_str()) {
            return Err(bad(&format!(
                "the scheme must be one of {}",
                schemes.join(", ")
            )));
        }
        // The user info ends at the last `@` before the path: a password may
        // hold unescaped characters, but then it must be percent-encoded to
        // be read right, which the check below enforces.
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (userinfo, hosts) = match rest[..authority_end].rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..authority_end]),
            None => (None, &rest[..authority_end]),
        };
        if rest[authority_end..].contains('@') && userinfo.is_none() {
            return Err(bad(
                "an '@' after the host: percent-encode a password's '/', '?', '#' and '@' (%2F, %3F, %23, %40)",
            ));
        }
        let tail = &rest[authority_end..];
        if tail.contains('#') {
            return Err(bad(
                "a fragment ('#') has no meaning here: percent-encode it (%23)",
            ));
        }
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (info, None),
                };
                let user = Some(decode(user).map_err(|_| bad("the user name is not valid UTF-8"))?)
                    .filter(|u| !u.is_empty());
                let password = password
                    .map(decode)
                    .transpose()
                    .map_err(|_| bad("the password is not valid UTF-8"))?;
                (user, password)
            }
        };
        let hosts = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| parse_host(h).map_err(|why| bad(&why)))
            .collect::<Result<Vec<_>, _>>()?;
        let options = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                Ok((
                    decode(key).map_err(|_| bad("an option name is not valid UTF-8"))?,
                    decode(value).map_err(|_| bad("an option value is not valid UTF-8"))?,
                ))
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        Ok(StoreUrl {
            raw: url.to_owned(),
            scheme,
            user,
            password,
            hosts,
            path: decode(path).map_err(|_| bad("the path is not valid UTF-8"))?,
            options,
        })
    }

    /// The scheme, lower case.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name, decoded.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password, decoded; see also [`take_password`](Self::take_password).
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The hosts, in order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The path, decoded (`""` or starting with `/`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The URL as it may be shown (see [`redact_url`]).
    pub fn redacted(&self) -> String {
        redact_url(&self.raw)
    }

    /// The password: from `password_file` when that option is given (its
    /// first line; a URL may not carry both), else from the URL.
    ///
    /// # Errors
    /// Both given, or the file cannot be read.
    pub fn take_password(&mut self) -> Result<Option<String>, LockError> {
        match self.take_path("password_file")? {
            None => Ok(self.password.clone()),
            Some(_) if self.password.is_some() => Err(self.invalid(
                "password_file",
                "the URL carries a password too: give one or the other",
            )),
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    LockError::config_caused_by(
                        format!("cannot read password_file {}", path.display()),
                        e,
                    )
                })?;
                Ok(Some(text.lines().next().unwrap_or("").to_owned()))
            }
        }
    }

    /// The value of option `name`, taken (so [`finish`](Self::finish) does
    /// not count it as unknown). Given twice, the last one wins.
    pub fn take(&mut self, name: &str) -> Option<String> {
        let mut found = None;
        self.options.retain(|(key, value)| {
            if key == name {
                found = Some(value.clone());
                false
            } else {
                true
            }
        });
        found
    }

    /// Option `name`, or its old spelling `old` (read with a one-line
    /// warning that names the new one; when both are given, `name` wins).
    pub fn take_renamed(&mut self, name: &str, old: &str) -> Option<String> {
        let old_value = self.take(old);
        let value = self.take(name);
        if old_value.is_some() {
            tracing::warn!(
                url = %self.without_query(),
                "URL option {old} is renamed {name}{}; the old name is read until the next release",
                if value.is_some() { " (both given: the old one is ignored)" } else { "" }
            );
        }
        value.or(old_value)
    }

    /// Option `name` as a duration (`250ms`, `2s`, `1m`, `1h`).
    ///
    /// # Errors
    /// A value that is not such a duration.
    pub fn take_duration(&mut self, name: &str) -> Result<Option<Duration>, LockError> {
        self.take(name)
            .map(|value| self.duration(name, &value))
            .transpose()
    }

    /// Option `name` as a duration, or its old spelling `old` read as
    /// `old_unit`s (`lock_op_timeout_ms=500` with `Duration::from_millis(1)`,
    /// `timeout=1.5` with `Duration::from_secs(1)`), with a warning.
    ///
    /// # Errors
    /// A value that is not a duration (or, under the old name, a number).
    pub fn take_duration_renamed(
        &mut self,
        name: &str,
        old: &str,
        old_unit: Duration,
    ) -> Result<Option<Duration>, LockError> {
        if let Some(value) = self.take(old) {
            let new = self.take_duration(name)?;
            tracing::warn!(
                url = %self.without_query(),
                "URL option {old} is renamed {name} (a duration such as 500ms or 2s){}; the old name is read until the next release",
                if new.is_some() { " (both given: the old one is ignored)" } else { "" }
            );
            if new.is_some() {
                return Ok(new);
            }
            let count: f64 = value
                .parse()
                .ok()
                .filter(|n: &f64| n.is_finite() && *n >= 0.0)
                .ok_or_else(|| self.invalid(old, "not a number"))?;
            return Duration::try_from_secs_f64(old_unit.as_secs_f64() * count)
                .map(Some)
                .map_err(|_| self.invalid(old, "too large"));
        }
        self.take_duration(name)
    }

    /// Option `name` as `true` or `false`.
    ///
    /// # Errors
    /// Any other value.
    pub fn take_bool(&mut self, name: &str) -> Result<Option<bool>, LockError> {
        self.take(name)
            .map(|value| match value.as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(self.invalid(name, "expected true or false")),
            })
            .transpose()
    }

    /// Option `name` as a number.
    ///
    /// # Errors
    /// A value that is not a non-negative integer that fits.
    pub fn take_u32(&mut self, name: &str) -> Result<Option<u32>, LockError> {
        self.take(name)
            .map(|value| {
                value
                    .parse()
                    .map_err(|_| self.invalid(name, "expected a whole number"))
            })
            .transpose()
    }

    /// Option `name` as a file path.
    ///
    /// # Errors
    /// An empty value.
    pub fn take_path(&mut self, name: &str) -> Result<Option<PathBuf>, LockError> {
        self.take(name)
            .map(|value| {
                if value.is_empty() {
                    Err(self.invalid(name, "expected a file path"))
                } else {
                    Ok(PathBuf::from(value))
                }
            })
            .transpose()
    }

    /// The options nobody took, in order (for an adapter that hands them on
    /// to its client library, which checks them itself).
    pub fn take_rest(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.options)
    }

    /// Ends the reading: an option nobody took is an error naming the ones
    /// `known` to this scheme.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for the first unknown option.
    pub fn finish(self, known: &[&str]) -> Result<(), LockError> {
        match self.options.first() {
            None => Ok(()),
            Some((key, _)) => Err(LockError::config(format!(
                "{}: unknown {} URL option {key:?} (known: {})",
                self.without_query(),
                self.scheme,
                known.join(", ")
            ))),
        }
    }

    fn duration(&self, name: &str, value: &str) -> Result<Duration, LockError> {
        parse_duration(value)
            .ok_or_else(|| self.invalid(name, "expected a duration such as 500ms, 2s or 1m"))
    }

    /// Neither the value nor the rest of the query is shown: it may be a
    /// secret given the wrong name.
    fn invalid(&self, name: &str, why: &str) -> LockError {
        LockError::config(format!(
            "{}: URL option {name}: {why}",
            self.without_query()
        ))
    }

    /// The URL as it may be shown, without its query.
    fn without_query(&self) -> String {
        let shown = self.redacted();
        shown.split('?').next().unwrap_or_default().to_owned()
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.redacted()).finish()
    }
}

/// A duration as `250ms`, `2s`, `1.5s`, `1m`, `1h` (units required, except
/// a bare `0`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok().filter(|n: &f64| n.is_finite())?;
    let unit = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(number * unit).ok()
}

fn decode(text: &str) -> Result<String, std::str::Utf8Error> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
}

fn parse_host(text: &str) -> Result<Host, String> {
    let (name, port) = if let Some(rest) = text.strip_prefix('[') {
        let (name, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("an IPv6 host without its ']': {text:?}"))?;
        (name, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (text, None),
        }
    };
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| format!("bad port {p:?} of host {name:?}"))
        })
        .transpose()?;
    if name.is_empty() {
        return Err("a host without a name".into());
    }
    Ok(Host {
        name: name.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_a_url_apart() {
        let mut url = StoreUrl::parse(
            "zk://u:a%2Fb%3Fc%23d%40e@h1:2181,[::1]:2182,h3/locks/app?session_timeout=4s&x=%20y",
            &["zk"],
        )
        .unwrap();
        assert_eq!(url.user(), Some("u"));
        assert_eq!(url.password(), Some("a/b?c#d@e"));
        assert_eq!(
            url.hosts(),
            &[
                Host {
                    name: "h1".into(),
                    port: Some(2181)
                },
                Host {
                    name: "::1".into(),
                    port: Some(2182)
                },
                Host {
                    name: "h3".into(),
                    port: None
                },
            ]
        );
        assert_eq!(url.path(), "/locks/app");
        assert_eq!(
            url.take_duration("session_timeout").unwrap(),
            Some(Duration::from_secs(4))
        );
        assert_eq!(url.take("x").as_deref(), Some(" y"));
        url.finish(&[]).unwrap();
    }

    #[test]
    fn durations_need_units() {
        for (text, d) in [
            ("250ms", Some(Duration::from_millis(250))),
            ("2s", Some(Duration::from_secs(2))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("1m", Some(Duration::from_secs(60))),
            ("0", Some(Duration::ZERO)),
            ("30", None),
            ("s", None),
            ("-1s", None),
            ("1e400s", None),
        ] {
            assert_eq!(parse_duration(text), d, "{text}");
        }
    }

    #[test]
    fn unknown_and_bad_options_are_refused_without_showing_values() {
        let err = StoreUrl::parse("redis://h?tiemout=1s", &["redis"])
            .unwrap()
            .finish(&["timeout"])
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown redis URL option \"tiemout\" (known: timeout)"),
            "{err}"
        );
        let mut url = StoreUrl::parse("redis://h?timeout=hunter2", &["redis"]).unwrap();
        let err = url.take_duration("timeout").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(StoreUrl::parse("http://h", &["redis"]).is_err());
        assert!(StoreUrl::parse("redis:/h", &["redis"]).is_err());
        assert!(StoreUrl::parse("redis://h:99999", &["redis"]).is_err());
    }

    #[test]
    fn an_unescaped_password_is_refused_and_never_shown() {
        for url in [
            "redis://u:Qz9/Xw@t@h:1",
            "redis://u:Qz9#Xw@h",
            "redis://u:Qz9?Xw@h",
        ] {
            let err = StoreUrl::parse(url, &["redis"]).unwrap_err().to_string();
            assert!(!err.contains("Qz9") && !err.contains("Xw"), "{url}: {err}");
        }
    }

    #[test]
    fn old_spellings_are_read_with_the_new_one_winning() {
        let mut url =
            StoreUrl::parse("postgres://h/db?lock_op_timeout_ms=1500", &["postgres"]).unwrap();
        assert_eq!(
            url.take_duration_renamed("timeout", "lock_op_timeout_ms", Duration::from_millis(1))
                .unwrap(),
            Some(Duration::from_millis(1500))
        );
        let mut both = StoreUrl::parse("etcd://h?timeout=2s&op_timeout=1", &["etcd"]).unwrap();
        assert_eq!(
            both.take_renamed("timeout", "op_timeout").as_deref(),
            Some("2s")
        );
        both.finish(&[]).unwrap();
    }

    #[test]
    fn a_password_file_replaces_the_url_password() {
        let dir = std::env::temp_dir().join(format!("store-url-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let mut url = StoreUrl::parse(
            &format!("redis://u@h?password_file={}", file.display()),
            &["redis"],
        )
        .unwrap();
        assert_eq!(url.take_password().unwrap().as_deref(), Some("s3cret"));
        let mut both = StoreUrl::parse(
            &format!("redis://u:x@h?password_file={}", file.display()),
            &["redis"],
        )
        .unwrap();
        assert!(both.take_password().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
