//! Connecting and staying connected: the client every clone of a backend
//! shares, its ZooKeeper sessions (one at a time, a new one once it ends),
//! what connect checks on the server, requests that survive a lost
//! connection, and closing.

mod client;
mod close;
pub(crate) mod open;
pub(crate) mod probe;
pub(crate) mod requests;
pub(crate) mod session;
#[cfg(feature = "tls")]
mod tls;

pub(crate) use client::{Client, Live};
