//! The whole conformance suite against a real ZooKeeper launched by the
//! harness (or the one `LOCK_TEST_ZOOKEEPER` names), including the fault
//! cases: a proxy in front of the shared server, and private servers to kill
//! and pause.

mod support;

lock_conformance::suite!(support::factory());
