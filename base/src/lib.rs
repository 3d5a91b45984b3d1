//! # mscclpp-base — the vocabulary below the HAL
//!
//! What every layer of mscclpp-rs speaks and nothing in it needs a device: typed errors and
//! their classes ([`error`]), element types and reduction operators with their host arithmetic
//! ([`dtype`]), the versioned, bounded codec of every byte that crosses a process ([`wire`]),
//! environment parsing ([`env`](mod@env)), network interfaces ([`net`]) and the exit codes of
//! the tools ([`exit`]). The bootstrap sits on this crate alone; the HAL re-exports it, so that
//! `mscclpp_hal::wire` and the like stay where users of the HAL find them.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod dtype;
pub mod env;
pub mod error;
pub mod exit;
pub mod net;
pub mod plugin_log;
pub mod wire;

pub use dtype::{DataType, ReduceOp};
pub use error::{Error, ErrorClass, Result};
