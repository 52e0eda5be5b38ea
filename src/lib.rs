//! distlock: safe distributed locks.
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub use lockcore::*;
