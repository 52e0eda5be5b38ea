//! The lock-taker: a real, separate client process that holds a lock, so the
//! cross-process cases can `kill -9` or `SIGSTOP` a lock holder (Kleppmann's
//! GC pause) instead of pretending with a task.
//!
//! Needs the `stores` feature. The process is the test binary itself: `suite!`
//! also generates an ignored test `lock_taker_process`, which [`serve`]s the
//! protocol below on stdin/stdout with a client from the same factory when
//! `LOCK_CONFORMANCE_TAKER=1`. [`TakerProcess::spawn`] re-runs the binary that
//! way, pointing it at the same store ([`Factory::helper_env`](crate::Factory::helper_env))
//! or at a fault proxy. (A separate `lock-taker` binary could not link the
//! adapters: they depend on this crate, not the other way round.)
//!
//! # Protocol
//! One command per line; every reply line starts with `TAKER ` (the test
//! harness prints its own lines to the same stdout):
//!
//! | command | replies |
//! |---|---|
//! | `acquire TTL_MS WAIT_MS NAME` | `acquired FENCE` / `timeout` / `error MSG` |
//! | `status` | `held FENCE REMAINING_MS` (time left before the guard's local deadline) / `lost FENCE REASON` / `none` |
//! | `write REGISTER VALUE DELAY_MS` | `writing FENCE` (checked held), then after DELAY_MS `written FENCE` / `refused FENCE HIGHEST` / `error MSG`; or `not-held` |
//! | `renew` | `renewed FENCE` / `error MSG` |
//! | `release` | `released` / `not-held` / `error MSG` |
//! | `abandon` | `abandoning`, then exits at once without releasing |
//! | `exit` | releases, `bye`, exits |
//!
//! The fenced write goes to a [`FencedRegister`]: a TCP endpoint in the test
//! process over a [`FencedResource`], so the token check happens outside the
//! taker, where a paused or killed taker cannot fake it.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, BufRead, Write as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::{FencedResource, FencingToken, LockBackend, LockGuard, LockName, Locker};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::TakerCommand;
use crate::kit::process;

/// Set to `1` in the environment of a taker process.
pub const TAKER_ENV: &str = "LOCK_CONFORMANCE_TAKER";
/// The address a taker connects through (`client_via`), when set.
pub const TAKER_VIA_ENV: &str = "LOCK_CONFORMANCE_TAKER_VIA";

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "TAKER {line}");
    let _ = out.flush();
}

fn one_line(s: impl fmt::Display) -> String {
    s.to_string().replace(['\n', '\r'], " ")
}

/// Serves the taker protocol on stdin/stdout with `backend` until `exit`,
/// `abandon` or end of input.
pub async fn serve(backend: Arc<dyn LockBackend>) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut guard: Option<LockGuard> = None;
    say("ready");
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("acquire") => {
                let ttl = words.next().and_then(|w| w.parse::<u64>().ok());
                let wait = words.next().and_then(|w| w.parse::<u64>().ok());
                let name = words.collect::<Vec<_>>().join(" ");
                let (Some(ttl), Some(wait)) = (ttl, wait) else {
                    say("error usage: acquire TTL_MS WAIT_MS NAME");
                    continue;
                };
                let name = match LockName::new(name) {
                    Ok(name) => name,
                    Err(e) => {
                        say(&format!("error {}", one_line(e)));
                        continue;
                    }
                };
                let locker = Locker::from_arc(backend.clone()).ttl(Duration::from_millis(ttl));
                match locker
                    .acquire_timeout(&name, Duration::from_millis(wait))
                    .await
                {
                    Ok(g) => {
                        say(&format!("acquired {}", g.fencing_token()));
                        guard = Some(g);
                    }
                    Err(lockcore::LockError::Timeout { .. }) => say("timeout"),
                    Err(e) => say(&format!("error {}", one_line(e))),
                }
            }
            Some("status") => match &guard {
                None => say("none"),
                Some(g) if g.is_held() => say(&format!(
                    "held {} {}",
                    g.fencing_token(),
                    g.lease().remaining().as_millis()
                )),
                Some(g) => say(&format!(
                    "lost {} {}",
                    g.fencing_token(),
                    one_line(
                        g.loss_reason()
                            .map_or("deadline passed".into(), |r| r.to_string())
                    )
                )),
            },
            Some("write") => {
                let register = words.next().and_then(|w| w.parse::<SocketAddr>().ok());
                let value = words.next().and_then(|w| w.parse::<u64>().ok());
                let delay = words.next().and_then(|w| w.parse::<u64>().ok());
                let (Some(register), Some(value), Some(delay)) = (register, value, delay) else {
                    say("error usage: write REGISTER VALUE DELAY_MS");
                    continue;
                };
                // A correct client checks before acting...
                let Some(fence) = guard.as_ref().and_then(|g| g.ensure_held().ok()) else {
                    say("not-held");
                    continue;
                };
                say(&format!("writing {fence}"));
                // ...and may be paused between the check and the write.
                tokio::time::sleep(Duration::from_millis(delay)).await;
                match register_write(register, fence, value).await {
                    Ok(Ok(())) => say(&format!("written {fence}")),
                    Ok(Err(highest)) => say(&format!("refused {fence} {highest}")),
                    Err(e) => say(&format!("error {}", one_line(e))),
                }
            }
            Some("renew") => match &guard {
                None => say("error nothing held"),
                Some(g) => match backend.renew(&g.lease()).await {
                    Ok(lease) => say(&format!("renewed {}", lease.fence())),
                    Err(e) => say(&format!("error {}", one_line(e))),
                },
            },
            Some("release") => match guard.take() {
                None => say("not-held"),
                Some(g) => match g.release().await {
                    Ok(lockcore::ReleaseOutcome::Released) => say("released"),
                    Ok(lockcore::ReleaseOutcome::NotHeld) => say("not-held"),
                    Err(e) => say(&format!("error {}", one_line(e))),
                },
            },
            Some("abandon") => {
                say("abandoning");
                // Like a crash: no release, no destructor, renewals stop.
                std::process::exit(0);
            }
            Some("exit") => {
                if let Some(g) = guard.take() {
                    let _ = g.release().await;
                }
                say("bye");
                return;
            }
            Some(other) => say(&format!("error unknown command {other:?}")),
            None => {}
        }
    }
}

async fn register_write(
    register: SocketAddr,
    fence: FencingToken,
    value: u64,
) -> io::Result<Result<(), u64>> {
    let stream = TcpStream::connect(register).await?;
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("write {} {value}\n", fence.get()).as_bytes())
        .await?;
    let mut reply = String::new();
    BufReader::new(read).read_line(&mut reply).await?;
    let mut words = reply.split_whitespace();
    match (
        words.next(),
        words.next().and_then(|w| w.parse::<u64>().ok()),
    ) {
        (Some("ok"), _) => Ok(Ok(())),
        (Some("stale"), Some(highest)) => Ok(Err(highest)),
        _ => Err(io::Error::other(format!("register replied {reply:?}"))),
    }
}

/// A fenced register served on a loopback port: `write FENCE VALUE` is
/// applied to [`resource`](Self::resource) (which appends VALUE) unless a
/// newer fence was already applied. Dropping it stops serving.
pub struct FencedRegister {
    addr: SocketAddr,
    resource: Arc<FencedResource<Vec<u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for FencedRegister {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedRegister")
            .field("addr", &self.addr)
            .field("resource", &self.resource)
            .finish()
    }
}

impl FencedRegister {
    /// Starts serving on a free loopback port (inside a tokio runtime).
    pub async fn start() -> io::Result<FencedRegister> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let resource = Arc::new(FencedResource::new(Vec::new()));
        let shared = resource.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let resource = shared.clone();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let mut words = line.split_whitespace();
                        let reply = match (
                            words.next(),
                            words
                                .next()
                                .and_then(|w| w.parse::<u64>().ok())
                                .and_then(FencingToken::new),
                            words.next().and_then(|w| w.parse::<u64>().ok()),
                        ) {
                            (Some("write"), Some(fence), Some(value)) => {
                                match resource.write(fence, |values| values.push(value)) {
                                    Ok(()) => "ok\n".to_owned(),
                                    Err(stale) => format!("stale {}\n", stale.highest),
                                }
                            }
                            _ => "error usage: write FENCE VALUE\n".to_owned(),
                        };
                        if write.write_all(reply.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(FencedRegister {
            addr,
            resource,
            task,
        })
    }

    /// Where takers send writes.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The resource behind it: values, accepted tokens, refused count.
    pub fn resource(&self) -> &FencedResource<Vec<u64>> {
        &self.resource
    }
}

impl Drop for FencedRegister {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A running taker process, driven over its stdin/stdout. Dropping it kills it.
pub struct TakerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: mpsc::UnboundedReceiver<String>,
    output: Arc<Mutex<VecDeque<String>>>,
}

impl fmt::Debug for TakerProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TakerProcess")
            .field("pid", &self.child.id())
            .finish()
    }
}

fn keep_tail(output: &Mutex<VecDeque<String>>, line: String) {
    let mut output = output.lock().unwrap_or_else(|p| p.into_inner());
    if output.len() >= 200 {
        output.pop_front();
    }
    output.push_back(line);
}

impl TakerProcess {
    /// Re-runs the test binary as a taker with `env` (from
    /// [`Factory::helper_env`](crate::Factory::helper_env)), connecting
    /// through `via` when given, and waits up to `within` for it to be ready.
    pub async fn spawn(
        command: &TakerCommand,
        env: &[(String, String)],
        via: Option<SocketAddr>,
        within: Duration,
    ) -> io::Result<TakerProcess> {
        let mut cmd = Command::new(&command.exe);
        cmd.args([
            "--ignored",
            "--exact",
            &command.test,
            "--nocapture",
            "--test-threads",
            "1",
            "-q",
        ])
        .env(TAKER_ENV, "1")
        .env_remove(TAKER_VIA_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        for (key, value) in env {
            cmd.env(key, value);
        }
        if let Some(via) = via {
            cmd.env(TAKER_VIA_ENV, via.to_string());
        }
        let mut child = process::spawn(cmd, "lock-taker")?;
        let stdin = child.stdin.take();
        let output = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, replies) = mpsc::unbounded_channel();
        if let Some(stdout) = child.stdout.take() {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    match line.find("TAKER ") {
                        Some(at) => {
                            let _ = tx.send(line[at + 6..].to_owned());
                        }
                        None => keep_tail(&output, line),
                    }
                }
            });
        }
        if let Some(stderr) = child.stderr.take() {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    keep_tail(&output, line);
                }
            });
        }
        let mut taker = TakerProcess {
            child,
            stdin,
            replies,
            output,
        };
        match taker.reply(within).await {
            Ok(ready) if ready == "ready" => Ok(taker),
            Ok(other) => Err(io::Error::other(format!(
                "taker did not start: {other}\n{}",
                taker.output()
            ))),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("taker did not start: {e}"),
            )),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command line.
    pub fn send(&mut self, line: &str) -> io::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("taker stdin closed"))?;
        stdin.write_all(format!("{line}\n").as_bytes())?;
        stdin.flush()
    }

    /// The next reply (without the `TAKER ` prefix), waiting up to `within`.
    pub async fn reply(&mut self, within: Duration) -> io::Result<String> {
        match tokio::time::timeout(within, self.replies.recv()).await {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("taker exited; its output:\n{}", self.output()),
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no reply from the taker within {within:?}; its output:\n{}",
                    self.output()
                ),
            )),
        }
    }

    /// Sends `line` and waits for its (first) reply.
    pub async fn command(&mut self, line: &str, within: Duration) -> io::Result<String> {
        self.send(line)?;
        self.reply(within).await
    }

    /// `kill -9`, and reaps it.
    pub fn kill(&mut self) -> io::Result<()> {
        process::signal(self.child.id(), Signal::SIGKILL)?;
        process::wait_exit(&mut self.child, Duration::from_secs(5));
        Ok(())
    }

    /// `SIGSTOP`: every thread stops, its renewal task included (returns
    /// once they have).
    pub fn pause(&self) -> io::Result<()> {
        process::signal(self.child.id(), Signal::SIGSTOP)?;
        process::wait_stopped(&[self.child.id()], Duration::from_secs(5))
    }

    /// `SIGCONT`.
    pub fn resume(&self) -> io::Result<()> {
        process::signal(self.child.id(), Signal::SIGCONT)
    }

    /// The taker's recent non-protocol output (harness lines, logs, panics).
    pub fn output(&self) -> String {
        let output = self.output.lock().unwrap_or_else(|p| p.into_inner());
        output.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for TakerProcess {
    fn drop(&mut self) {
        let _ = process::signal(self.child.id(), Signal::SIGKILL);
        process::wait_exit(&mut self.child, Duration::from_secs(5));
    }
}
