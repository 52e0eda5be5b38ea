//! Loopback plumbing: free ports for servers and proxies, one request/reply
//! exchange for readiness probes, and telling a port clash from other
//! start-up failures.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The range ports are handed out from: below Linux's ephemeral range, so an
/// outgoing connection never takes a store's port while the store is down
/// for a restart.
const PORTS: std::ops::Range<u16> = 20000..32000;

/// A loopback port nothing listens on and this process has not handed out
/// before. Another process may still take it before the server binds it;
/// launchers retry on "address in use".
pub(crate) fn free_port() -> io::Result<u16> {
    static TAKEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let taken = TAKEN.get_or_init(Default::default);
    for _ in 0..200 {
        let port = rand::random_range(PORTS);
        let mut taken = taken.lock().unwrap_or_else(|p| p.into_inner());
        if taken.contains(&port) {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            taken.insert(port);
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no free loopback port in {PORTS:?} after 200 tries"),
    ))
}

/// `127.0.0.1:port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Connects, writes `request`, and reads until `done` says the reply is
/// complete, EOF, or the timeout. Returns what was read.
pub(crate) fn exchange(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
    done: impl Fn(&[u8]) -> bool,
) -> io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request)?;
    let mut reply = Vec::new();
    let mut buf = [0_u8; 4096];
    let give_up = Instant::now() + timeout;
    while !done(&reply) {
        if Instant::now() >= give_up {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no complete reply in time",
            ));
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(reply)
}

/// Whether a failed start looks like a port clash (retry on another port).
pub fn port_clash(e: &io::Error) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("address already in use")
        || text.contains("addrinuse")
        || text.contains("bindexception")
}
