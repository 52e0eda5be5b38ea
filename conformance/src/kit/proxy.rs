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
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::kit::net;

mod forward;
use forward::accept_loop;

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
