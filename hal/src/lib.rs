//! # mscclpp-hal — the vendor-neutral hardware abstraction of mscclpp-rs
//!
//! (crate contract written below as the modules land)
#![deny(unsafe_op_in_unsafe_fn)]

pub mod env;
pub mod error;
pub mod wire;

pub use error::{Error, ErrorClass, Result};
