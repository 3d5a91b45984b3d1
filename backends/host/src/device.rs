//! The host backend and its devices.

use std::sync::Arc;

use mscclpp_hal::{
    Backend, BackendKind, Capabilities, Device, DeviceApi, DeviceBuffer, DeviceInfo, DevicePtr,
    Error, IpcHandle, IpcHandleKind, KernelId, KernelModule, MemoryKind, MulticastGroup,
    MulticastSupport, PeerMatrix, Result,
};

use crate::kernels::HostKernel;
pub use crate::kernels::MAX_THREADS_PER_BLOCK;
use crate::memory::{ShmAllocation, host_allocation, into_buffer};
use crate::multicast::{GRANULARITY, HostMulticastGroup};
use crate::stream::{HostEvent, HostStream};

/// Virtual devices the host backend offers: ranks map `local_rank` onto devices the same way
/// on every backend, so the host backend offers as many as a large GPU node.
pub const DEVICE_COUNT: usize = 8;

/// The CPU reference backend. Always available.
#[derive(Debug, Clone)]
pub struct HostBackend {
    infos: Vec<DeviceInfo>,
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl HostBackend {
    /// The backend with [`DEVICE_COUNT`] virtual devices sharing the machine's memory.
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let total_memory = mem_total().unwrap_or(0);
        let infos = (0..DEVICE_COUNT)
            .map(|ordinal| DeviceInfo {
                backend: BackendKind::Host,
                ordinal,
                name: format!("host CPU device {ordinal}"),
                arch: "host".into(),
                total_memory,
                warp_size: 1,
                multiprocessors: cores,
                max_threads_per_block: MAX_THREADS_PER_BLOCK,
                pci_bus_id: None,
                caps: Capabilities {
                    ipc: true,
                    host_mapped_memory: true,
                    device_memory_host_accessible: true,
                    kernels: true,
                    multicast: MulticastSupport::Emulated {
                        granularity: GRANULARITY,
                    },
                    ll128: true,
                },
            })
            .collect();
        HostBackend { infos }
    }
}

fn mem_total() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl Backend for HostBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn describe(&self) -> String {
        format!(
            "host backend: {} virtual devices over shared memory, {} CPU cores",
            self.infos.len(),
            self.infos.first().map_or(0, |i| i.multiprocessors)
        )
    }

    fn device_count(&self) -> usize {
        self.infos.len()
    }

    fn device_info(&self, ordinal: usize) -> Result<DeviceInfo> {
        self.infos.get(ordinal).cloned().ok_or_else(|| {
            Error::invalid(format!(
                "device {ordinal} does not exist: the host backend has {} devices",
                self.infos.len()
            ))
        })
    }

    fn open_device(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        crate::memory::install_exit_teardown()?;
        Ok(Arc::new(HostDevice {
            info: self.device_info(ordinal)?,
            shareable: crate::shareable::HostShareable { device: ordinal },
        }))
    }

    fn peer_access(&self) -> Result<PeerMatrix> {
        Ok(PeerMatrix::from_fn(self.infos.len(), |_, _| true))
    }
}

/// One virtual device of the host backend.
#[derive(Debug)]
pub struct HostDevice {
    info: DeviceInfo,
    shareable: crate::shareable::HostShareable,
}

impl DeviceApi for HostDevice {
    type A = crate::Host;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<DeviceBuffer> {
        Ok(into_buffer(ShmAllocation::new(
            bytes,
            kind,
            self.info.ordinal,
        )?))
    }

    fn allocation_range(&self, ptr: DevicePtr) -> Result<Option<(DevicePtr, usize)>> {
        Ok(crate::memory::allocation_range(ptr))
    }

    fn shareable(&self) -> Option<&dyn mscclpp_hal::Shareable> {
        Some(&self.shareable)
    }

    fn alloc_pieces(&self, piece_bytes: usize, count: usize) -> Result<DeviceBuffer> {
        let a = crate::pieces::PiecesAllocation::new(piece_bytes, count, self.info.ordinal)?;
        Ok(DeviceBuffer::new(Arc::new(a)))
    }

    fn create_stream(&self) -> Result<Arc<HostStream>> {
        Ok(Arc::new(HostStream::new()?))
    }

    fn create_event(&self) -> Result<Arc<HostEvent>> {
        Ok(Arc::new(HostEvent::default()))
    }

    fn ipc_export(&self, buf: &DeviceBuffer) -> Result<IpcHandle> {
        host_allocation(buf)?.export()
    }

    fn ipc_import(&self, handle: &IpcHandle) -> Result<DeviceBuffer> {
        handle.expect(BackendKind::Host, IpcHandleKind::Memory)?;
        let a = ShmAllocation::import(&handle.payload, self.info.ordinal)?;
        if mscclpp_hal::Allocation::len(&a) as u64 != handle.len {
            return Err(Error::malformed(
                "IPC handle",
                format!(
                    "outer length {} disagrees with the memory's {}",
                    handle.len,
                    mscclpp_hal::Allocation::len(&a)
                ),
            ));
        }
        Ok(into_buffer(a))
    }

    fn multicast_create(&self, bytes: usize, members: usize) -> Result<Arc<dyn MulticastGroup>> {
        Ok(Arc::new(HostMulticastGroup::create(
            bytes,
            members,
            self.info.ordinal,
        )?))
    }

    fn multicast_import(&self, handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
        Ok(Arc::new(HostMulticastGroup::import(
            handle,
            self.info.ordinal,
        )?))
    }

    fn load(&self, module: &'static KernelModule, id: KernelId) -> Result<Arc<HostKernel>> {
        let def = module.require(id)?;
        let func = def.host.ok_or_else(|| {
            Error::unavailable(
                format!("kernel {id} of module {}", module.name),
                "the module gives no host implementation of it (it runs on GPUs only)",
            )
        })?;
        Ok(Arc::new(HostKernel { id, func }))
    }

    /// The host backend has no native streams: every handle is refused. Callers with an
    /// NCCL-style API (the NCCL-compatible library) treat stream 0 as "the communicator's own
    /// stream" and order work on it themselves.
    unsafe fn wrap_stream(&self, native: u64) -> Result<Arc<HostStream>> {
        Err(Error::invalid(format!(
            "stream handle {native:#x}: the host backend has no native streams (pass 0 / NULL to use the communicator's own stream)"
        )))
    }
}
