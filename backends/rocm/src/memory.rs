//! Memory of the ROCm backend: device allocations (`hipMalloc`), uncached device memory for
//! flags and tokens (`hipExtMallocWithFlags`), host-mapped memory (`hipHostMalloc` +
//! `hipHostGetDevicePointer`), and IPC (`hipIpcGetMemHandle` / `hipIpcOpenMemHandle`).
//!
//! **Uncached memory.** AMD GPUs cache device memory in L2 per device (and, on MI300, per
//! XCD): a flag written by a peer GPU or the host through fine-grained paths is not seen by a
//! poller reading through a stale cache line. MSCCL++ allocates its semaphores with
//! `hipDeviceMallocUncached`; so do we for [`MemoryKind::Uncached`]. ROCm 5.2 lacks that flag
//! (it rejects it with `hipErrorInvalidValue`); there we fall back to `hipDeviceMallocFinegrained`
//! (coherent across devices, the pre-5.3 way) and say so in the log.
//!
//! **Same-process IPC.** As on CUDA, an import in the exporting process aliases the original
//! allocation through [`mscclpp_hal::ipc_registry`] (by a process-unique allocation id carried
//! in the handle) instead of asking the runtime to open its own handle; a handle of memory freed
//! since fails cleanly, and a mapping imported twice into one device is reused. The payload and
//! its encoding are [`mscclpp_hal::ipc_payload`]'s, in this backend's format ([`RocmIpc`]).

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_hal::ipc_payload::{FieldOrder, IpcFormat, MemoryIpcPayload, PayloadFormat};
use mscclpp_hal::ipc_registry::IpcRegistry;
use mscclpp_hal::{
    Allocation, BackendKind, DeviceBuffer, DevicePtr, Error, IpcHandle, MemoryKind, Result,
};

use crate::device::DeviceCtx;
use crate::ffi::{self, IPC_HANDLE_SIZE, IpcMemHandle};

pub use mscclpp_hal::ipc_payload::{MAX_ALLOCATION, MAX_HOST_ID, PAYLOAD_VERSION};

/// Payload magic of a ROCm memory handle.
pub const PAYLOAD_MAGIC: [u8; 4] = *b"MSRO";

/// What owns the memory behind a [`RocmAllocation`].
#[derive(Debug)]
enum Backing {
    /// `hipMalloc` or `hipExtMallocWithFlags`; freed with `hipFree`.
    Device,
    /// `hipHostMalloc`; freed with `hipHostFree`.
    HostMapped { host: *mut u8 },
    /// `hipIpcOpenMemHandle` of another process's memory; closed with `hipIpcCloseMemHandle`.
    Imported,
    /// Another allocation of this process (same-process import); nothing to free here.
    Alias(Arc<dyn Allocation>),
}

/// One allocation or imported mapping of the ROCm backend.
#[derive(Debug)]
pub struct RocmAllocation {
    ctx: Arc<DeviceCtx>,
    ptr: u64,
    len: usize,
    kind: MemoryKind,
    backing: Backing,
    /// Process-unique id, carried in IPC handles to find the allocation again.
    id: u64,
}

// SAFETY: the value owns a runtime allocation (or a reference to one); addresses are plain
// numbers valid in every thread, and the host pointer of host-mapped memory is shared memory
// with device-memory semantics (its users synchronise themselves).
unsafe impl Send for RocmAllocation {}
// SAFETY: as above; `&RocmAllocation` only hands out addresses.
unsafe impl Sync for RocmAllocation {}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn with_size(e: Error, len: usize) -> Error {
    e.with_context(|| format!("allocating {len} bytes"))
}

impl RocmAllocation {
    /// Allocates `len` bytes of `kind` on `ctx`'s device.
    pub fn new(ctx: Arc<DeviceCtx>, len: usize, kind: MemoryKind) -> Result<Self> {
        if len == 0 || len > MAX_ALLOCATION {
            return Err(Error::invalid(format!(
                "allocation of {len} bytes: the rocm backend allocates 1 byte to {MAX_ALLOCATION} bytes"
            )));
        }
        ctx.bind()?;
        let api = ctx.api();
        let mut p: *mut c_void = std::ptr::null_mut();
        let backing = match kind {
            MemoryKind::Device => {
                // SAFETY: valid out-pointer; the device is current.
                api.check("hipMalloc", unsafe { (api.malloc)(&mut p, len) })
                    .map_err(|e| with_size(e, len))?;
                Backing::Device
            }
            MemoryKind::Uncached => {
                // SAFETY: valid out-pointer; the device is current.
                let r = unsafe {
                    (api.ext_malloc_with_flags)(&mut p, len, ffi::DEVICE_MALLOC_UNCACHED)
                };
                if r == ffi::code::INVALID_VALUE {
                    tracing::info!(
                        "hipDeviceMallocUncached refused (ROCm < 5.3); allocating fine-grained memory for flags"
                    );
                    // SAFETY: as above.
                    let r = unsafe {
                        (api.ext_malloc_with_flags)(&mut p, len, ffi::DEVICE_MALLOC_FINEGRAINED)
                    };
                    api.check("hipExtMallocWithFlags(hipDeviceMallocFinegrained)", r)
                        .map_err(|e| with_size(e, len))?;
                } else {
                    api.check("hipExtMallocWithFlags(hipDeviceMallocUncached)", r)
                        .map_err(|e| with_size(e, len))?;
                }
                Backing::Device
            }
            MemoryKind::HostMapped => {
                let flags = ffi::HOST_MALLOC_MAPPED | ffi::HOST_MALLOC_PORTABLE;
                // SAFETY: valid out-pointer; the device is current. Host memory from
                // hipHostMalloc is coherent by default on ROCm (no hipHostMallocNonCoherent),
                // which the proxy FIFO relies on.
                api.check("hipHostMalloc", unsafe {
                    (api.host_malloc)(&mut p, len, flags)
                })
                .map_err(|e| with_size(e, len))?;
                let host = p;
                let mut d: *mut c_void = std::ptr::null_mut();
                // SAFETY: `host` was just allocated mapped; valid out-pointer; flags must be 0.
                let r = unsafe { (api.host_get_device_pointer)(&mut d, host, 0) };
                if let Err(e) = api.check("hipHostGetDevicePointer", r) {
                    // SAFETY: `host` came from hipHostMalloc and is used nowhere else.
                    unsafe { (api.host_free)(host) };
                    return Err(e);
                }
                p = d;
                Backing::HostMapped { host: host.cast() }
            }
        };
        Ok(RocmAllocation {
            ctx,
            ptr: p as u64,
            len,
            kind,
            backing,
            id: next_id(),
        })
    }

    /// The device the allocation belongs to.
    pub fn context(&self) -> &Arc<DeviceCtx> {
        &self.ctx
    }
}

impl Drop for RocmAllocation {
    fn drop(&mut self) {
        let api = self.ctx.api();
        let ptr = self.ptr as *mut c_void;
        let (call, r) = match &self.backing {
            Backing::Alias(_) => return,
            _ if self.ctx.bind().is_err() => {
                tracing::warn!(
                    ptr = self.ptr,
                    len = self.len,
                    "cannot make the device current to free HIP memory; leaking it"
                );
                return;
            }
            // The memory was obtained by the matching call in `new` / `import` and is released
            // once, here; no stream uses it any more, since every enqueued operation keeps a
            // clone of the buffer until it has run.
            Backing::Device => {
                // SAFETY: see above; `ptr` came from hipMalloc / hipExtMallocWithFlags.
                ("hipFree", unsafe { (api.free)(ptr) })
            }
            Backing::HostMapped { host } => {
                // SAFETY: see above; `host` came from hipHostMalloc.
                ("hipHostFree", unsafe { (api.host_free)(host.cast()) })
            }
            Backing::Imported => {
                // SAFETY: see above; `ptr` came from hipIpcOpenMemHandle.
                ("hipIpcCloseMemHandle", unsafe {
                    (api.ipc_close_mem_handle)(ptr)
                })
            }
        };
        if let Err(e) = api.check(call, r) {
            tracing::warn!(ptr = self.ptr, len = self.len, "{e}");
        }
    }
}

impl Allocation for RocmAllocation {
    fn backend(&self) -> BackendKind {
        BackendKind::Rocm
    }
    fn device_ordinal(&self) -> usize {
        self.ctx.ordinal()
    }
    fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        self.kind
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        match &self.backing {
            Backing::HostMapped { host } => Some(*host),
            Backing::Alias(a) => a.host_ptr(),
            _ => None,
        }
    }
    fn is_imported(&self) -> bool {
        matches!(self.backing, Backing::Imported | Backing::Alias(_))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The ROCm allocation behind a buffer, or an error naming the buffer's backend.
pub fn rocm_allocation(buf: &DeviceBuffer) -> Result<&RocmAllocation> {
    buf.allocation()
        .as_any()
        .downcast_ref::<RocmAllocation>()
        .ok_or_else(|| {
            Error::invalid(format!(
                "buffer of the {} backend used with the rocm backend",
                buf.backend()
            ))
        })
}

/// The format of this backend's memory payloads: magic "MSRO", version, host id, pid, device,
/// length, allocation id, the 64-byte `hipIpcMemHandle_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocmIpc;

impl IpcFormat for RocmIpc {
    type Handle = [u8; IPC_HANDLE_SIZE];
    const FORMAT: PayloadFormat = PayloadFormat {
        backend: BackendKind::Rocm,
        magic: PAYLOAD_MAGIC,
        what: "rocm IPC handle",
        mechanism: "HIP IPC",
        export_call: "hipIpcGetMemHandle",
        order: FieldOrder::LenThenAllocId,
    };
}

/// The decoded payload of a ROCm memory IPC handle.
pub type IpcPayload = MemoryIpcPayload<RocmIpc>;

/// Allocations this process exported and mappings it imported.
static REGISTRY: IpcRegistry = IpcRegistry::new();

/// Exports `buf` (a Device or Uncached allocation made by the device of `ctx`).
pub fn export(ctx: &Arc<DeviceCtx>, buf: &DeviceBuffer) -> Result<IpcHandle> {
    let a = rocm_allocation(buf)?;
    RocmIpc::FORMAT.check_exportable(a, ctx.ordinal())?;
    a.ctx.bind()?;
    let api = ctx.api();
    let mut h = IpcMemHandle {
        reserved: [0; IPC_HANDLE_SIZE],
    };
    // SAFETY: valid out-pointer to a 64-byte handle; `a.ptr` is the base of a live allocation.
    api.check("hipIpcGetMemHandle", unsafe {
        (api.ipc_get_mem_handle)(&mut h, a.ptr as *mut c_void)
    })?;
    REGISTRY.record_export(a.id, buf.allocation());
    Ok(IpcPayload::this_process(ctx.ordinal(), a.id, a.len, h.reserved).to_handle())
}

fn alias(ctx: &Arc<DeviceCtx>, original: Arc<dyn Allocation>) -> DeviceBuffer {
    let a = RocmAllocation {
        ctx: ctx.clone(),
        ptr: original.device_ptr().0,
        len: original.len(),
        kind: original.kind(),
        backing: Backing::Alias(original),
        id: next_id(),
    };
    DeviceBuffer::new(Arc::new(a))
}

/// The `hipIpcMemLazyEnablePeerAccess` values to try, the runtime's own first: the runtime
/// rejects any value but its own (0 in ROCm 5.x, 1 from ROCm 6).
pub fn ipc_open_flags(runtime_major: i32) -> [u32; 2] {
    if runtime_major >= 6 {
        [
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V6,
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V5,
        ]
    } else {
        [
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V5,
            ffi::IPC_LAZY_ENABLE_PEER_ACCESS_V6,
        ]
    }
}

/// Maps memory exported by [`export`] in this process or another of the same host.
pub fn import(ctx: &Arc<DeviceCtx>, handle: &IpcHandle) -> Result<DeviceBuffer> {
    let p = IpcPayload::from_handle(handle)?;
    // In the exporting process the registry aliases the original rather than open our own
    // handle (CUDA refuses that, and HIP's behaviour for it is undocumented; aliasing also keeps
    // the original alive).
    REGISTRY.import(&p, ctx.ordinal(), |o| alias(ctx, o), || open(ctx, &p))
}

/// Opens another process's memory with `hipIpcOpenMemHandle` and checks its size.
fn open(ctx: &Arc<DeviceCtx>, p: &IpcPayload) -> Result<Arc<dyn Allocation>> {
    ctx.bind()?;
    let api = ctx.api();
    let h = IpcMemHandle { reserved: p.handle };
    let mut ptr: *mut c_void = std::ptr::null_mut();
    let mut r = ffi::code::INVALID_VALUE;
    for flags in ipc_open_flags(ctx.runtime_major()) {
        // SAFETY: valid out-pointer; the handle is plain bytes the runtime validates itself;
        // the device is current.
        r = unsafe { (api.ipc_open_mem_handle)(&mut ptr, h, flags) };
        if r != ffi::code::INVALID_VALUE {
            break;
        }
    }
    api.check("hipIpcOpenMemHandle", r)
        .map_err(|e| Error::Remote {
            rank: usize::MAX,
            message: format!(
                "cannot map the memory exported by process {} (device {}, {} bytes): has it exited or freed it? {e}",
                p.pid, p.device, p.len
            ),
        })?;
    let a = RocmAllocation {
        ctx: ctx.clone(),
        ptr: ptr as u64,
        len: p.len as usize,
        kind: MemoryKind::Device,
        backing: Backing::Imported,
        id: next_id(),
    };
    // Check that the mapping really is as large as the handle claims (dropping `a` on error
    // closes the mapping).
    let (mut base, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
    // SAFETY: valid out-pointers; `ptr` is a live mapping.
    api.check("hipMemGetAddressRange", unsafe {
        (api.mem_get_address_range)(&mut base, &mut size, ptr)
    })?;
    let offset = (ptr as u64).wrapping_sub(base as u64);
    if (ptr as u64) < (base as u64) || (size as u64).saturating_sub(offset) < p.len {
        return Err(Error::Remote {
            rank: usize::MAX,
            message: format!(
                "IPC handle claims {} bytes but the mapped allocation has {size} bytes at offset {offset}",
                p.len
            ),
        });
    }
    Ok(Arc::new(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> IpcPayload {
        IpcPayload {
            host_id: "host-a".into(),
            pid: 4242,
            device: 1,
            len: 1 << 20,
            alloc_id: 7,
            handle: [0xAB; IPC_HANDLE_SIZE],
        }
    }

    #[test]
    fn payload_round_trips_and_starts_with_the_magic() {
        let p = sample();
        let bytes = p.encode();
        assert_eq!(&bytes[..4], b"MSRO");
        assert_eq!(IpcPayload::decode(&bytes).unwrap(), p);
    }

    #[test]
    fn payload_rejects_zero_length_oversize_pid_zero_and_cuda_payloads() {
        let mut p = sample();
        p.len = 0;
        assert!(IpcPayload::decode(&p.encode()).is_err());
        p.len = (MAX_ALLOCATION as u64) + 1;
        let e = IpcPayload::decode(&p.encode()).unwrap_err().to_string();
        assert!(e.contains("exceeds"), "{e}");
        let mut p = sample();
        p.pid = 0;
        assert!(IpcPayload::decode(&p.encode()).is_err());
        let mut cuda = sample().encode();
        cuda[..4].copy_from_slice(b"MSCU");
        let e = IpcPayload::decode(&cuda).unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
    }

    #[test]
    fn ipc_flags_try_the_runtimes_own_value_first() {
        assert_eq!(ipc_open_flags(5), [0, 1]);
        assert_eq!(ipc_open_flags(6), [1, 0]);
        assert_eq!(ipc_open_flags(7), [1, 0]);
    }

    #[test]
    fn payload_bytes_are_the_wire_layout_of_version_1() {
        let p = sample();
        let mut w = mscclpp_hal::wire::Writer::new(*b"MSRO", 1);
        w.str(&p.host_id)
            .u32(p.pid)
            .u32(p.device)
            .u64(p.len)
            .u64(p.alloc_id)
            .raw(&p.handle);
        assert_eq!(p.encode(), w.finish());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = IpcPayload::decode(&buf);
        }

        #[test]
        fn every_truncation_is_an_error(cut in 0usize..120) {
            let buf = sample().encode();
            prop_assume!(cut < buf.len());
            prop_assert!(IpcPayload::decode(&buf[..cut]).is_err());
        }

        #[test]
        fn mutated_payloads_never_panic(pos in 0usize..120, byte in any::<u8>()) {
            let mut buf = sample().encode();
            if pos < buf.len() {
                buf[pos] = byte;
            }
            if let Ok(p) = IpcPayload::decode(&buf) {
                prop_assert!(p.len > 0 && p.len <= MAX_ALLOCATION as u64 && p.pid != 0);
            }
        }

        #[test]
        fn outer_handles_of_arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(h) = IpcHandle::from_bytes(&buf) {
                let _ = IpcPayload::decode(&h.payload);
            }
        }
    }
}
