//! Every fault-proxy mode against a real Redis: requests and replies are
//! plain RESP over TCP, so what arrives (and what does not) is visible.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::{Store, redis};
use lock_conformance::kit::{eventually, until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const SILENCE: Duration = Duration::from_millis(300);

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect")
}

/// Sends one inline command.
async fn send(stream: &mut TcpStream, command: &str) {
    stream
        .write_all(format!("{command}\r\n").as_bytes())
        .await
        .expect("write");
}

/// Reads one reply line, or `None` if nothing arrives within `within`.
async fn reply(stream: &mut TcpStream, within: Duration) -> Option<io::Result<String>> {
    let mut line = Vec::new();
    let mut byte = [0_u8; 1];
    let read = async {
        loop {
            match stream.read(&mut byte).await {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF")),
                Ok(_) => {
                    line.push(byte[0]);
                    if line.ends_with(b"\r\n") {
                        return Ok(String::from_utf8_lossy(&line).trim().to_owned());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()
}

async fn ask(stream: &mut TcpStream, command: &str) -> String {
    send(stream, command).await;
    reply(stream, Duration::from_secs(5))
        .await
        .expect("a reply in time")
        .expect("a reply")
}

/// A unique key, so the tests can share one Redis.
fn key(test: &str) -> String {
    format!("proxy-test:{test}:{:08x}", rand::random::<u32>())
}

async fn setup() -> (std::sync::Arc<Store>, FaultProxy) {
    let store = redis::shared();
    let proxy = FaultProxy::start(store.addr()).await.expect("proxy");
    (store, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_forwards_both_ways() {
    let (_store, proxy) = setup().await;
    let mut c = connect(proxy.addr()).await;
    assert_eq!(ask(&mut c, "PING").await, "+PONG");
    let k = key("pass");
    assert_eq!(ask(&mut c, &format!("SET {k} v")).await, "+OK");
    assert_eq!(ask(&mut c, &format!("STRLEN {k}")).await, ":1");
    assert_eq!(proxy.connections(), 1);
    drop(c);
    let closed = "the closed connection dropped";
    until(Duration::from_secs(5), closed, || async {
        proxy.connections() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_adds_latency_with_jitter() {
    let (_store, proxy) = setup().await;
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    let base = Duration::from_millis(150);
    let jitter = Duration::from_millis(100);
    proxy.set(Mode::Delay { base, jitter });
    let mut rtts = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        assert_eq!(ask(&mut c, "PING").await, "+PONG");
        rtts.push(started.elapsed());
    }
    for rtt in &rtts {
        // Both directions are delayed.
        assert!(*rtt >= base * 2, "rtt {rtt:?} below 2 x {base:?}");
        assert!(
            *rtt < (base + jitter) * 2 + Duration::from_millis(300),
            "rtt {rtt:?}"
        );
    }
    proxy.set(Mode::Pass);
    let started = Instant::now();
    ask(&mut c, "PING").await;
    assert!(started.elapsed() < base, "Pass again must not delay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_downstream_lets_the_store_act_before_the_client_hears() {
    let (store, proxy) = setup().await;
    let k = key("delay-down");
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.set(Mode::DelayDownstream {
        base: Duration::from_millis(400),
        jitter: Duration::ZERO,
    });
    let started = Instant::now();
    send(&mut c, &format!("INCR {k}")).await;
    // Well before the reply is let through (400 ms).
    let get = format!("GET {k}");
    until(
        Duration::from_millis(300),
        "the store applying it",
        || async { ask(&mut connect(store.addr()).await, &get).await == "$1" },
    )
    .await;
    let answer = reply(&mut c, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer, ":1");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "the reply came early"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_swallows_without_closing() {
    let (store, proxy) = setup().await;
    let k = key("blackhole");
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.set(Mode::Blackhole);
    send(&mut c, &format!("INCR {k}")).await;
    assert!(
        reply(&mut c, SILENCE).await.is_none(),
        "no reply, no EOF, no RST"
    );
    // New connections are accepted and swallowed too.
    let mut fresh = connect(proxy.addr()).await;
    send(&mut fresh, "PING").await;
    assert!(reply(&mut fresh, SILENCE).await.is_none());
    let mut direct = connect(store.addr()).await;
    assert_eq!(
        ask(&mut direct, &format!("EXISTS {k}")).await,
        ":0",
        "the request never reached the store"
    );
    proxy.set(Mode::Pass);
    assert_eq!(
        ask(&mut c, "PING").await,
        "+PONG",
        "the connection survives the partition"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeze_holds_bytes_and_delivers_them_after() {
    let (store, proxy) = setup().await;
    let k = key("freeze");
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.set(Mode::Freeze);
    send(&mut c, &format!("INCR {k}")).await;
    assert!(reply(&mut c, SILENCE).await.is_none());
    let mut direct = connect(store.addr()).await;
    assert_eq!(
        ask(&mut direct, &format!("EXISTS {k}")).await,
        ":0",
        "nothing forwarded while frozen"
    );
    proxy.set(Mode::Pass);
    let late = reply(&mut c, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(late, ":1", "the held request is delivered after the thaw");
}

fn is_reset(r: &Option<io::Result<String>>) -> bool {
    matches!(r, Some(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_sends_rst_to_open_and_new_connections() {
    let (_store, proxy) = setup().await;
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.set(Mode::Reset);
    let r = reply(&mut c, Duration::from_secs(2)).await;
    assert!(
        is_reset(&r),
        "open connection: expected ECONNRESET, got {r:?}"
    );
    // The RST may even beat the end of connect() on the client side.
    match TcpStream::connect(proxy.addr()).await {
        Ok(mut fresh) => {
            let r = reply(&mut fresh, Duration::from_secs(2)).await;
            assert!(
                is_reset(&r),
                "new connection: expected ECONNRESET, got {r:?}"
            );
        }
        Err(e) => assert_eq!(
            e.kind(),
            io::ErrorKind::ConnectionReset,
            "new connection: {e}"
        ),
    }
    proxy.set(Mode::Pass);
    let mut healed = connect(proxy.addr()).await;
    assert_eq!(ask(&mut healed, "PING").await, "+PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_existing_is_one_shot() {
    let (_store, proxy) = setup().await;
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.reset_existing();
    let r = reply(&mut c, Duration::from_secs(2)).await;
    assert!(is_reset(&r), "expected ECONNRESET, got {r:?}");
    assert_eq!(proxy.mode(), Mode::Pass);
    let mut again = connect(proxy.addr()).await;
    assert_eq!(
        ask(&mut again, "PING").await,
        "+PONG",
        "reconnecting works at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_closes_the_door_but_keeps_open_connections() {
    let (_store, proxy) = setup().await;
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.set(Mode::Refuse);
    until(Duration::from_secs(2), "connections refused", || async {
        matches!(
            TcpStream::connect(proxy.addr()).await,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
        )
    })
    .await;
    assert_eq!(
        ask(&mut c, "PING").await,
        "+PONG",
        "open connections keep working"
    );
    proxy.set(Mode::Pass);
    let mut fresh = eventually(Duration::from_secs(2), "the listener re-opened", || async {
        TcpStream::connect(proxy.addr()).await.ok()
    })
    .await;
    assert_eq!(ask(&mut fresh, "PING").await, "+PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_upstream_loses_requests() {
    let (store, proxy) = setup().await;
    let k = key("drop-up");
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.set(Mode::DropUpstream);
    send(&mut c, &format!("INCR {k}")).await;
    assert!(reply(&mut c, SILENCE).await.is_none());
    let mut direct = connect(store.addr()).await;
    assert_eq!(
        ask(&mut direct, &format!("EXISTS {k}")).await,
        ":0",
        "the request was dropped"
    );
    proxy.set(Mode::Pass);
    assert_eq!(
        ask(&mut c, &format!("INCR {k}")).await,
        ":1",
        "only the later request arrived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_downstream_loses_replies_only() {
    let (store, proxy) = setup().await;
    let k = key("drop-down");
    let mut c = connect(proxy.addr()).await;
    ask(&mut c, "PING").await;
    proxy.set(Mode::DropDownstream);
    send(&mut c, &format!("INCR {k}")).await;
    assert!(
        reply(&mut c, SILENCE).await.is_none(),
        "the reply was dropped"
    );
    let mut direct = connect(store.addr()).await;
    assert_eq!(
        ask(&mut direct, &format!("GET {k}")).await,
        "$1",
        "but the store applied the request"
    );
    proxy.set(Mode::Pass);
    assert_eq!(ask(&mut c, &format!("INCR {k}")).await, ":2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_proxy_closes_everything() {
    let (_store, proxy) = setup().await;
    let addr = proxy.addr();
    let mut c = connect(addr).await;
    ask(&mut c, "PING").await;
    drop(proxy);
    let r = reply(&mut c, Duration::from_secs(2)).await;
    assert!(
        matches!(r, Some(Err(_))),
        "expected the connection closed, got {r:?}"
    );
    until(Duration::from_secs(2), "the listener closed", || async {
        TcpStream::connect(addr).await.is_err()
    })
    .await;
}
