#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod connect;

pub use connect::{SCHEMES, connect};
pub use lockcore::*;
