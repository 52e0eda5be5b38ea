//! Every integration test of lock-zookeeper against real ZooKeeper servers
//! but the conformance suite, the secrets test (it installs a global tracing
//! capture) and the scale tests (they measure the process): one binary, so
//! the test command links one instead of one per file. The tests share the
//! kit's ZooKeeper; those that kill, pause, restore or cut off a server
//! start one of their own.

mod access;
mod clocks;
mod close;
mod cluster;
mod connect;
mod containers;
mod eviction;
mod expiry;
mod fencing;
mod keys;
mod locks;
mod multi;
mod permits;
mod rebuilt;
mod remaining;
mod restore;
mod rw;
mod sasl;
mod sessions;
mod support;
mod tap;
mod tls;
mod wakeups;
