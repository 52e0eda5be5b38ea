//! `Ctx`: what a case gets: clients, unique names, and timings scaled to the
//! backend's TTL range and the machine's speed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::{LockBackendExt, LockRequest};
use lockcore::{Attempt, Backoff, Capabilities, Lease, LeaseKind, LockBackend, LockName, Locker};
use tokio::time::Instant;

use crate::{Factory, Failure, StoreControl};

/// How to start a lock-taker process: re-run `exe` (a test binary generated
/// by `suite!`) with only its `test` (the ignored `lock_taker_process`).
#[derive(Debug, Clone)]
pub struct TakerCommand {
    /// The test binary.
    pub exe: std::path::PathBuf,
    /// The libtest name of its taker test.
    pub test: String,
}

/// The context of one case run.
pub struct Ctx {
    factory: Arc<dyn Factory>,
    caps: Capabilities,
    round_trip: Duration,
    prefix: String,
    scale: f64,
    taker: Option<TakerCommand>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("backend", &self.caps.backend)
            .field("prefix", &self.prefix)
            .field("scale", &self.scale)
            .finish()
    }
}

/// The slowest of three `inspect` round trips (errors count as taking as
/// long as they took).
async fn measure_round_trip(client: &dyn LockBackend) -> Duration {
    let probe = LockName::new("conformance/round-trip-probe").expect("a valid name");
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let sent = Instant::now();
        let _ = client.inspect(&probe).await;
        slowest = slowest.max(sent.elapsed());
    }
    slowest
}

impl Ctx {
    /// A context for `case`, with a random name prefix so cases and reruns
    /// never share a lock name. Reads `LOCK_TEST_TIME_SCALE` (default 1.0)
    /// to stretch every timing on slow machines ([`kit::env`](crate::kit::env)).
    pub async fn new(factory: Arc<dyn Factory>, case: &str) -> Result<Self, Failure> {
        let probe = factory
            .client()
            .await
            .map_err(|e| Failure::new(format!("the factory could not connect a client: {e}")))?;
        let scale = crate::kit::env::time_scale();
        let round_trip = measure_round_trip(&*probe).await;
        Ok(Ctx {
            round_trip,
            caps: probe.capabilities(),
            factory,
            prefix: format!("conformance/{case}/{:08x}", rand::random::<u32>()),
            scale,
            taker: None,
        })
    }

    /// Lets the cross-process cases start lock-taker processes.
    pub fn with_taker(mut self, taker: Option<TakerCommand>) -> Self {
        self.taker = taker;
        self
    }

    /// How to start a lock-taker, if this run can (`suite!` tests can;
    /// [`run_all`](crate::run_all) cannot).
    pub fn taker(&self) -> Option<&TakerCommand> {
        self.taker.as_ref()
    }

    /// The store process behind the factory, if it exposes one.
    pub fn store(&self) -> Option<Arc<dyn StoreControl>> {
        self.factory.store()
    }

    /// A factory over a store only this case uses (to kill, pause or
    /// restart), or `None` with [`why_no_private`](Self::why_no_private).
    pub async fn private_factory(&self) -> Result<Option<Arc<dyn Factory>>, Failure> {
        match self.factory.private().await {
            None => Ok(None),
            Some(Ok(factory)) => Ok(Some(factory)),
            Some(Err(e)) => Err(Failure::new(format!(
                "could not launch a private store: {e}"
            ))),
        }
    }

    /// Why [`private_factory`](Self::private_factory) gave nothing.
    pub fn why_no_private(&self) -> String {
        match self.factory.store().and_then(|s| s.external()) {
            Some(why) => why,
            None => {
                "the factory offers no private store to kill, pause or restart (Factory::private; \
                     the `stores` feature's factories do)"
                    .to_owned()
            }
        }
    }

    /// A private store to hurt (kill, pause, restart, step its clock) and
    /// the factory whose clients reach it, or why there is none.
    pub async fn private_store(
        &self,
    ) -> Result<Result<(Arc<dyn Factory>, Arc<dyn StoreControl>), String>, Failure> {
        let Some(private) = self.private_factory().await? else {
            return Ok(Err(self.why_no_private()));
        };
        let Some(store) = private.store() else {
            return Ok(Err("the private factory exposes no store process".into()));
        };
        Ok(Ok((private, store)))
    }

    /// A new client of a private store's `factory`.
    pub async fn private_client(
        &self,
        factory: &Arc<dyn Factory>,
    ) -> Result<Arc<dyn LockBackend>, Failure> {
        factory
            .client()
            .await
            .map_err(|e| Failure::new(format!("cannot connect to the private store: {e}")))
    }

    /// The backend's capabilities.
    pub fn caps(&self) -> &Capabilities {
        &self.caps
    }

    /// The factory.
    pub fn factory(&self) -> &Arc<dyn Factory> {
        &self.factory
    }

    /// A new independent client.
    pub async fn client(&self) -> Result<Arc<dyn LockBackend>, Failure> {
        self.factory
            .client()
            .await
            .map_err(|e| Failure::new(format!("could not connect a client: {e}")))
    }

    /// A lock name unique to this run.
    pub fn name(&self, suffix: &str) -> LockName {
        LockName::new(format!("{}/{suffix}", self.prefix)).expect("suite names are valid")
    }

    /// `d` stretched by the time scale.
    pub fn scaled(&self, d: Duration) -> Duration {
        d.mul_f64(self.scale)
    }

    /// A short TTL for cases that wait for expiry: 500 ms (scaled), or the
    /// backend's minimum if larger, rounded to what it enforces.
    pub fn short_ttl(&self) -> Duration {
        let want = self
            .scaled(Duration::from_millis(500))
            .max(self.caps.min_ttl);
        self.caps.effective_ttl(want).map_or(want, |t| t.get())
    }

    /// A TTL that outlives any case: 60 s (scaled), within the backend's range.
    pub fn long_ttl(&self) -> Duration {
        let want = self
            .scaled(Duration::from_secs(60))
            .clamp(self.caps.min_ttl, self.caps.max_ttl);
        self.caps.effective_ttl(want).map_or(want, |t| t.get())
    }

    /// Extra time the store may take beyond a TTL (its declared slack plus
    /// 1 s scaled for scheduling on a loaded machine).
    pub fn slack(&self, ttl: Duration) -> Duration {
        self.caps.slack_for(ttl) + self.scaled(Duration::from_secs(1))
    }

    /// An allowance for one store round trip on this machine: four times the
    /// slowest of a few `inspect` calls measured when the case started, plus
    /// 100 ms, scaled. For bounds such as "within one round trip".
    pub fn round_trip(&self) -> Duration {
        self.scaled(self.round_trip * 4 + Duration::from_millis(100))
    }

    /// How soon after the last store-side extension of a `ttl` lease (its
    /// grant or its last renewal to reach the store) another client gets the
    /// lock once the holder falls silent: the TTL, the backend's declared
    /// expiry slack, and one [round trip](Self::round_trip) to hear of it.
    /// No scheduling cushion beyond that: a waiter that needs more waits
    /// longer than the backend declares.
    pub fn freed_within(&self, ttl: Duration) -> Duration {
        ttl + self.caps.slack_for(ttl) + self.round_trip()
    }

    /// Whether leases have their own TTL (vs. living as long as a session).
    pub fn per_lock_leases(&self) -> bool {
        matches!(self.caps.lease_kind, LeaseKind::PerLock)
    }

    /// A `Locker` on `client` with test-friendly settings: TTL `ttl`, short
    /// backoff, waits up to 30 s (scaled).
    pub fn locker(&self, client: &Arc<dyn LockBackend>, ttl: Duration) -> Locker {
        Locker::from_arc(client.clone())
            .ttl(ttl)
            .max_wait(self.scaled(Duration::from_secs(30)))
            .backoff(Backoff::new(
                Duration::from_millis(5),
                Duration::from_millis(100),
            ))
            .recheck(self.scaled(Duration::from_millis(500)))
    }

    /// `try_acquire` that must succeed.
    pub async fn must_acquire(
        &self,
        client: &Arc<dyn LockBackend>,
        name: &LockName,
        ttl: Duration,
    ) -> Result<Lease, Failure> {
        match client.try_acquire_for(name, ttl).await? {
            Attempt::Acquired(lease) => Ok(lease),
            Attempt::Held { .. } => Err(Failure::new(format!(
                "expected to acquire free lock {name}, but it was held"
            ))),
        }
    }

    /// `try_acquire` that must find the lock held (S1). A wrongful grant is
    /// released before failing.
    pub async fn must_be_held(
        &self,
        client: &Arc<dyn LockBackend>,
        name: &LockName,
        why: &str,
    ) -> Result<(), Failure> {
        match client.try_acquire_for(name, self.long_ttl()).await? {
            Attempt::Held { .. } => Ok(()),
            Attempt::Acquired(lease) => {
                let _ = client.release(&lease).await;
                Err(Failure::new(format!(
                    "S1 violated: {name} was granted (fence {}) while {why}",
                    lease.fence()
                )))
            }
        }
    }

    /// A request for `name` for `ttl`, validated with the backend's
    /// capabilities (labelled with this process), for trait-level calls
    /// such as `try_acquire_permit`.
    pub fn request(&self, name: &LockName, ttl: Duration) -> Result<LockRequest, Failure> {
        Ok(LockRequest::new(
            name.clone(),
            self.caps.effective_ttl(ttl)?,
        ))
    }

    /// `try_acquire_permit` of one of `permits` slots of `name` that must
    /// succeed.
    pub async fn must_acquire_permit(
        &self,
        client: &Arc<dyn LockBackend>,
        name: &LockName,
        permits: u32,
        ttl: Duration,
    ) -> Result<Lease, Failure> {
        match client
            .try_acquire_permit(&self.request(name, ttl)?, permits)
            .await?
        {
            Attempt::Acquired(lease) => Ok(lease),
            Attempt::Held { .. } => Err(Failure::new(format!(
                "expected a permit of semaphore {name}, but all {permits} were taken"
            ))),
        }
    }

    /// Checks `check` every 10 ms (scaled) until it returns `Some`, or fails
    /// after `within` with `what` ([`kit::poll`](crate::kit::poll); an error
    /// from `check` fails at once).
    pub async fn eventually<T, F, Fut>(
        &self,
        within: Duration,
        what: &str,
        check: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>, Failure>>,
    {
        crate::kit::poll::try_eventually(within, what, check).await
    }
}
