//! Host-side channel objects; each produces the `#[repr(C)]` device handle that kernels use.
//!
//! - [`BaseMemoryChannel`]: signal/wait only, over a [`MemoryDevice2DeviceSemaphore`].
//! - [`MemoryChannel`]: plus the peer's registered memory mapped here, a local source and a local
//!   packet buffer — put/get/read/write and LL packets done by the device itself.
//! - [`SwitchChannel`]: reduce/broadcast over a multicast group.
//! - Port channels come from the proxy service (`crate::proxy`).
//!
//! The objects own (or share) everything their handle points at, so a handle stays valid as long
//! as its channel lives.

use std::sync::Arc;
use std::time::Duration;

use mscclpp_hal::dev::{
    BaseMemoryChannelDeviceHandle, MemoryChannelDeviceHandle, SwitchChannelDeviceHandle,
};
use mscclpp_hal::{
    BufferSlice, Device, DeviceBuffer, Error, MemoryKind, MulticastAddress, MulticastGroup,
    MulticastMapping, Result,
};
use mscclpp_transports::RegisteredMemory;

use crate::semaphore::MemoryDevice2DeviceSemaphore;

/// Signal/wait between two devices.
#[derive(Debug, Clone)]
pub struct BaseMemoryChannel {
    semaphore: Arc<MemoryDevice2DeviceSemaphore>,
}

impl BaseMemoryChannel {
    /// A channel over `semaphore`.
    pub fn new(semaphore: Arc<MemoryDevice2DeviceSemaphore>) -> Self {
        BaseMemoryChannel { semaphore }
    }

    /// The device handle.
    pub fn device_handle(&self) -> BaseMemoryChannelDeviceHandle {
        BaseMemoryChannelDeviceHandle {
            semaphore: self.semaphore.device_handle(),
        }
    }
}

/// A memory channel to one peer.
#[derive(Debug, Clone)]
pub struct MemoryChannel {
    semaphore: Arc<MemoryDevice2DeviceSemaphore>,
    dst: Arc<RegisteredMemory>,
    src: BufferSlice,
    packet_buffer: Option<BufferSlice>,
}

impl MemoryChannel {
    /// A channel whose puts go from `src` (local) to `dst` (the peer's registered memory, which
    /// must be mapped here: registered for CudaIpc on this host), with an optional local packet
    /// buffer the peer's `put_packets` write into.
    pub fn new(
        semaphore: Arc<MemoryDevice2DeviceSemaphore>,
        dst: Arc<RegisteredMemory>,
        src: BufferSlice,
        packet_buffer: Option<BufferSlice>,
    ) -> Result<Self> {
        if dst.mapped_slice().is_none() {
            return Err(Error::invalid(format!(
                "memory channel destination of rank {} is not mapped here: register it for CudaIpc on the same host",
                dst.rank()
            )));
        }
        if dst.rank() != semaphore.peer() {
            return Err(Error::invalid(format!(
                "memory channel destination belongs to rank {} but the semaphore's peer is rank {}",
                dst.rank(),
                semaphore.peer()
            )));
        }
        Ok(MemoryChannel {
            semaphore,
            dst,
            src,
            packet_buffer,
        })
    }

    /// Bytes of the peer's memory.
    pub fn dst_len(&self) -> usize {
        self.dst.mapped_slice().map_or(0, |s| s.len())
    }

    /// Bytes of the local source.
    pub fn src_len(&self) -> usize {
        self.src.len()
    }

    /// The device handle.
    pub fn device_handle(&self) -> MemoryChannelDeviceHandle {
        MemoryChannelDeviceHandle {
            semaphore: self.semaphore.device_handle(),
            dst: self.dst.mapped_slice().map_or(0, |s| s.ptr().0),
            src: self.src.ptr().0,
            packet_buffer: self.packet_buffer.as_ref().map_or(0, |s| s.ptr().0),
        }
    }
}

/// Reduce and broadcast over a multicast group.
#[derive(Debug, Clone)]
pub struct SwitchChannel {
    _mapping: MulticastMapping,
    _members: Option<DeviceBuffer>,
    handle: SwitchChannelDeviceHandle,
}

impl SwitchChannel {
    /// Maps `group` (waiting at most `timeout` for every member to bind) and builds the channel
    /// for this member's `local` buffer (the one it bound).
    pub fn new(
        device: &Arc<dyn Device>,
        group: &dyn MulticastGroup,
        local: &BufferSlice,
        timeout: Duration,
    ) -> Result<Self> {
        if local.len() != group.size() {
            return Err(Error::invalid(format!(
                "switch channel over a {}-byte group with a {}-byte local buffer",
                group.size(),
                local.len()
            )));
        }
        let mapping = group.map(timeout)?;
        let (mc_ptr, members) = match &mapping.address {
            MulticastAddress::Hardware(p) => (p.0, None),
            MulticastAddress::Emulated(ptrs) => {
                // The member list lives in device memory, where kernels can read it.
                let buf = device.alloc(ptrs.len() * 8, MemoryKind::Device)?;
                let bytes: Vec<u8> = ptrs.iter().flat_map(|p| p.0.to_le_bytes()).collect();
                let stream = device.create_stream()?;
                stream.write_from_host(&buf.full(), &bytes)?;
                (0, Some(buf))
            }
        };
        let handle = SwitchChannelDeviceHandle {
            device_ptr: local.ptr().0,
            mc_ptr,
            member_ptrs: members.as_ref().map_or(0, |b| b.ptr().0),
            buffer_size: group.size() as u64,
            num_members: group.num_members() as u32,
            _pad: 0,
        };
        Ok(SwitchChannel {
            _mapping: mapping,
            _members: members,
            handle,
        })
    }

    /// The device handle.
    pub fn device_handle(&self) -> SwitchChannelDeviceHandle {
        self.handle
    }
}
