//! A small service that exposes its lock metrics as Prometheus text while
//! workers contend for one lock.
//!
//! ```sh
//! cargo run --example metrics --features metrics     # then: curl http://127.0.0.1:9464/metrics
//! METRICS_ADDR=127.0.0.1:0 RUN_FOR=5s cargo run --example metrics --features metrics
//! ```
//!
//! distlock (the library) only emits through the `metrics` facade; the
//! application picks the exporter. Here it is `metrics-exporter-prometheus`,
//! rendered on `/metrics` by a few lines of HTTP. A scripted opening holds
//! the lock past the long-hold threshold while another caller times out,
//! and an operator force-releases it, which shows up as a lost lease; then
//! eight workers share one `Locker` on the in-memory backend, waiting for
//! the lock (some time out) and holding it across renewals.

use std::net::SocketAddr;
use std::time::Duration;

use distlock::{Locker, MemoryBackend};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The running service: where it serves `/metrics`, and its workload.
pub(crate) struct Service {
    /// The bound address (port 0 picks a free one).
    pub addr: SocketAddr,
    /// Completes when the workers are done.
    pub workload: tokio::task::JoinHandle<()>,
}

/// Installs the Prometheus recorder (once per process), serves `/metrics` on
/// `addr`, and runs the contending workers for `run_for` in the background.
pub(crate) async fn start(addr: SocketAddr, run_for: Duration) -> std::io::Result<Service> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(std::io::Error::other)?;
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, handle));
    let workload = tokio::spawn(workload(run_for));
    Ok(Service { addr, workload })
}

/// Answers every request with the current metrics as Prometheus text.
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut request = [0_u8; 1024];
            let _ = stream.read(&mut request).await;
            let body = handle.render();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}

/// First a scripted opening that shows every kind of event once: a hold
/// past the long-hold threshold, a caller that times out on it, and an
/// operator's forced release of it. Then eight workers contend for the rest
/// of `run_for`.
async fn workload(run_for: Duration) {
    let long_hold = Duration::from_millis(500);
    let locker = Locker::new(MemoryBackend::new())
        .ttl(Duration::from_millis(300))
        .max_wait(Duration::from_millis(400))
        .long_hold(long_hold);
    let stop = tokio::time::Instant::now() + run_for;
    opening(&locker, long_hold).await;
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let locker = locker.clone();
            tokio::spawn(async move {
                while tokio::time::Instant::now() < stop {
                    match locker.acquire("settlement").await {
                        Ok(guard) => {
                            // Long enough for renewals (every TTL/3).
                            let hold = Duration::from_millis(50 + 40 * worker);
                            tokio::select! {
                                _ = guard.lost() => {}
                                _ = tokio::time::sleep(hold) => {
                                    let _ = guard.release().await;
                                }
                            }
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
}

/// The nightly job holds the lock for twice the long-hold threshold (its
/// renewer warns once it passes it); another caller gives up waiting; then
/// an operator evicts the job, which hears it as a lost lease.
async fn opening(locker: &Locker, long_hold: Duration) {
    let Ok(job) = locker.acquire("settlement").await else {
        return;
    };
    let impatient = locker.acquire_timeout("settlement", long_hold / 5);
    let _ = tokio::join!(impatient, tokio::time::sleep(long_hold * 2));
    let _ = locker
        .force_release("settlement", "example: the operator evicts the holder")
        .await;
    let _ = tokio::time::timeout(long_hold, job.lost()).await;
}

#[tokio::main]
#[allow(dead_code)] // the test includes this file for `start`
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9464".into())
        .parse()?;
    let run_for = std::env::var("RUN_FOR")
        .ok()
        .map(|s| humantime::parse_duration(&s))
        .transpose()?
        .unwrap_or(Duration::from_secs(60));
    let service = start(addr, run_for).await?;
    println!("serving http://{}/metrics for {run_for:?}", service.addr);
    service.workload.await?;
    Ok(())
}
