//! The store launcher against the real servers: start-up (timed), durability
//! across `kill -9` + restart, pause/resume, clusters surviving a leader
//! kill, faketime, and process hygiene. Verification goes through each
//! store's own CLI (redis-cli, psql, etcdctl, ZooKeeperMain), not through the
//! launcher's probes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use lock_conformance::stores::{Kind, Store, etcd, postgres, redis, zookeeper};

fn run(program: &str, args: &[&str]) -> (bool, String) {
    match Command::new(program).args(args).output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, format!("cannot run {program}: {e}")),
    }
}

fn redis_cli(store: &Store, args: &[&str]) -> String {
    let port = store.addr().port().to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port];
    all.extend_from_slice(args);
    let (ok, out) = run("redis-cli", &all);
    assert!(ok, "redis-cli {args:?} failed: {out}");
    out.trim().to_owned()
}

fn psql(store: &Store, sql: &str) -> String {
    let url = store.url();
    let (ok, out) = run(
        "psql",
        &[
            &url,
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ],
    );
    assert!(ok, "psql {sql:?} failed: {out}\n{}", store.log_tail());
    out.trim().to_owned()
}

fn etcdctl(endpoints: &str, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--endpoints", endpoints, "--command-timeout=3s"];
    all.extend_from_slice(args);
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3").args(&all);
    match cmd.output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, format!("cannot run etcdctl: {e}")),
    }
}

/// ZooKeeper's own CLI class (a JVM start, about a second).
fn zk_cli(addr: SocketAddr, args: &[&str]) -> (bool, String) {
    let server = addr.to_string();
    let mut all = vec![
        "-Xmx64m",
        "-XX:TieredStopAtLevel=1",
        "-cp",
        "/usr/share/java/zookeeper.jar",
        "org.apache.zookeeper.ZooKeeperMain",
        "-server",
        &server,
    ];
    all.extend_from_slice(args);
    run("java", &all)
}

/// The launcher tests start their own servers. When a run points the suite
/// at external servers (`LOCK_TEST_*`, e.g. CI service containers), the
/// store binaries may be absent: those tests skip, saying so.
fn launcher_run(kinds: &[Kind]) -> bool {
    for kind in kinds {
        if kind.external_url().is_some() {
            eprintln!(
                "SKIP: launcher test: {} is set, this run uses an external {kind} server",
                kind.env_var()
            );
            return false;
        }
    }
    true
}

const ALL: &[Kind] = &[Kind::Redis, Kind::Postgres, Kind::Etcd, Kind::ZooKeeper];

fn timed<T>(f: impl FnOnce() -> std::io::Result<T>) -> (T, Duration) {
    let started = Instant::now();
    let value = f().unwrap_or_else(|e| panic!("{e}"));
    (value, started.elapsed())
}

#[test]
fn every_store_starts_fast_and_serves() {
    if !launcher_run(ALL) {
        return;
    }
    // One by one, then all four at once (what a test run of every adapter sees).
    let (r, t_redis) = timed(|| redis::start(redis::Options::default()));
    let (p, t_pg) = timed(|| postgres::start(postgres::Options::default()));
    let (e, t_etcd) = timed(|| etcd::start(etcd::Options::default()));
    let (z, t_zk) = timed(|| zookeeper::start(zookeeper::Options::default()));
    assert_eq!(redis_cli(&r, &["PING"]), "PONG");
    assert_eq!(psql(&p, "select 40 + 2"), "42");
    let (ok, out) = etcdctl(&e.endpoint(), &["endpoint", "health"]);
    assert!(
        ok && out.contains("is healthy"),
        "etcdctl endpoint health: {out}"
    );
    let (ok, out) = zk_cli(z.addr(), &["ls", "/"]);
    assert!(ok && out.contains("zookeeper"), "zkCli ls /: {out}");
    for store in [&r, &p, &e, &z] {
        assert!(!store.is_external() && store.is_running(), "{store:?}");
        assert!(store.data_dir().is_some_and(|d| d.is_dir()));
    }
    let dirs: Vec<PathBuf> = [&r, &p, &e, &z]
        .iter()
        .map(|s| s.data_dir().unwrap().to_owned())
        .collect();
    let stopping = Instant::now();
    drop((r, p, e, z));
    let t_stop = stopping.elapsed();
    for dir in dirs {
        assert!(!dir.exists(), "{} must be removed on drop", dir.display());
    }

    let started = Instant::now();
    let handles = vec![
        std::thread::spawn(|| zookeeper::start(zookeeper::Options::default())),
        std::thread::spawn(|| etcd::start(etcd::Options::default())),
        std::thread::spawn(|| redis::start(redis::Options::default())),
        std::thread::spawn(|| postgres::start(postgres::Options::default())),
    ];
    let stores: Vec<Store> = handles
        .into_iter()
        .map(|h| {
            h.join()
                .expect("launcher thread")
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let t_all = started.elapsed();
    assert!(stores.iter().all(Store::serves));
    eprintln!(
        "STARTUP redis {t_redis:.2?}, postgres {t_pg:.2?} (initdb included), etcd {t_etcd:.2?}, \
         zookeeper {t_zk:.2?}; all four in parallel {t_all:.2?}; stopping four {t_stop:.2?}"
    );
    assert!(
        t_all < Duration::from_secs(10),
        "starting all four stores took {t_all:?}"
    );
}

#[test]
fn redis_aof_always_keeps_data_across_kill9() {
    if !launcher_run(&[Kind::Redis]) {
        return;
    }
    let store = redis::start(redis::Options::durable()).unwrap();
    assert!(store.durable());
    assert_eq!(redis_cli(&store, &["INCRBY", "fence", "41"]), "41");
    let port = store.addr().port();
    let pid = store.pid().unwrap();
    store.kill_now().unwrap();
    assert!(!store.is_running() && !store.serves());
    store.restart_now().unwrap();
    assert_eq!(store.addr().port(), port, "same port after restart");
    assert_ne!(store.pid(), Some(pid), "a new process");
    assert_eq!(redis_cli(&store, &["INCR", "fence"]), "42");
}

#[test]
fn redis_without_persistence_forgets_across_kill9() {
    if !launcher_run(&[Kind::Redis]) {
        return;
    }
    // Documents the limit the Redis adapter must warn about (T3.6b).
    let store =
        redis::start(redis::Options::default().persistence(redis::Persistence::None)).unwrap();
    assert!(!store.durable());
    redis_cli(&store, &["SET", "fence", "7"]);
    store.kill_now().unwrap();
    store.restart_now().unwrap();
    assert_eq!(redis_cli(&store, &["EXISTS", "fence"]), "0");
}

#[test]
fn postgres_keeps_committed_rows_across_kill9() {
    if !launcher_run(&[Kind::Postgres]) {
        return;
    }
    let store = postgres::start(postgres::Options::default()).unwrap();
    assert!(store.durable());
    psql(&store, "create table t (v int); insert into t values (7)");
    store.kill_now().unwrap();
    assert!(!store.serves());
    store.restart_now().unwrap();
    assert_eq!(psql(&store, "select v from t"), "7");
}

#[test]
fn postgres_runs_as_the_postgres_user() {
    let store = postgres::shared();
    if store.is_external() {
        eprintln!("SKIP: external postgres");
        return;
    }
    assert_eq!(psql(&store, "select current_user"), "postgres");
    let pid = store.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .expect("a Uid line");
    assert_ne!(uid, 0, "postgres must not run as root");
}

#[test]
fn postgres_clock_can_be_stepped_under_faketime() {
    if !launcher_run(&[Kind::Postgres]) {
        return;
    }
    let store = postgres::start(postgres::Options::default().faketime(true)).unwrap();
    let skew = |store: &Store| -> f64 {
        let server: f64 = psql(store, "select extract(epoch from clock_timestamp())")
            .parse()
            .unwrap();
        let local = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        server - local
    };
    assert!(
        skew(&store).abs() < 5.0,
        "no offset at start: {}",
        skew(&store)
    );
    store.set_clock_offset(3600).unwrap();
    let ahead = skew(&store);
    assert!(
        (3590.0..3610.0).contains(&ahead),
        "clock should be 1 h ahead, is {ahead} s"
    );
    store.set_clock_offset(-60).unwrap();
    let behind = skew(&store);
    assert!(
        (-70.0..-50.0).contains(&behind),
        "clock should be 60 s behind, is {behind} s"
    );
}

#[test]
fn etcd_keeps_keys_across_kill9() {
    if !launcher_run(&[Kind::Etcd]) {
        return;
    }
    let store = etcd::start(etcd::Options::default()).unwrap();
    let (ok, out) = etcdctl(&store.endpoint(), &["put", "/distlock/k", "v1"]);
    assert!(ok, "{out}");
    store.kill_now().unwrap();
    store.restart_now().unwrap();
    let (ok, out) = etcdctl(
        &store.endpoint(),
        &["get", "--print-value-only", "/distlock/k"],
    );
    assert!(ok && out.trim() == "v1", "after restart: {out}");
}

#[test]
fn etcd_allows_one_second_leases() {
    let store = etcd::shared();
    if store.is_external() {
        eprintln!("SKIP: external etcd");
        return;
    }
    let (ok, out) = etcdctl(&store.endpoint(), &["lease", "grant", "1"]);
    assert!(
        ok && out.contains("TTL(1s)"),
        "1 s lease refused or clamped: {out}"
    );
}

#[test]
fn zookeeper_keeps_znodes_across_kill9() {
    if !launcher_run(&[Kind::ZooKeeper]) {
        return;
    }
    let store = zookeeper::start(zookeeper::Options::default()).unwrap();
    let (ok, out) = zk_cli(store.addr(), &["create", "/distlock-k", "v1"]);
    assert!(ok && out.contains("Created /distlock-k"), "{out}");
    store.kill_now().unwrap();
    store.restart_now().unwrap();
    let (ok, out) = zk_cli(store.addr(), &["get", "/distlock-k"]);
    assert!(
        ok && out.lines().any(|l| l.trim() == "v1"),
        "after restart: {out}"
    );
}

/// Waits until `store` serves (one probe can time out on a loaded machine;
/// serving is a condition to await), failing after 10 s.
fn await_serving(store: &Store, when: &str) {
    let started = Instant::now();
    while !store.serves() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{store:?} does not serve {when}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// While paused, a request gets no answer (however long the probe waits);
/// after resume it does.
fn pause_blocks_requests(store: &Store) {
    await_serving(store, "before the pause");
    store.pause_now().unwrap();
    let started = Instant::now();
    assert!(!store.serves(), "{store:?} answered while SIGSTOPped");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "the probe must have timed out"
    );
    store.resume_now().unwrap();
    await_serving(store, "after SIGCONT");
}

#[test]
fn paused_stores_do_not_answer_until_resumed() {
    if !launcher_run(ALL) {
        return;
    }
    let handles = vec![
        std::thread::spawn(|| redis::start(redis::Options::default())),
        std::thread::spawn(|| postgres::start(postgres::Options::default())),
        std::thread::spawn(|| etcd::start(etcd::Options::default())),
        std::thread::spawn(|| zookeeper::start(zookeeper::Options::default())),
    ];
    for handle in handles {
        let store = handle.join().unwrap().unwrap();
        pause_blocks_requests(&store);
    }
}

#[test]
fn etcd_cluster_survives_leader_kill() {
    if !launcher_run(&[Kind::Etcd]) {
        return;
    }
    let (cluster, took) = timed(|| etcd::start_cluster(3));
    eprintln!("STARTUP etcd 3-member cluster {took:.2?}");
    let all = cluster.connect_string();
    let (ok, out) = etcdctl(&all, &["put", "/distlock/before", "1"]);
    assert!(ok, "{out}");
    let killed = cluster.kill_leader().unwrap();
    let started = Instant::now();
    let others: Vec<String> = cluster
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != killed)
        .map(|(_, m)| m.endpoint())
        .collect();
    let others = others.join(",");
    loop {
        let (ok, out) = etcdctl(&others, &["put", "/distlock/after", "2"]);
        if ok {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no write after the leader kill: {out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let new_leader = cluster.wait_leader(Duration::from_secs(10)).unwrap();
    assert_ne!(new_leader, killed);
    eprintln!(
        "FAILOVER etcd: writes accepted {:.2?} after the leader kill",
        started.elapsed()
    );
    cluster.members[killed].restart_now().unwrap();
    let member = cluster.members[killed].endpoint();
    let started = Instant::now();
    loop {
        let (ok, out) = etcdctl(
            &member,
            &[
                "get",
                "--consistency=s",
                "--print-value-only",
                "/distlock/after",
            ],
        );
        if ok && out.trim() == "2" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the restarted member never caught up: {out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn zookeeper_ensemble_survives_leader_kill() {
    if !launcher_run(&[Kind::ZooKeeper]) {
        return;
    }
    let (cluster, took) = timed(|| zookeeper::start_ensemble(3));
    eprintln!("STARTUP zookeeper 3-server ensemble {took:.2?}");
    let modes: Vec<_> = cluster
        .members
        .iter()
        .map(|m| zookeeper::mode(m.addr()).unwrap().unwrap_or_default())
        .collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );
    let killed = cluster.kill_leader().unwrap();
    let started = Instant::now();
    let new_leader = cluster.wait_leader(Duration::from_secs(30)).unwrap();
    assert_ne!(new_leader, killed);
    eprintln!(
        "FAILOVER zookeeper: new leader {:.2?} after the leader kill",
        started.elapsed()
    );
    let (ok, out) = zk_cli(
        cluster.members[new_leader].addr(),
        &["create", "/distlock-failover", "x"],
    );
    assert!(ok && out.contains("Created"), "{out}");
    cluster.members[killed].restart_now().unwrap();
    assert_eq!(
        zookeeper::mode(cluster.members[killed].addr())
            .unwrap()
            .as_deref(),
        Some("follower")
    );
}

#[test]
fn external_stores_are_used_as_given_and_never_hurt() {
    // Only meaningful in runs that set the variables (the CI workflow does).
    for (kind, store) in [
        (Kind::Redis, redis::try_shared()),
        (Kind::Postgres, postgres::try_shared()),
        (Kind::Etcd, etcd::try_shared()),
        (Kind::ZooKeeper, zookeeper::try_shared()),
    ] {
        let store = store.unwrap_or_else(|e| panic!("{kind}: {e}"));
        let external = kind.external_url().is_some();
        assert_eq!(store.is_external(), external, "{kind}");
        assert!(store.serves(), "{kind} at {} does not serve", store.addr());
        if external {
            let err = store.kill_now().unwrap_err();
            assert!(err.to_string().contains(kind.env_var()), "{err}");
        }
    }
}

/// Run by `shared_stores_die_with_the_test_binary` in a child process.
#[test]
#[ignore = "helper: run by shared_stores_die_with_the_test_binary"]
fn helper_start_shared_store_and_exit() {
    if std::env::var("DISTLOCK_HYGIENE_HELPER").as_deref() != Ok("1") {
        return;
    }
    let store = redis::shared();
    println!(
        "HYGIENE {} {}",
        store.pid().unwrap(),
        store.data_dir().unwrap().display()
    );
}

#[test]
fn shared_stores_die_with_the_test_binary() {
    if !launcher_run(&[Kind::Redis]) {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "helper_start_shared_store_and_exit",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("DISTLOCK_HYGIENE_HELPER", "1")
        .env_remove("LOCK_TEST_REDIS_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.find("HYGIENE ").map(|at| &l[at + 8..]))
        .unwrap_or_else(|| {
            panic!(
                "helper printed no HYGIENE line: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let mut words = line.split_whitespace();
    let pid: u32 = words.next().unwrap().parse().unwrap();
    let dir = PathBuf::from(words.next().unwrap());
    let started = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .contains("State:\tZ")
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "redis {pid} outlived its test binary"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!dir.exists(), "{} outlived its test binary", dir.display());
}

/// Run by `a_missing_store_fails_loudly_unless_partial` in a child process
/// whose PATH has no redis-server.
#[test]
#[ignore = "helper: run by a_missing_store_fails_loudly_unless_partial"]
fn helper_shared_or_skip_without_redis() {
    if std::env::var("DISTLOCK_MISSING_HELPER").as_deref() != Ok("1") {
        return;
    }
    match redis::shared_or_skip() {
        Some(_) => println!("RESULT launched"),
        None => println!("RESULT skipped"),
    }
}

#[test]
fn a_missing_store_fails_loudly_unless_partial() {
    let exe = std::env::current_exe().unwrap();
    let run = |partial: bool, ci: bool| {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--ignored",
            "--exact",
            "helper_shared_or_skip_without_redis",
            "--nocapture",
        ])
        .env("DISTLOCK_MISSING_HELPER", "1")
        .env("PATH", "/nonexistent")
        .env_remove("LOCK_TEST_REDIS_URL")
        .env_remove("LOCK_TEST_PARTIAL")
        .env_remove("CI");
        if partial {
            cmd.env("LOCK_TEST_PARTIAL", "1");
        }
        if ci {
            cmd.env("CI", "true");
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run(false, false);
    assert!(!ok, "a missing redis-server must fail the test: {text}");
    assert!(
        text.contains("apt-get install -y redis-server") && text.contains("scripts/test-all.sh"),
        "the failure names the package and the script: {text}"
    );
    let (ok, text) = run(true, false);
    assert!(
        ok && text.contains("RESULT skipped") && text.contains("SKIP:"),
        "LOCK_TEST_PARTIAL=1 skips loudly: {text}"
    );
    let (ok, text) = run(true, true);
    assert!(
        !ok && !text.contains("RESULT skipped"),
        "CI=true never skips: {text}"
    );
}

/// Reads PostgreSQL protocol messages until one of type `until` (or an error).
fn pg_read_until(stream: &mut std::net::TcpStream, until: u8) -> std::io::Result<()> {
    use std::io::Read;
    loop {
        let mut head = [0_u8; 5];
        stream.read_exact(&mut head)?;
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0_u8; len.saturating_sub(4)];
        stream.read_exact(&mut body)?;
        if head[0] == until {
            return Ok(());
        }
        assert_ne!(
            head[0],
            b'E',
            "postgres error: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[test]
fn paused_postgres_stops_open_sessions_too() {
    // Backends call setsid(): a process-group SIGSTOP alone would leave
    // open sessions serving. The launcher stops the whole process tree.
    if !launcher_run(&[Kind::Postgres]) {
        return;
    }
    use std::io::Write;
    let store = postgres::start(postgres::Options::default()).unwrap();
    let mut session = std::net::TcpStream::connect(store.addr()).unwrap();
    let params = b"user\0postgres\0database\0postgres\0\0";
    let mut startup = ((8 + params.len()) as i32).to_be_bytes().to_vec();
    startup.extend_from_slice(&196_608_i32.to_be_bytes());
    startup.extend_from_slice(params);
    session.write_all(&startup).unwrap();
    pg_read_until(&mut session, b'Z').unwrap();
    let query = |s: &mut std::net::TcpStream| {
        let sql = b"select 1\0";
        let mut msg = vec![b'Q'];
        msg.extend_from_slice(&((4 + sql.len()) as i32).to_be_bytes());
        msg.extend_from_slice(sql);
        s.write_all(&msg).unwrap();
    };
    store.pause_now().unwrap();
    query(&mut session);
    session
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let err = pg_read_until(&mut session, b'Z').unwrap_err();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "an open session answered while postgres was stopped: {err}"
    );
    store.resume_now().unwrap();
    session
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    pg_read_until(&mut session, b'Z').expect("the session answers after SIGCONT");
}
