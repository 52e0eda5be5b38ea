//! A TCP tap between a client and one server that can hold the server's
//! replies back (and deliver them later, in order) while the client's
//! requests still pass: the client learns late what the server did at once.
//! (The suite's `FaultProxy` delays or drops; this holds and releases.)

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The tap; dropping it stops accepting (open connections end with the test).
#[derive(Debug)]
pub(crate) struct Tap {
    addr: SocketAddr,
    hold: watch::Sender<bool>,
}

impl Tap {
    /// A tap on a free loopback port in front of `server`, passing everything.
    pub(crate) async fn start(server: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (hold, held) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(server).await else {
                    continue;
                };
                let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                let (cr, cw) = client.into_split();
                let (ur, uw) = upstream.into_split();
                tokio::spawn(pipe(cr, uw, None));
                tokio::spawn(pipe(ur, cw, Some(held.clone())));
            }
        });
        Tap { addr, hold }
    }

    /// Where the client connects.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds the server's replies back (`true`) or delivers them, the held
    /// ones first (`false`).
    pub(crate) fn hold_replies(&self, hold: bool) {
        self.hold.send_replace(hold);
    }
}

async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut held: Option<watch::Receiver<bool>>,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(held) = held.as_mut()
            && held.wait_for(|hold| !*hold).await.is_err()
        {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
