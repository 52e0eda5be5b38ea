//! Every integration test of lock-redis but the conformance suite, the
//! secrets check (it installs a global tracing capture of every level) and
//! the scale measurements (they read this process's memory): one binary,
//! one module per concern, against real `redis-server`s the kit launches.

mod access;
mod clocks;
mod close;
#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
mod cluster_failover;
mod connect;
mod durability;
mod eviction;
mod fencing;
mod keys;
mod multi;
mod permits;
mod restore;
mod rw;
mod support;
mod tls;
mod wakeups;
