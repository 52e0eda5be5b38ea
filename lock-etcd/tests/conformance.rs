//! The whole conformance suite against a real etcd launched by the harness
//! (or the one named by `LOCK_TEST_ETCD_ENDPOINTS`), including the fault
//! cases (proxy, kill -9 + restart on a private etcd).

use lock_etcd::{EtcdBackend, EtcdConfig};

lock_conformance::suite!(lock_conformance::stores::etcd::factory(|url| {
    EtcdBackend::connect_with(EtcdConfig::new([url]))
}));
