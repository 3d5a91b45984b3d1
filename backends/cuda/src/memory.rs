//! Memory of the CUDA backend: device allocations (`cuMemAlloc`), host-mapped memory
//! (`cuMemHostAlloc`), and IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`).
//!
//! **Same-process IPC.** CUDA refuses to open an IPC handle in the process that exported it, yet
//! the HAL allows an import anywhere on the host: an import in the exporting process aliases
//! the original through [`mscclpp_hal::ipc_registry`], which also reuses live mappings when
//! another process's handle is imported twice into one device. The payload and its encoding are
//! [`mscclpp_hal::ipc_payload`]'s, in this backend's format ([`CudaIpc`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys;
use mscclpp_hal::ipc_payload::{FieldOrder, IpcFormat, MemoryIpcPayload, PayloadFormat};
use mscclpp_hal::ipc_registry::IpcRegistry;
use mscclpp_hal::{
    Allocation, BackendKind, DeviceBuffer, DevicePtr, Error, IpcHandle, MemoryKind, Result,
};

use crate::device::Context;
use crate::driver::check;

pub use mscclpp_hal::ipc_payload::{MAX_ALLOCATION, MAX_HOST_ID, PAYLOAD_VERSION};

/// Payload magic of a CUDA memory handle.
pub const PAYLOAD_MAGIC: [u8; 4] = *b"MSCU";
/// Bytes of a `CUipcMemHandle`.
pub const CU_IPC_HANDLE_SIZE: usize = 64;

/// What owns the memory behind a [`CudaAllocation`].
#[derive(Debug)]
enum Backing {
    /// `cuMemAlloc`; freed with `cuMemFree`.
    Device,
    /// `cuMemHostAlloc`; freed with `cuMemFreeHost`.
    HostMapped { host: *mut u8 },
    /// `cuIpcOpenMemHandle` of another process's memory; closed with `cuIpcCloseMemHandle`.
    Imported,
    /// Another allocation of this process (same-process import); nothing to free here.
    Alias(Arc<dyn Allocation>),
}

/// One allocation or imported mapping of the CUDA backend.
#[derive(Debug)]
pub struct CudaAllocation {
    ctx: Arc<Context>,
    ptr: sys::CUdeviceptr,
    len: usize,
    kind: MemoryKind,
    backing: Backing,
    /// Process-unique id, carried in IPC handles to find the allocation again.
    id: u64,
}

// SAFETY: the value owns a driver allocation (or a reference to one); the handles are plain
// numbers valid in every thread, and the host pointer of host-mapped memory is shared memory
// with device-memory semantics (its users synchronise themselves).
unsafe impl Send for CudaAllocation {}
// SAFETY: as above; `&CudaAllocation` only hands out addresses.
unsafe impl Sync for CudaAllocation {}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl CudaAllocation {
    /// Allocates `len` bytes of `kind` in `ctx`'s device.
    pub fn new(ctx: Arc<Context>, len: usize, kind: MemoryKind) -> Result<Self> {
        if len == 0 || len > MAX_ALLOCATION {
            return Err(Error::invalid(format!(
                "allocation of {len} bytes: the cuda backend allocates 1 byte to {MAX_ALLOCATION} bytes"
            )));
        }
        ctx.bind()?;
        let (ptr, backing) = match kind {
            // NVIDIA needs no separate uncached kind: flags and tokens in ordinary device memory
            // are made visible with fences / system-scope atomics, so `Uncached` is `Device`.
            MemoryKind::Device | MemoryKind::Uncached => {
                let mut p: sys::CUdeviceptr = 0;
                // SAFETY: valid out-pointer; the context is current.
                check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, len) })
                    .map_err(|e| with_size(e, len))?;
                (p, Backing::Device)
            }
            MemoryKind::HostMapped => {
                let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
                let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
                // SAFETY: valid out-pointer; the context is current.
                check("cuMemHostAlloc", unsafe {
                    sys::cuMemHostAlloc(&mut host, len, flags)
                })
                .map_err(|e| with_size(e, len))?;
                let mut p: sys::CUdeviceptr = 0;
                // SAFETY: `host` was just allocated with DEVICEMAP; valid out-pointer.
                let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut p, host, 0) };
                if let Err(e) = check("cuMemHostGetDevicePointer", r) {
                    // SAFETY: `host` came from cuMemHostAlloc and is not used elsewhere.
                    unsafe { sys::cuMemFreeHost(host) };
                    return Err(e);
                }
                (p, Backing::HostMapped { host: host.cast() })
            }
        };
        Ok(CudaAllocation {
            ctx,
            ptr,
            len,
            kind,
            backing,
            id: next_id(),
        })
    }

    /// The context the allocation belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

fn with_size(e: Error, len: usize) -> Error {
    e.with_context(|| format!("allocating {len} bytes"))
}

impl Drop for CudaAllocation {
    fn drop(&mut self) {
        let (call, r) = match &self.backing {
            Backing::Alias(_) => return,
            _ if self.ctx.bind().is_err() => {
                tracing::warn!(
                    ptr = self.ptr,
                    len = self.len,
                    "cannot make the context current to free CUDA memory; leaking it"
                );
                return;
            }
            // The memory was obtained by the matching call in `new` / `import` and is released
            // once, here; no stream uses it any more, since every enqueued operation keeps a
            // clone of the buffer until it has run.
            Backing::Device => {
                // SAFETY: see above; `ptr` came from cuMemAlloc.
                let r = unsafe { sys::cuMemFree_v2(self.ptr) };
                ("cuMemFree", r)
            }
            Backing::HostMapped { host } => {
                // SAFETY: see above; `host` came from cuMemHostAlloc.
                let r = unsafe { sys::cuMemFreeHost(host.cast()) };
                ("cuMemFreeHost", r)
            }
            Backing::Imported => {
                // SAFETY: see above; `ptr` came from cuIpcOpenMemHandle.
                let r = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
                ("cuIpcCloseMemHandle", r)
            }
        };
        if let Err(e) = check(call, r) {
            tracing::warn!(ptr = self.ptr, len = self.len, "{e}");
        }
    }
}

impl Allocation for CudaAllocation {
    fn backend(&self) -> BackendKind {
        BackendKind::Cuda
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

/// The CUDA allocation behind a buffer, or an error naming the buffer's backend.
pub fn cuda_allocation(buf: &DeviceBuffer) -> Result<&CudaAllocation> {
    buf.allocation()
        .as_any()
        .downcast_ref::<CudaAllocation>()
        .ok_or_else(|| {
            Error::invalid(format!(
                "buffer of the {} backend used with the cuda backend",
                buf.backend()
            ))
        })
}

/// The format of this backend's memory payloads: magic "MSCU", version, host id, pid, device,
/// allocation id, length, the 64-byte `CUipcMemHandle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaIpc;

impl IpcFormat for CudaIpc {
    type Handle = [u8; CU_IPC_HANDLE_SIZE];
    const FORMAT: PayloadFormat = PayloadFormat {
        backend: BackendKind::Cuda,
        magic: PAYLOAD_MAGIC,
        what: "cuda IPC handle",
        mechanism: "CUDA IPC",
        export_call: "cuIpcGetMemHandle",
        order: FieldOrder::AllocIdThenLen,
    };
}

/// The decoded payload of a CUDA memory IPC handle.
pub type IpcPayload = MemoryIpcPayload<CudaIpc>;

/// Allocations this process exported and mappings it imported.
static REGISTRY: IpcRegistry = IpcRegistry::new();

/// Exports `buf` (a Device or Uncached allocation made by the device of `ctx`).
pub fn export(ctx: &Arc<Context>, buf: &DeviceBuffer) -> Result<IpcHandle> {
    let a = cuda_allocation(buf)?;
    CudaIpc::FORMAT.check_exportable(a, ctx.ordinal())?;
    a.ctx.bind()?;
    // SAFETY: an all-zero CUipcMemHandle is a valid value of this plain byte array struct.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; `a.ptr` is the base of a live cuMemAlloc allocation.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut h, a.ptr)
    })?;
    let mut handle = [0u8; CU_IPC_HANDLE_SIZE];
    for (d, s) in handle.iter_mut().zip(h.reserved.iter()) {
        *d = *s as u8;
    }
    REGISTRY.record_export(a.id, buf.allocation());
    Ok(IpcPayload::this_process(ctx.ordinal(), a.id, a.len, handle).to_handle())
}

fn alias(ctx: &Arc<Context>, original: Arc<dyn Allocation>) -> DeviceBuffer {
    let a = CudaAllocation {
        ctx: ctx.clone(),
        ptr: original.device_ptr().0,
        len: original.len(),
        kind: original.kind(),
        backing: Backing::Alias(original),
        id: next_id(),
    };
    DeviceBuffer::new(Arc::new(a))
}

/// Maps memory exported by [`export`] in this process or another of the same host.
pub fn import(ctx: &Arc<Context>, handle: &IpcHandle) -> Result<DeviceBuffer> {
    let p = IpcPayload::from_handle(handle)?;
    // CUDA refuses cuIpcOpenMemHandle in the exporting process: the registry aliases the
    // original there.
    REGISTRY.import(&p, ctx.ordinal(), |o| alias(ctx, o), || open(ctx, &p))
}

/// Opens another process's memory with `cuIpcOpenMemHandle` and checks its size.
fn open(ctx: &Arc<Context>, p: &IpcPayload) -> Result<Arc<dyn Allocation>> {
    ctx.bind()?;
    // SAFETY: an all-zero CUipcMemHandle is a valid value; we then fill its bytes.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    for (d, s) in h.reserved.iter_mut().zip(p.handle.iter()) {
        *d = *s as std::ffi::c_char;
    }
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the handle is plain bytes the driver validates itself.
    let r = unsafe {
        sys::cuIpcOpenMemHandle_v2(
            &mut ptr,
            h,
            sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
        )
    };
    check("cuIpcOpenMemHandle", r).map_err(|e| Error::Remote {
        rank: usize::MAX,
        message: format!(
            "cannot map the memory exported by process {} (device {}, {} bytes): has it exited or freed it? {e}",
            p.pid, p.device, p.len
        ),
    })?;
    let a = CudaAllocation {
        ctx: ctx.clone(),
        ptr,
        len: p.len as usize,
        kind: MemoryKind::Device,
        backing: Backing::Imported,
        id: next_id(),
    };
    // Check the mapping really is as large as the handle claims.
    let (mut base, mut size) = (0 as sys::CUdeviceptr, 0usize);
    // SAFETY: valid out-pointers; `ptr` is a live mapping.
    check("cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    if base != ptr || (size as u64) < p.len {
        return Err(Error::Remote {
            rank: usize::MAX,
            message: format!(
                "IPC handle claims {} bytes but the mapped allocation has {size} bytes at offset {}",
                p.len,
                ptr.wrapping_sub(base)
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
            alloc_id: 7,
            len: 1 << 20,
            handle: [0xAB; CU_IPC_HANDLE_SIZE],
        }
    }

    #[test]
    fn payload_round_trips() {
        let p = sample();
        assert_eq!(IpcPayload::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn payload_rejects_zero_length_and_oversize() {
        let mut p = sample();
        p.len = 0;
        assert!(IpcPayload::decode(&p.encode()).is_err());
        p.len = (MAX_ALLOCATION as u64) + 1;
        let e = IpcPayload::decode(&p.encode()).unwrap_err().to_string();
        assert!(e.contains("exceeds"), "{e}");
    }

    #[test]
    fn payload_bytes_are_the_wire_layout_of_version_1() {
        let p = sample();
        let mut w = mscclpp_hal::wire::Writer::new(*b"MSCU", 1);
        w.str(&p.host_id)
            .u32(p.pid)
            .u32(p.device)
            .u64(p.alloc_id)
            .u64(p.len)
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
            let _ = IpcPayload::decode(&buf);
        }
    }
}
