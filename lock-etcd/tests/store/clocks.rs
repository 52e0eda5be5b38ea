//! A host suspend while a session's proof of life is in flight: a lease
//! counts from the moment (both clocks) read before that proof's request
//! was sent, so time the host spent suspended meanwhile counts against it,
//! as it does on etcd's lease timer. The host's suspend is played by a clock
//! whose boot time jumps (`EtcdConfig::clock`, for tests); a fault proxy
//! keeps the request in flight while it does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::etcd;
use lock_etcd::testing::{sessions, with_clock};
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::{Clock, Moment};
use lockcore::{Lease, LockBackend};

use crate::support::*;

const TTL: Duration = Duration::from_secs(30);
/// Longer than any request's round trip here, shorter than a quarter of the
/// TTL (a session proved alive longer ago than that is refreshed before a
/// new lock is written to it: the lock would count from that refresh).
const SLEPT: Duration = Duration::from_secs(5);

/// The system clocks, but the boot clock runs ahead by whatever the host
/// "slept".
#[derive(Debug, Default)]
struct SleepyHost {
    slept: Mutex<Duration>,
}

impl SleepyHost {
    fn suspend_for(&self, d: Duration) {
        *self.slept.lock().unwrap() += d;
    }
}

impl Clock for SleepyHost {
    fn now(&self) -> Moment {
        let now = Moment::now();
        let boot = now.boot().unwrap_or_default() + *self.slept.lock().unwrap();
        Moment::from_parts(now.mono(), Some(boot))
    }
}

/// A client on `host`'s clock through `proxy`, and the proxy's one-way delay.
async fn client(host: &Arc<SleepyHost>, proxy: &FaultProxy) -> (EtcdBackend, Duration) {
    let store = etcd::shared();
    let delay = scaled(Duration::from_millis(300));
    let backend = EtcdBackend::connect_with(with_clock(
        EtcdConfig::new([store.endpoint_via(proxy.addr())]).request_timeout(delay * 8),
        host.clone(),
    ))
    .await
    .unwrap();
    (backend, delay)
}

/// Runs `work` with every byte both ways `delay` late, and suspends the host
/// for [`SLEPT`] once the first request is half-way there.
async fn suspended_in_flight<T: Send + 'static>(
    host: &Arc<SleepyHost>,
    proxy: &FaultProxy,
    delay: Duration,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    proxy.set(Mode::Delay {
        base: delay,
        jitter: Duration::ZERO,
    });
    let running = tokio::spawn(work);
    tokio::time::sleep(delay / 2).await;
    host.suspend_for(SLEPT);
    let done = running.await.unwrap();
    proxy.set(Mode::Pass);
    done
}

/// What a lease may claim at most: the TTL less the suspend.
fn assert_counts_the_suspend(what: &str, lease: &Lease) {
    let left = lease.remaining();
    eprintln!("{what}: {left:?} left of a {TTL:?} TTL after a {SLEPT:?} suspend in flight");
    assert!(
        left <= TTL - SLEPT,
        "{what}: the lease claims {left:?} of its {TTL:?} TTL after the host slept {SLEPT:?} \
         while the request that proved it was in flight"
    );
    assert!(!left.is_zero(), "{what}: the lease ran out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_while_the_session_grant_is_in_flight_counts_against_the_lease() {
    let host = Arc::new(SleepyHost::default());
    let proxy = FaultProxy::start(etcd::shared().addr()).await.unwrap();
    let (backend, delay) = client(&host, &proxy).await;
    let lock = name("suspend-grant");
    assert_eq!(sessions(&backend), 0, "the first lock grants the session");
    let granting = backend.clone();
    let lease = suspended_in_flight(&host, &proxy, delay, async move {
        acquire(&granting, &lock, TTL).await
    })
    .await;
    assert_counts_the_suspend("a lock on a session granted meanwhile", &lease);
    backend.release(&lease).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_while_a_renewal_is_in_flight_counts_against_the_renewed_lease() {
    let host = Arc::new(SleepyHost::default());
    let proxy = FaultProxy::start(etcd::shared().addr()).await.unwrap();
    let (backend, delay) = client(&host, &proxy).await;
    let lease = acquire(&backend, &name("suspend-renewal"), TTL).await;
    let renewing = (backend.clone(), lease.clone());
    let renewed = suspended_in_flight(&host, &proxy, delay, async move {
        renewing.0.renew(&renewing.1).await
    })
    .await
    .expect("renewed");
    assert_counts_the_suspend("a renewal", &renewed);
    backend.release(&renewed).await.unwrap();
}
