//! Nothing this backend prints shows more of a lock URL than
//! `redact_url` does. SQLite has no password, but a path or a query may
//! hold one (or look as if it did): the marker password of the kit
//! (`#/?@:%` between two runs of letters) goes in the path, raw and
//! percent-encoded, and in the query, through every connect and error
//! path (a missing directory, a file that is not a database or not ours,
//! one with two names, a directory, bad options, one-slash and non-URLs,
//! in-memory names, the builder, a file replaced under a client, a counter
//! behind a live holder). For each: the error's `Display` and `Debug`,
//! `Debug` of the config and of the backend, and every log line captured
//! meanwhile show no run of the marker that `redact_url` hides.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_conformance::kit::secrets::{self, MARKER};
use lock_sqlite::{SqliteBackend, SqliteConfig};
use lockcore::backend::{LockBackendExt, redact_url};
use lockcore::{LockBackend, LockError, LockName};
use sqlx::{ConnectOptions, Connection};

/// The two runs of letters and digits around the marker's special
/// characters.
const RUNS: [&str; 2] = ["Mkq7", "9Zq4"];

/// Fails if `text` shows any of the marker that `redact_url(url)` hides.
#[track_caller]
fn shows_no_more_than_redaction(case: &str, url: &str, text: &str) {
    let shown = redact_url(url);
    for part in RUNS
        .iter()
        .map(|r| r.to_string())
        .chain([MARKER.to_owned(), secrets::encoded()])
    {
        assert!(
            shown.contains(&part) || !text.contains(&part),
            "{case}: shows {part:?}, which redact_url hides ({shown}):\n{text}"
        );
    }
}

/// One case's output: what it returned, and what was logged meanwhile.
struct Case {
    what: String,
    url: String,
    logged_from: usize,
    texts: Vec<String>,
}

impl Case {
    fn new(what: impl Into<String>, url: impl Into<String>) -> Case {
        Case {
            what: what.into(),
            url: url.into(),
            logged_from: secrets::captured().len(),
            texts: Vec::new(),
        }
    }

    fn error(&mut self, e: &LockError) {
        self.texts.push(e.to_string());
        self.texts.push(format!("{e:?}"));
    }

    /// Records `outcome`; a backend is looked at, used and closed.
    async fn connected(&mut self, outcome: Result<SqliteBackend, LockError>) {
        match outcome {
            Ok(backend) => {
                self.texts.push(format!("{backend:?}"));
                let name = LockName::new("secret-case").unwrap();
                let lease = backend
                    .try_acquire_for(&name, Duration::from_secs(30))
                    .await
                    .unwrap()
                    .into_lease()
                    .unwrap();
                backend.release(&lease).await.unwrap();
                backend.close().await.unwrap();
            }
            Err(e) => self.error(&e),
        }
    }

    fn check(self) {
        let logged = secrets::captured()[self.logged_from..].to_owned();
        for text in self.texts.iter().chain([&logged]) {
            shows_no_more_than_redaction(&self.what, &self.url, text);
        }
    }
}

fn url_of(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

/// Connects through the builder (the only way to a path holding `?`).
async fn build(case: &mut Case, path: &Path) {
    match SqliteConfig::new(path) {
        Ok(config) => {
            case.texts.push(format!("{config:?}"));
            case.connected(SqliteBackend::connect_with(config).await)
                .await;
        }
        Err(e) => case.error(&e),
    }
}

async fn through_url(case: &mut Case) {
    match case.url.parse::<SqliteConfig>() {
        Ok(config) => case.texts.push(format!("{config:?}")),
        Err(e) => case.error(&e),
    }
    let url = case.url.clone();
    case.connected(SqliteBackend::connect(&url).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_shows_more_of_a_url_than_its_redaction() {
    secrets::capture_tracing();
    let base = tempfile::tempdir().unwrap();
    let base = base.path();
    // The raw marker as directories: "Mkq7#" then "?@:%9Zq4".
    let raw_dir: PathBuf = base.join(MARKER);
    let raw_db = raw_dir.join("locks.db");
    let encoded_url = format!(
        "sqlite://{}/{}/locks.db",
        base.display(),
        secrets::encoded()
    );

    // A missing directory, by the builder and by URL.
    let mut case = Case::new("a missing directory (builder)", url_of(&raw_db));
    build(&mut case, &raw_db).await;
    case.check();
    let mut case = Case::new("a missing directory (encoded URL)", &encoded_url);
    through_url(&mut case).await;
    case.check();

    // The same paths, created: connecting works.
    std::fs::create_dir_all(&raw_dir).unwrap();
    let mut case = Case::new("connected (builder)", url_of(&raw_db));
    build(&mut case, &raw_db).await;
    case.check();
    let mut case = Case::new("connected (encoded URL)", &encoded_url);
    through_url(&mut case).await;
    case.check();

    // Files that are not a lock file.
    let notes = raw_dir.join("notes.db");
    std::fs::write(&notes, "not a database\n".repeat(100)).unwrap();
    let mut case = Case::new("not a database", url_of(&notes));
    build(&mut case, &notes).await;
    case.check();
    let theirs = raw_dir.join("theirs.db");
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&theirs)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    sqlx::query("CREATE TABLE users (id INTEGER PRIMARY KEY)")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let mut case = Case::new("another program's database", url_of(&theirs));
    build(&mut case, &theirs).await;
    case.check();
    let linked = raw_dir.join("linked.db");
    std::fs::hard_link(&raw_db, &linked).unwrap();
    let mut case = Case::new("a file with two names", url_of(&linked));
    build(&mut case, &linked).await;
    case.check();
    std::fs::remove_file(&linked).unwrap();
    let mut case = Case::new("a directory", url_of(&raw_dir));
    build(&mut case, &raw_dir).await;
    case.check();

    // The marker in the URL: its path, its query, and what is no URL.
    let plain = base.join("plain.db");
    for url in [
        format!("sqlite://{}", raw_db.display()),
        format!("sqlite://{}?timeout_ms={MARKER}", plain.display()),
        format!("sqlite://{}?{MARKER}=1", plain.display()),
        format!("sqlite://{}?password={MARKER}", plain.display()),
        format!("sqlite://{}?timeout_ms=10&token={MARKER}", plain.display()),
        format!("sqlite://{}?mode=memory&password={MARKER}", plain.display()),
        format!(
            "sqlite://{}?timeout_ms={}",
            plain.display(),
            secrets::encoded()
        ),
        format!("sqlite:/{}/{MARKER}/locks.db", base.display()),
        format!("sqlite:{MARKER}"),
        MARKER.to_owned(),
        format!("host=localhost password={MARKER}"),
        format!("postgres://user:{MARKER}@localhost/db"),
        format!("sqlite::memory:?{MARKER}"),
        format!("sqlite://:memory:?cache={MARKER}"),
        format!("SQLITE://{}/{}/x.db", base.display(), secrets::encoded()),
    ] {
        let mut case = Case::new(format!("the URL {url:?}"), &url);
        through_url(&mut case).await;
        case.check();
    }

    // The builder: an in-memory name, a bad timeout.
    for path in [
        format!(":memory:?x={MARKER}"),
        format!("file::memory:?{MARKER}"),
    ] {
        let mut case = Case::new(
            format!("the builder with {path:?}"),
            format!("sqlite://{path}"),
        );
        build(&mut case, Path::new(&path)).await;
        case.check();
    }
    let mut case = Case::new("a zero timeout", url_of(&raw_db));
    match SqliteConfig::new(&raw_db).and_then(|c| c.timeout(Duration::ZERO)) {
        Ok(config) => panic!("a zero timeout was accepted: {config:?}"),
        Err(e) => case.error(&e),
    }
    case.check();

    // A lock file replaced under a client (the marker in its directory, and
    // in its own name), and a counter behind a holder.
    let name = LockName::new("after-the-swap").unwrap();
    let marked_name = base.join(format!("{}.db", MARKER.replace('/', "")));
    for db in [&raw_db, &marked_name] {
        let mut case = Case::new("a file replaced under its client", url_of(db));
        let client = SqliteBackend::connect_with(SqliteConfig::new(db).unwrap())
            .await
            .unwrap();
        let mut wal = db.clone().into_os_string();
        wal.push("-wal");
        std::fs::remove_file(&wal).unwrap();
        match client.try_acquire_for(&name, Duration::from_secs(30)).await {
            Ok(attempt) => panic!("a replaced file was written to: {attempt:?}"),
            Err(e) => case.error(&e),
        }
        client.close().await.unwrap();
        case.check();
    }

    let mut case = Case::new("a counter behind a live holder", url_of(&raw_db));
    let holder = SqliteBackend::connect_with(SqliteConfig::new(&raw_db).unwrap())
        .await
        .unwrap();
    let held = holder
        .try_acquire_for(&name, Duration::from_secs(30))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&raw_db)
        .connect()
        .await
        .unwrap();
    sqlx::query("UPDATE distlock_fence SET last = 0")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let other = LockName::new("other").unwrap();
    match holder
        .try_acquire_for(&other, Duration::from_secs(30))
        .await
    {
        Ok(attempt) => assert!(
            attempt
                .into_lease()
                .is_none_or(|l| l.fence() != held.fence())
        ),
        Err(e) => case.error(&e),
    }
    case.connected(SqliteBackend::connect_with(SqliteConfig::new(&raw_db).unwrap()).await)
        .await;
    holder.release(&held).await.unwrap();
    holder.close().await.unwrap();
    case.check();
}
