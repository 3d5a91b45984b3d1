//! # mscclpp-comm — the communication layer of mscclpp-rs
//!
//! [`bootstrap`]: TCP rendezvous of the ranks and small out-of-band messages (tagged
//! send/recv, all-gather, barrier, broadcast) with deadlines and dead-peer detection.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bootstrap;

pub use bootstrap::{
    Bootstrap, BootstrapConfig, BootstrapRoot, LaunchInfo, RESERVED_TAG_BIT, UNIQUE_ID_BYTES,
    UniqueId,
};
