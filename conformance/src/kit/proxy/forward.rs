//! The proxy's forwarding: accepting, connecting upstream, and moving
//! bytes each way as the current [`Mode`] says.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockcore::backend::CancellationToken;
use rand::Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{Mode, State, Stats, bind};

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

/// Accepts on `listener` (at `addr`) and forwards to `fixed`, or where the
/// state says when `None`.
pub(super) async fn accept_loop(
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
