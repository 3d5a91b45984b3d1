//! # mscclpp-comm — the communication layer of mscclpp-rs
//!
//! - [`bootstrap`]: TCP rendezvous of the ranks and small out-of-band messages (tagged
//!   send/recv, all-gather, barrier, broadcast) with deadlines and dead-peer detection.
//! - [`communicator`]: a rank's bootstrap, device and transport context; registers memory,
//!   exchanges it and connects to peers.
//! - [`semaphore`]: device-to-device, host-to-device and host-to-host semaphores.
//! - [`channel`]: base memory, memory and switch channels and their device handles.
//! - [`proxy`]: the proxy FIFO's host side and the proxy thread that consumes it in order
//!   (custom proxies; the base of the port-channel service).
#![deny(unsafe_op_in_unsafe_fn)]

/// The bootstrap (its own crate, `mscclpp-bootstrap`, on the vocabulary crate alone).
pub use mscclpp_bootstrap as bootstrap;
pub mod between_hosts;
pub mod channel;
pub mod communicator;
pub mod proxy;
pub mod semaphore;

pub use bootstrap::{
    Bootstrap, BootstrapConfig, BootstrapRoot, Cancel, LaunchInfo, PeerFailure, RESERVED_TAG_BIT,
    UNIQUE_ID_BYTES, UniqueId,
};

pub use between_hosts::inter_host_transport;
pub use communicator::Communicator;
