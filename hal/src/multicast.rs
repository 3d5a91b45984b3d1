//! Multicast memory: one group of equally sized buffers, one per member device, that can be
//! written to all at once and reduced across (NVLink SHARP on NVIDIA; emulated on host).
//!
//! Flow, the same on every backend: one member creates the group and exports it; the others
//! import it; each member binds one buffer of its own device; each member maps the group once
//! all have bound. Callers must check [`crate::Capabilities::multicast`] first, and the CUDA
//! backend refuses to create groups when the environment disables NVLink multicast
//! ([`crate::env::multicast_disabled`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::ipc::IpcHandle;
use crate::memory::{BufferSlice, DevicePtr};

/// A multicast group, created or imported.
pub trait MulticastGroup: Send + Sync + fmt::Debug {
    /// Bytes each member binds.
    fn size(&self) -> usize;
    /// Number of members.
    fn num_members(&self) -> usize;
    /// Exports the group for the other members.
    fn export(&self) -> Result<IpcHandle>;
    /// Binds this member's buffer (exactly [`MulticastGroup::size`] bytes) as member `member`.
    fn bind(&self, member: usize, buf: &BufferSlice) -> Result<()>;
    /// Waits (at most `timeout`) until every member has bound, then maps the group.
    fn map(&self, timeout: Duration) -> Result<MulticastMapping>;
}

/// How a mapped group is addressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MulticastAddress {
    /// One address whose stores reach every member and whose reducing loads combine them.
    Hardware(DevicePtr),
    /// Every member's buffer mapped into this process, indexed by member.
    Emulated(Vec<DevicePtr>),
}

/// A mapped multicast group; the addresses stay valid while it lives.
#[derive(Clone)]
pub struct MulticastMapping {
    /// The addresses.
    pub address: MulticastAddress,
    /// Whatever keeps the mapping alive (imported buffers, driver objects).
    pub keep_alive: Arc<dyn std::any::Any + Send + Sync>,
}

impl fmt::Debug for MulticastMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MulticastMapping")
            .field("address", &self.address)
            .finish()
    }
}
