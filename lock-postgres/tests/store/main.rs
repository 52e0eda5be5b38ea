//! Every integration test of lock-postgres against real PostgreSQL servers,
//! in one binary (one link instead of one per file); each module is one
//! idea, named as in the other adapters. The conformance suite against a
//! default server is `tests/conformance.rs`, and `tests/secrets.rs` stays
//! apart because it installs a global tracing capture.

mod clocks;
mod close;
mod connect;
mod durability;
mod eviction;
mod fencing;
mod grants;
mod keys;
mod locks;
mod multi;
mod permits;
mod restore;
mod rw;
mod support;
mod tls;
mod wakeups;
