//! The whole conformance suite against a real etcd launched by the harness
//! (or the one named by `LOCK_TEST_ETCD_URL`), including the fault
//! cases (proxy, kill -9 + restart on a private etcd).

use lock_etcd::EtcdBackend;

lock_conformance::suite!(
    lock_conformance::StoreFactory::etcd(|url| async move { EtcdBackend::connect(&url).await }),
    // etcd expires leases on its leader's monotonic lease timer, which no
    // wall-clock step moves (and libfaketime cannot step a Go binary's clock).
    expect_skips = [server_clock_steps_are_judged_on_the_server],
);
