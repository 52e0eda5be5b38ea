//! `FaultProxy`: a TCP proxy between a client and a store whose behaviour is
//! switched at run time: the suite's network-fault tool (machines like this
//! one have no `tc netem` and no iptables).
//!
//! Needs the `stores` feature. A mode applies to open connections at once
//! and to every new one; [`reset_existing`](FaultProxy::reset_existing) is a
//! one-shot reset that leaves the mode alone.
//!
//! ```no_run
//! # async fn demo(store: std::net::SocketAddr) -> std::io::Result<()> {
//! use std::time::Duration;
//! use lock_conformance::kit::proxy::{FaultProxy, Mode};
//! let proxy = FaultProxy::start(store).await?;
//! // connect a client to proxy.addr() ...
//! proxy.set(Mode::Blackhole); // partition: requests vanish, no RST
//! proxy.set(Mode::Delay { base: Duration::from_millis(300), jitter: Duration::from_millis(50) });
//! proxy.set(Mode::Pass); // heal
//! # Ok(()) }
//! ```

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::backend::CancellationToken;
use rand::Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::kit::net;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Forward everything.
    #[default]
    Pass,
    /// Forward every chunk, both ways, after `base` plus a uniform random
    /// `0..=jitter`, keeping byte order.
    Delay {
        /// Fixed one-way delay.
        base: Duration,
        /// Extra random delay, at most this.
        jitter: Duration,
    },
    /// Like [`Delay`](Mode::Delay), but only store → client (replies): the
    /// store acts on requests at once, the client learns late.
    DelayDownstream {
        /// Fixed one-way delay.
        base: Duration,
        /// Extra random delay, at most this.
        jitter: Duration,
    },
    /// Accept and swallow: connections stay open, bytes are read and
    /// discarded both ways, nothing is answered (a partition without RST).
    Blackhole,
    /// Stop forwarding both ways without reading: sockets stay open and
    /// bytes pile up in the buffers, delivered if the mode goes back to
    /// forwarding (a half-open, hung connection).
    Freeze,
    /// Reset every connection (RST via `SO_LINGER=0`), open or new.
    Reset,
    /// Refuse new connections (the listener is closed: connection refused);
    /// open connections keep forwarding.
    Refuse,
    /// Drop client → store bytes (requests are lost), forward replies.
    DropUpstream,
    /// Drop store → client bytes (replies are lost), forward requests.
    DropDownstream,
}

#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    reset_epoch: u64,
    /// Where new connections go.
    upstream: SocketAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// client → store
    Up,
    /// store → client
    Down,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Orderly close (FIN forwarded).
    Eof,
    /// Reset (by mode, by a peer's RST, or an I/O error).
    Reset,
}

#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicU64,
    active: AtomicUsize,
}

/// A fault-injecting TCP proxy on a loopback port in front of `upstream`
/// (or one port per upstream, all in one mode: [`start_each`](Self::start_each)).
/// Dropping it closes the listeners and every connection.
pub struct FaultProxy {
    addr: SocketAddr,
    /// The other routes, `(upstream, listener)`, for a store of several
    /// servers.
    more: Vec<(SocketAddr, SocketAddr)>,
    state: watch::Sender<State>,
    stop: CancellationToken,
    stats: Arc<Stats>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream())
            .field("mode", &self.mode())
            .field("active", &self.connections())
            .finish()
    }
}

fn bind(port: u16) -> io::Result<TcpListener> {
    // std sets SO_REUSEADDR, so the port can be bound again after Refuse.
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

impl FaultProxy {
    /// Starts a proxy in [`Mode::Pass`] on a free loopback port (below the
    /// ephemeral range, so it can be re-bound after [`Mode::Refuse`]). Must be
    /// called inside a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = bind_free()?;
        let addr = listener.local_addr()?;
        let (state, rx) = watch::channel(State {
            mode: Mode::Pass,
            reset_epoch: 0,
            upstream,
        });
        let stop = CancellationToken::new();
        let stats = Arc::new(Stats::default());
        tokio::spawn(accept_loop(
            (listener, addr, None),
            rx,
            stop.clone(),
            stats.clone(),
        ));
        Ok(FaultProxy {
            addr,
            more: Vec::new(),
            state,
            stop,
            stats,
        })
    }

    /// One port in front of each of `upstreams` (the servers of a store
    /// that clients reach one by one, as a Redis Cluster's nodes), all in
    /// one mode: a fault hits the client's link to every server at once.
    /// [`repoint`](Self::repoint) moves the first route only.
    pub async fn start_each(upstreams: &[SocketAddr]) -> io::Result<FaultProxy> {
        let Some((first, rest)) = upstreams.split_first() else {
            return Err(io::Error::other("a proxy needs an upstream"));
        };
        let mut proxy = FaultProxy::start(*first).await?;
        for upstream in rest {
            let listener = bind_free()?;
            let addr = listener.local_addr()?;
            tokio::spawn(accept_loop(
                (listener, addr, Some(*upstream)),
                proxy.state.subscribe(),
                proxy.stop.clone(),
                proxy.stats.clone(),
            ));
            proxy.more.push((*upstream, addr));
        }
        Ok(proxy)
    }

    /// Where clients connect (to the first upstream).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every route, `(upstream, where clients connect to reach it)`, the
    /// first one first.
    pub fn routes(&self) -> Vec<(SocketAddr, SocketAddr)> {
        std::iter::once((self.upstream(), self.addr))
            .chain(self.more.iter().copied())
            .collect()
    }

    /// Where it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.state.borrow().upstream
    }

    /// Forwards new connections to `upstream` from now on and resets the
    /// open ones, as a virtual IP or a load balancer moved to a promoted
    /// server would: clients reconnect and reach the new one.
    pub fn repoint(&self, upstream: SocketAddr) {
        self.state.send_modify(|s| {
            s.upstream = upstream;
            s.reset_epoch += 1;
        });
    }

    /// Switches the mode for open and new connections.
    pub fn set(&self, mode: Mode) {
        self.state.send_modify(|s| s.mode = mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.state.borrow().mode
    }

    /// Resets (RST) every open connection once; new connections follow the
    /// current mode (clients can reconnect at once in [`Mode::Pass`]).
    pub fn reset_existing(&self) {
        self.state.send_modify(|s| s.reset_epoch += 1);
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.stats.active.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.stats.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A listener on a free loopback port (below the ephemeral range).
fn bind_free() -> io::Result<TcpListener> {
    let mut last = None;
    for _ in 0..10 {
        match bind(net::free_port()?) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no port for the proxy")))
}

/// Accepts on `listener` (at `addr`) and forwards to `fixed`, or where the
/// state says when `None`.
async fn accept_loop(
    (listener, addr, fixed): (TcpListener, SocketAddr, Option<SocketAddr>),
    mut rx: watch::Receiver<State>,
    stop: CancellationToken,
    stats: Arc<Stats>,
) {
    let mut listener = Some(listener);
    loop {
        let mode = rx.borrow_and_update().mode;
        if mode == Mode::Refuse {
            listener = None; // closed: connects are refused
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            continue;
        }
        let current = match listener.take() {
            Some(l) => l,
            None => match rebind(addr.port(), &stop).await {
                Some(l) => l,
                None => return,
            },
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = rx.changed() => {
                if changed.is_err() { return }
                listener = Some(current);
            }
            accepted = current.accept() => {
                listener = Some(current);
                if let Ok((client, _)) = accepted {
                    stats.accepted.fetch_add(1, Ordering::SeqCst);
                    let upstream = fixed.unwrap_or(rx.borrow().upstream);
                    tokio::spawn(connection(client, upstream, rx.clone(), stop.clone(), stats.clone()));
                }
            }
        }
    }
}

async fn rebind(port: u16, stop: &CancellationToken) -> Option<TcpListener> {
    loop {
        match bind(port) {
            Ok(l) => return Some(l),
            Err(e) => tracing::warn!(port, error = %e, "proxy cannot re-bind its port yet"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// Closes with RST instead of FIN.
fn rst(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

fn reset_due(state: &State, epoch: u64) -> bool {
    state.mode == Mode::Reset || state.reset_epoch != epoch
}

struct Active(Arc<Stats>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    rx: watch::Receiver<State>,
    stop: CancellationToken,
    stats: Arc<Stats>,
) {
    stats.active.fetch_add(1, Ordering::SeqCst);
    let _active = Active(stats);
    let epoch = rx.borrow().reset_epoch;
    if rx.borrow().mode == Mode::Reset {
        return rst(client);
    }
    let connect = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream));
    let upstream = tokio::select! {
        _ = stop.cancelled() => return,
        connected = connect => connected.ok().and_then(Result::ok),
    };
    let Some(upstream) = upstream else {
        // The store is unreachable. A silent mode stays silent until it ends.
        let mut rx = rx;
        while matches!(rx.borrow_and_update().mode, Mode::Blackhole | Mode::Freeze) {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { break },
            }
        }
        return rst(client);
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client, mut upstream) = (client, upstream);
    let end = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        let up = pipe(cr, uw, Dir::Up, rx.clone(), epoch);
        let down = pipe(ur, cw, Dir::Down, rx.clone(), epoch);
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break End::Eof,
                end = &mut up, if !up_done => {
                    if end == End::Reset { break End::Reset }
                    up_done = true;
                }
                end = &mut down, if !down_done => {
                    if end == End::Reset { break End::Reset }
                    down_done = true;
                }
            }
            if up_done && down_done {
                break End::Eof;
            }
        }
    };
    if end == End::Reset {
        rst(client);
        rst(upstream);
    }
}

/// Waits until the mode lets bytes through (not frozen); `Err` on reset.
async fn wait_unfrozen(rx: &mut watch::Receiver<State>, epoch: u64) -> Result<Mode, End> {
    loop {
        let state = *rx.borrow_and_update();
        if reset_due(&state, epoch) {
            return Err(End::Reset);
        }
        if state.mode != Mode::Freeze {
            return Ok(state.mode);
        }
        if rx.changed().await.is_err() {
            return Err(End::Eof);
        }
    }
}

fn delay(mode: Mode, dir: Dir) -> Duration {
    let (base, jitter) = match (mode, dir) {
        (Mode::Delay { base, jitter }, _) => (base, jitter),
        (Mode::DelayDownstream { base, jitter }, Dir::Down) => (base, jitter),
        _ => return Duration::ZERO,
    };
    let extra = if jitter.is_zero() {
        Duration::ZERO
    } else {
        jitter.mul_f64(rand::rng().random_range(0.0..=1.0))
    };
    base + extra
}

fn discards(mode: Mode, dir: Dir) -> bool {
    matches!(
        (mode, dir),
        (Mode::Blackhole, _) | (Mode::DropUpstream, Dir::Up) | (Mode::DropDownstream, Dir::Down)
    )
}

/// One direction: a reader that stamps each chunk with its release time, and
/// a writer that sends chunks in order once released, deciding at send time
/// (so a mode switch applies to bytes already in flight).
async fn pipe<R, W>(
    mut reader: R,
    mut writer: W,
    dir: Dir,
    rx: watch::Receiver<State>,
    epoch: u64,
) -> End
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut queue) = mpsc::channel::<(Instant, Vec<u8>)>(64);
    let mut read_rx = rx.clone();
    let read_side = async move {
        let mut buf = vec![0_u8; 16 * 1024];
        loop {
            let mode = match wait_unfrozen(&mut read_rx, epoch).await {
                Ok(mode) => mode,
                Err(end) => return end,
            };
            tokio::select! {
                biased;
                changed = read_rx.changed() => if changed.is_err() { return End::Eof },
                read = reader.read(&mut buf) => match read {
                    Ok(0) => {
                        drop(tx);
                        return End::Eof;
                    }
                    Ok(n) => {
                        let release = Instant::now() + delay(mode, dir);
                        if tx.send((release, buf[..n].to_vec())).await.is_err() {
                            return End::Reset;
                        }
                    }
                    Err(_) => return End::Reset,
                },
            }
        }
    };
    let mut write_rx = rx;
    let write_side = async move {
        while let Some((release, chunk)) = queue.recv().await {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(release) => break,
                    changed = write_rx.changed() => {
                        if changed.is_err() { return End::Eof }
                        if reset_due(&write_rx.borrow_and_update(), epoch) { return End::Reset }
                    }
                }
            }
            let mode = match wait_unfrozen(&mut write_rx, epoch).await {
                Ok(mode) => mode,
                Err(end) => return end,
            };
            if discards(mode, dir) {
                continue;
            }
            if writer.write_all(&chunk).await.is_err() {
                return End::Reset;
            }
        }
        let _ = writer.shutdown().await;
        End::Eof
    };
    tokio::pin!(read_side, write_side);
    let mut read_done = false;
    loop {
        tokio::select! {
            end = &mut read_side, if !read_done => {
                if end == End::Reset { return End::Reset }
                read_done = true;
            }
            end = &mut write_side => return end,
        }
    }
}
