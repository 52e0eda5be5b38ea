//! lock-etcd's integration tests against real etcd servers, one module per
//! idea, in one test binary (one link instead of one per file). The
//! conformance suite (`tests/conformance.rs`) and the secrets check
//! (`tests/secrets.rs`, which installs a global tracing capture) are
//! binaries of their own.
//!
//! Every module here shares this process with the others, running on
//! several test threads: each test uses names of its own (`support::name`),
//! its own client, and a private etcd wherever it counts requests, kills or
//! restarts the server, or measures; nothing sets environment variables or
//! a global tracing subscriber.

mod access;
mod clocks;
mod close;
mod cluster;
mod connect;
mod eviction;
mod failover;
mod fencing;
mod keys;
mod multi;
mod permits;
mod restore;
mod rw;
mod sessions;
mod support;
mod tls;
mod wakeups;
