//! Scenario (b): many waiters on one name through one `Locker`.

use super::*;

/// Scenario (b): `settings.waiters` waiters on one name in one process
/// through one `Locker`; each acquires, holds briefly, releases. The store's
/// connections (peak, sampled), peak RSS, and the time until all are served.
pub(super) async fn waiters(
    backend_name: &str,
    connect: Connect,
    probe: &dyn Probe,
    pool: &Pool,
    settings: &Settings,
    report: &mut Report,
) {
    let n = settings.waiters;
    let scenario = format!(
        "{} waiters on one name through one Locker, each holds {:?}",
        harness_count(n),
        settings.hold
    );
    let conns_before = settled_connections(probe, settings).await;
    let locker = harness::locker(connect.await, settings.ttl);
    let own = own_requests(probe).await;
    // The previous scenario's releases in the count first.
    let requests0 = settled_requests(probe, settings).await;
    sys::trim_heap();
    let rss_before = sys::rss();
    let peak_reset = sys::reset_peak_rss();
    let (cpu0, store0) = (sys::own_cpu(), store_cpu(probe));
    let started = Instant::now();
    let deadline = started + settings.deadline;
    let served = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let acquire_errors = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (locker, served, errors, acquire_errors, hold) = (
            locker.clone(),
            served.clone(),
            errors.clone(),
            acquire_errors.clone(),
            settings.hold,
        );
        let name = backend_name.to_string();
        tasks.spawn(async move {
            let wait = deadline.saturating_duration_since(Instant::now());
            match locker.acquire_timeout("bench/waiters", wait).await {
                Ok(guard) => {
                    tokio::time::sleep(hold).await;
                    if let Err(e) = guard.release().await
                        && errors.fetch_add(1, Ordering::Relaxed) == 0
                    {
                        eprintln!("{name}: a waiter's release failed: {e}");
                    }
                    served.fetch_add(1, Ordering::Relaxed);
                }
                Err(LockError::Timeout { .. }) => {}
                Err(e) => {
                    if acquire_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("{name}: a waiter's acquire failed: {e}");
                    }
                }
            }
        });
    }
    // Sample the server's connections while the waiters are at it.
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampling = {
        let (done, peak) = (done.clone(), peak.clone());
        async move {
            while !done.load(Ordering::Relaxed) {
                if let Some(c) = probe.connections().await {
                    peak.fetch_max(c, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let joining = async {
        let hard_stop = deadline + Duration::from_secs(5);
        let all = async { while tasks.join_next().await.is_some() {} };
        let finished = tokio::time::timeout_at(hard_stop, all).await.is_ok();
        tasks.abort_all();
        done.store(true, Ordering::Relaxed);
        finished
    };
    let (_, _finished) = tokio::join!(sampling, joining);
    let elapsed = started.elapsed();
    let cpu = sys::own_cpu().saturating_sub(cpu0);
    let store_share = store_share(store0, probe, elapsed);
    let requests1 = settled_requests(probe, settings).await;
    let served = served.load(Ordering::Relaxed);
    let errors = errors.load(Ordering::Relaxed);
    let acquire_errors = acquire_errors.load(Ordering::Relaxed);
    let peak_rss = if peak_reset { sys::peak_rss() } else { None };
    let conns = conns_before.map(|b| peak.load(Ordering::Relaxed).saturating_sub(b));

    let all_served = served == n;
    let mut result = if all_served {
        format!("all {served} served in {:.2} s", elapsed.as_secs_f64())
    } else {
        format!(
            "not all served in {:.0} s: {served}/{n}",
            settings.deadline.as_secs_f64()
        )
    };
    if acquire_errors > 0 {
        result.push_str(&format!("; {acquire_errors} acquire errors"));
    }
    if errors > 0 {
        result.push_str(&format!("; {errors} release errors"));
    }
    let per_grant = match (requests0, requests1) {
        (Some(a), Some(b)) if served > 0 => {
            Some(b.saturating_sub(a).saturating_sub(own) as f64 / served as f64)
        }
        _ => None,
    };
    report.scale.push(ScaleRow {
        backend: backend_name.to_string(),
        scenario,
        ran: served > 0,
        result: result.clone(),
        round_trips: per_grant.map_or("n/a".into(), |r| {
            format!("{r:.1} {} per grant", probe.unit())
        }),
        connections: format!(
            "peak {} (pool: {} = {})",
            conns.map_or("n/a".into(), |c| c.to_string()),
            pool.size,
            pool.what
        ),
        client_cpu: sys::share(cpu, elapsed),
        store_cpu: store_share,
        rss: format!("peak {}", growth(peak_rss, rss_before)),
    });
    report.verdict(Verdict::new(
        backend_name,
        format!(
            "{} waiters: all served, server connections ≤ pool size",
            harness_count(n)
        ),
        format!(
            "{result}; peak connections {} (pool {})",
            conns.map_or("n/a".into(), |c| c.to_string()),
            pool.size
        ),
        Some(all_served && conns.is_none_or(|c| c <= pool.size)),
    ));
}
