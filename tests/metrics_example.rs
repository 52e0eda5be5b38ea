//! Runs the metrics example's service, scrapes `/metrics` like Prometheus
//! would, and checks that the lock metrics and their values are there.

#[path = "../examples/metrics.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("the service listens");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    reply
}

/// The value of the first sample of `metric` whose labels contain `labels`.
fn value(text: &str, metric: &str, labels: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.split_once([' ', '{']).map(|(name, _)| name) == Some(metric) && l.contains(labels)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_has_every_lock_metric() {
    let run_for = Duration::from_secs(3);
    let service = example::start("127.0.0.1:0".parse().unwrap(), run_for)
        .await
        .expect("the service starts");
    service.workload.await.expect("the workload ran");
    let text = scrape(service.addr).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let backend = r#"backend="memory""#;
    let acquired = value(
        &text,
        "distlock_acquire_wait_seconds_count",
        r#"outcome="acquired""#,
    )
    .unwrap_or_default();
    assert!(acquired >= 5.0, "acquired waits: {acquired}\n{text}");
    for (metric, labels) in [
        (
            "distlock_acquire_wait_seconds_count",
            r#"outcome="timed_out""#,
        ),
        ("distlock_acquire_attempts_count", backend),
        ("distlock_contended_attempts_total", backend),
        ("distlock_hold_seconds_count", backend),
        ("distlock_renewal_seconds_count", backend),
        ("distlock_leases_lost_total", r#"reason="store_reported""#),
        ("distlock_forced_releases_total", r#"outcome="evicted""#),
        ("distlock_long_holds_total", backend),
    ] {
        let v = value(&text, metric, labels);
        assert!(
            v.is_some_and(|v| v >= 1.0),
            "{metric}{{{labels}}} = {v:?}\n{text}"
        );
    }
    // Nobody waits or holds once the workload is over.
    assert_eq!(
        value(&text, "distlock_waiters", backend),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "distlock_locks_held", backend),
        Some(0.0),
        "{text}"
    );
}
