//! `SIGSTOP`/`SIGCONT`: a paused store answers nothing, open sessions
//! included, until resumed.

use std::time::{Duration, Instant};

use lock_conformance::kit::poll;

use super::*;

/// Waits until `store` serves (one probe can time out on a loaded machine;
/// serving is a condition to await), failing after 10 s.
fn await_serving(store: &Store, when: &str) {
    let what = format!("{store:?} serving {when}");
    poll::blocking_until(Duration::from_secs(10), &what, || store.serves());
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
