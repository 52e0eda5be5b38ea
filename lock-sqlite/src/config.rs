//! `SqliteConfig`: where the lock file is, and how long to wait for it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use lockcore::LockError;
use lockcore::backend::{StoreUrl, redact_url};

use crate::error::shown;

/// Where the locks live and how long an operation may wait for the file.
///
/// URL form: `sqlite://PATH[?timeout=5s]` (`timeout_ms=N`, the old
/// spelling, is still read with a warning). `PATH` is taken as written, up
/// to an optional `?`, with `%XX` escapes decoded:
///
/// | URL | file |
/// |---|---|
/// | `sqlite:///var/lib/app/locks.db` | `/var/lib/app/locks.db` (absolute: three slashes) |
/// | `sqlite://locks.db`, `sqlite://./run/locks.db` | relative to the working directory at connect |
/// | `sqlite://~/locks.db` | not expanded: a directory named `~` |
///
/// `timeout` (default 5s) bounds how long one operation waits for
/// another process's write to the file. In-memory databases (`:memory:`,
/// `sqlite::memory:`, `mode=memory`) are refused: they are no lock between
/// processes.
#[derive(Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    path: PathBuf,
    timeout: Duration,
}

impl SqliteConfig {
    /// The default bound on one operation.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// The lock file at `path` (relative paths resolve against the working
    /// directory when connecting).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an empty path or an in-memory database.
    pub fn new(path: impl AsRef<Path>) -> Result<Self, LockError> {
        let path = path.as_ref();
        let text = path.to_string_lossy();
        if text.is_empty() {
            return Err(LockError::config(
                "the SQLite lock file path is empty: use sqlite://PATH",
            ));
        }
        if is_in_memory(&text) {
            return Err(LockError::config(format!(
                "{} is an in-memory SQLite database, private to one process: it cannot lock \
                 anything across processes; name a file, e.g. sqlite:///var/lib/app/locks.db",
                shown(path)
            )));
        }
        Ok(SqliteConfig {
            path: path.to_owned(),
            timeout: Self::DEFAULT_TIMEOUT,
        })
    }

    /// Sets the bound on one operation (waiting for another process's write
    /// included).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for zero or more than an hour.
    pub fn timeout(mut self, timeout: Duration) -> Result<Self, LockError> {
        if timeout.is_zero() || timeout > Duration::from_secs(3600) {
            return Err(LockError::config(format!(
                "timeout {timeout:?} must be between 1 ms and 1 hour"
            )));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// The lock file's path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bound on one operation.
    pub fn op_timeout(&self) -> Duration {
        self.timeout
    }
}

fn is_in_memory(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower == ":memory:"
        || lower.starts_with(":memory:?")
        || lower.starts_with("file::memory:")
        || lower.contains("mode=memory")
}

/// The options of a `sqlite://` URL.
const KNOWN: &[&str] = &["timeout"];

impl FromStr for SqliteConfig {
    type Err = LockError;

    /// The path is SQLite's own (a file name, not a host: `sqlite://locks.db`
    /// is relative), read here; the options after the first `?` go through
    /// [`StoreUrl`], the one option vocabulary of distlock.
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("sqlite::memory:") || lower.starts_with("sqlite://:memory:") {
            return Err(LockError::config(
                "sqlite::memory: is an in-memory database, private to one process: it cannot \
                 lock anything across processes; use sqlite://PATH to a file",
            ));
        }
        let rest = url
            .get(..9)
            .filter(|scheme| scheme.eq_ignore_ascii_case("sqlite://"))
            .map(|_| &url[9..])
            .ok_or_else(|| {
                LockError::config(format!(
                    "{:?} is not a SQLite lock URL: expected sqlite://PATH (sqlite:///abs/path.db, sqlite://rel/path.db)",
                    redact_url(url)
                ))
            })?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let path = percent_encoding::percent_decode_str(path)
            .decode_utf8()
            .map_err(|e| LockError::config_caused_by("the lock file path is not UTF-8", e))?;
        let mut config = SqliteConfig::new(path.as_ref())?;
        // Nothing of the URL is echoed but what `redact_url` shows of its
        // path: an option's value may be a secret given the wrong name.
        let shown = redact_url(url);
        let shown = shown.split('?').next().unwrap_or_default();
        let mut options = options(shown, query)?;
        if let Some(timeout) = options
            .take_duration_renamed("timeout", "timeout_ms", Duration::from_millis(1))
            .map_err(|e| at(shown, e))?
        {
            config = config.timeout(timeout)?;
        }
        options.finish(KNOWN).map_err(|e| at(shown, e))?;
        Ok(config)
    }
}

/// The options of `query` (the URL after its first `?`), read through
/// [`StoreUrl`]; errors name the file as `shown`.
///
/// Refused here already: an in-memory `mode`, and text after the `?` that
/// does not look like options at all (a `?` in a path or a password, which
/// no error may echo).
fn options(shown: &str, query: &str) -> Result<StoreUrl, LockError> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "mode" && value.eq_ignore_ascii_case("memory") {
            return Err(LockError::config(
                "mode=memory is an in-memory database, private to one process: it \
                 cannot lock anything across processes",
            ));
        }
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(LockError::config(format!(
                "{shown}: an unknown sqlite URL option (known: {}; percent-encode a `?` in the path as %3F)",
                KNOWN.join(", ")
            )));
        }
    }
    // The path is not a URL authority: only the options are handed over,
    // with the `#` and `@` a value may hold escaped (they would pass for a
    // fragment or a user info; each is read back as itself).
    let query = query.replace('#', "%23").replace('@', "%40");
    StoreUrl::parse(&format!("sqlite://?{query}"), &["sqlite"]).map_err(|_| {
        LockError::config(format!(
            "{shown}: an option of the URL is not valid UTF-8 once its %XX escapes are decoded"
        ))
    })
}

/// `error` from [`StoreUrl`], which saw the options only, naming the file.
fn at(shown: &str, error: LockError) -> LockError {
    match error {
        LockError::InvalidConfig { message, source } => {
            let message = match message.strip_prefix("sqlite://") {
                Some(rest) => format!("{shown}{rest}"),
                None => message,
            };
            match source {
                Some(source) => LockError::config_caused_by(message, source),
                None => LockError::config(message),
            }
        }
        other => other,
    }
}

impl fmt::Debug for SqliteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteConfig")
            .field("path", &shown(&self.path))
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_absolute_relative_and_escaped_paths() {
        let abs: SqliteConfig = "sqlite:///var/lib/app/locks.db".parse().unwrap();
        assert_eq!(abs.path(), Path::new("/var/lib/app/locks.db"));
        let rel: SqliteConfig = "sqlite://run/locks.db?timeout=250ms".parse().unwrap();
        assert_eq!(rel.path(), Path::new("run/locks.db"));
        assert_eq!(rel.op_timeout(), Duration::from_millis(250));
        let spaced: SqliteConfig = "SQLITE:///tmp/my%20locks%3F.db".parse().unwrap();
        assert_eq!(spaced.path(), Path::new("/tmp/my locks?.db"));
    }

    #[test]
    fn refuses_memory_and_nonsense() {
        for bad in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://file::memory:?cache=shared",
            "sqlite://x.db?mode=memory",
            "sqlite://",
            "sqlite:x.db",
            "postgres://h/db",
            "sqlite://x.db?timeout_ms=0",
            "sqlite://x.db?timeout_ms=abc",
            "sqlite://x.db?timeout=abc",
            "sqlite://x.db?timeout=5",
            "sqlite://x.db?journal=delete",
        ] {
            let err = bad.parse::<SqliteConfig>().unwrap_err();
            assert!(
                matches!(err, LockError::InvalidConfig { .. }),
                "{bad}: {err:?}"
            );
        }
        assert!(SqliteConfig::new(":memory:").is_err());
        let err = "sqlite::memory:".parse::<SqliteConfig>().unwrap_err();
        assert!(err.to_string().contains("across processes"), "{err}");
    }
}
