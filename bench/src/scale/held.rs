//! Scenario (a): many locks held through one `Locker`, kept alive by its
//! renewer.

use super::*;

/// Scenario (a): `settings.held` locks held through one `Locker` with
/// auto-renew at a short TTL; over a window after they settle, the store's
/// requests per renew tick, client and store CPU, client RSS.
pub(super) async fn held_locks(
    backend_name: &str,
    connect: Connect,
    probe: &dyn Probe,
    pool: &Pool,
    settings: &Settings,
    report: &mut Report,
) {
    let n = settings.held;
    let conns_before = settled_connections(probe, settings).await;
    sys::trim_heap();
    let rss_before = sys::rss();
    let counting = Arc::new(Counting::new(connect.await));
    let locker = harness::locker(counting.clone(), settings.renew_ttl);
    // The TTL the store enforces (a session store: its session timeout).
    let ttl = counting
        .capabilities()
        .effective_ttl(settings.renew_ttl)
        .map_or(settings.renew_ttl, |t| t.get());
    let every = ttl / 3;
    let scenario = format!(
        "{} locks held through one Locker, TTL {ttl:?}, renewed every {every:?}",
        harness_count(n)
    );

    let deadline = Instant::now() + settings.deadline;
    let errors = AtomicUsize::new(0);
    let taking = Instant::now();
    let guards: Vec<LockGuard> = stream::iter(0..n)
        .map(|i| {
            let locker = locker.clone();
            async move {
                let name = format!("bench/held/{i}");
                tokio::time::timeout_at(deadline, locker.try_acquire(name.as_str())).await
            }
        })
        .buffer_unordered(64)
        .filter_map(|taken| {
            let errors = &errors;
            async move {
                match taken {
                    Ok(Ok(Some(guard))) => Some(guard),
                    Ok(Ok(None)) | Err(_) => None,
                    Ok(Err(e)) => {
                        if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("{backend_name}: acquiring a held lock failed: {e}");
                        }
                        None
                    }
                }
            }
        })
        .collect()
        .await;
    let took = taking.elapsed();

    // Let the renewer converge on one batch per interval, and the store's
    // count take in the acquisitions and what follows them once per grant
    // (a watch set on each node): the window holds renewals only.
    let settle = match settings.smoke {
        true => every * 2,
        false => (every * 2).max(probe.lag() + every),
    };
    tokio::time::sleep(settle).await;
    let own = own_requests(probe).await;
    // At least two renew intervals, so the window holds whole ticks.
    let window = settings.renew_window.max(every * 2);
    let (requests0, batches0, leases0) = (
        probe.requests().await,
        counting.batches.load(Ordering::Relaxed),
        counting.renewed.load(Ordering::Relaxed),
    );
    let (cpu0, store0) = (sys::own_cpu(), store_cpu(probe));
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = started.elapsed();
    let (cpu1, store_share) = (sys::own_cpu(), store_share(store0, probe, elapsed));
    let requests1 = probe.requests().await;
    let ticks = counting.batches.load(Ordering::Relaxed) - batches0;
    let leases = counting.renewed.load(Ordering::Relaxed) - leases0;
    let rss = sys::rss();
    let conns = match (conns_before, probe.connections().await) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    let held = guards.len();

    let per_tick = match (requests0, requests1) {
        (Some(a), Some(b)) if ticks > 0 => {
            Some(b.saturating_sub(a).saturating_sub(own) as f64 / ticks as f64)
        }
        _ => None,
    };
    let per_conn = per_tick.zip(conns).map(|(r, c)| r / c.max(1) as f64);
    let cpu = cpu1.saturating_sub(cpu0);
    let cpu_share = cpu.as_secs_f64() / elapsed.as_secs_f64().max(1e-9);

    let releasing = Instant::now() + settings.deadline;
    let outcomes: Vec<_> = stream::iter(guards)
        .map(|g| tokio::time::timeout_at(releasing, g.release()))
        .buffer_unordered(64)
        .collect()
        .await;
    let released = outcomes
        .iter()
        .filter(|r| matches!(r, Ok(Ok(ReleaseOutcome::Released))))
        .count();
    let gone = outcomes
        .iter()
        .filter(|r| matches!(r, Ok(Ok(ReleaseOutcome::NotHeld))))
        .count();

    let errors = errors.into_inner();
    let mut result = format!(
        "{held}/{n} taken in {:.1} s, {lost} lost in the window, {released} released ({gone} no longer held); {ticks} renew ticks in {:.1} s ({} leases)",
        took.as_secs_f64(),
        elapsed.as_secs_f64(),
        harness_count(leases as usize),
    );
    if errors > 0 {
        result.push_str(&format!("; {errors} acquire errors"));
    }
    if held < n {
        result.push_str(&format!(
            "; not all taken in {:.0} s",
            settings.deadline.as_secs_f64()
        ));
    }
    let round_trips = match per_tick {
        Some(r) => format!("{r:.1} {} per tick", probe.unit()),
        None if ticks == 0 => "no renew tick in the window".into(),
        None => format!("n/a ({ticks} renew_many calls)"),
    };
    let connections = format!(
        "{} (pool: {} = {})",
        conns.map_or("n/a".into(), |c| c.to_string()),
        pool.size,
        pool.what
    );
    report.scale.push(ScaleRow {
        backend: backend_name.to_string(),
        scenario,
        ran: held > 0 && ticks > 0,
        result,
        round_trips,
        connections,
        client_cpu: sys::share(cpu, elapsed),
        store_cpu: store_share,
        rss: growth(rss, rss_before),
    });
    let complete = held == n && lost == 0 && gone == 0;
    report.verdict(Verdict::new(
        backend_name,
        format!(
            "{} held locks: ≤ 1 store round trip per renew tick per connection",
            harness_count(n)
        ),
        match (per_tick, per_conn) {
            (Some(t), Some(c)) => format!(
                "{t:.1} per tick over {} connections = {c:.1}",
                conns.unwrap_or(0)
            ),
            _ => "not countable on this store".into(),
        },
        per_conn.map(|c| c <= 1.0 && complete),
    ));
    report.verdict(Verdict::new(
        backend_name,
        format!(
            "{} held locks: client CPU < 5% of one core",
            harness_count(n)
        ),
        format!(
            "{:.1}%{}",
            cpu_share * 100.0,
            if complete { "" } else { " (not all held)" }
        ),
        Some(cpu_share < 0.05 && complete),
    ));
}

/// A backend that counts the renewer's batches, and forwards everything.
#[derive(Debug)]
pub(super) struct Counting {
    inner: Arc<dyn LockBackend>,
    /// `renew_many` calls: the renewer's ticks that renewed something.
    batches: AtomicU64,
    /// Leases in those calls.
    renewed: AtomicU64,
}

impl Counting {
    pub(super) fn new(inner: Arc<dyn LockBackend>) -> Self {
        Counting {
            inner,
            batches: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl LockBackend for Counting {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, request: &LockRequest) -> Result<Attempt, LockError> {
        self.inner.try_acquire(request).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Lease, LockError>> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.renewed
            .fetch_add(leases.len() as u64, Ordering::Relaxed);
        self.inner.renew_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }
    async fn holders(&self, name: &LockName, kind: Kind) -> Result<Vec<Holder>, LockError> {
        self.inner.holders(name, kind).await
    }
    async fn evict(
        &self,
        name: &LockName,
        expected: Option<FencingToken>,
    ) -> Result<Option<Holder>, LockError> {
        self.inner.evict(name, expected).await
    }
    async fn watch(&self, name: &LockName, kind: Kind) -> Result<Option<Wakeup>, LockError> {
        self.inner.watch(name, kind).await
    }
    async fn acquire(
        &self,
        request: &LockRequest,
        wait: &WaitPolicy,
    ) -> Result<Option<Lease>, LockError> {
        self.inner.acquire(request, wait).await
    }
    async fn raise_fence_floor(&self, floor: FencingToken) -> Result<(), LockError> {
        self.inner.raise_fence_floor(floor).await
    }
}
