//! Memory of the CUDA backend: device allocations (`cuMemAlloc`), host-mapped memory
//! (`cuMemHostAlloc`), and IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`).
//!
//! **Same-process IPC.** CUDA refuses to open an IPC handle in the process that exported it, yet
//! the HAL allows an import anywhere on the host. A process-wide registry maps every allocation
//! this process exported (by a process-unique allocation id carried in the handle) to a weak
//! reference; an import in the exporting process returns a buffer that *aliases* the original
//! (and keeps it alive), and a handle of memory freed since fails cleanly. A second registry
//! reuses live mappings when another process's handle is imported twice into one device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys;
use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{
    Allocation, BackendKind, DeviceBuffer, DevicePtr, Error, IpcHandle, IpcHandleKind, MemoryKind,
    Result,
};

use crate::device::Context;
use crate::driver::check;

/// Payload magic of a CUDA memory handle.
pub const PAYLOAD_MAGIC: [u8; 4] = *b"MSCU";
/// Payload version.
pub const PAYLOAD_VERSION: u16 = 1;
/// Bytes of a `CUipcMemHandle`.
pub const CU_IPC_HANDLE_SIZE: usize = 64;
/// Largest allocation a handle may describe (1 TiB): a bound on what a hostile handle claims.
pub const MAX_ALLOCATION: usize = 1 << 40;
/// Longest host id accepted in a handle.
pub const MAX_HOST_ID: usize = 256;

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
    match e {
        Error::Driver {
            backend,
            call,
            code,
            message,
        } => Error::Driver {
            backend,
            call,
            code,
            message: format!("{message} (allocating {len} bytes)"),
        },
        other => other,
    }
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

/// The decoded payload of a CUDA memory IPC handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcPayload {
    /// [`mscclpp_hal::env::host_id`] of the exporter.
    pub host_id: String,
    /// Process id of the exporter.
    pub pid: u32,
    /// Device ordinal of the exporter (in the exporter's numbering).
    pub device: u32,
    /// The exporter's process-unique allocation id.
    pub alloc_id: u64,
    /// Bytes of the allocation.
    pub len: u64,
    /// The `CUipcMemHandle`.
    pub handle: [u8; CU_IPC_HANDLE_SIZE],
}

impl IpcPayload {
    /// Encodes the payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(PAYLOAD_MAGIC, PAYLOAD_VERSION);
        w.str(&self.host_id)
            .u32(self.pid)
            .u32(self.device)
            .u64(self.alloc_id)
            .u64(self.len)
            .raw(&self.handle);
        w.finish()
    }

    /// Decodes and validates a payload; never panics on garbage.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "cuda IPC handle";
        let mut r = Reader::open(WHAT, bytes, PAYLOAD_MAGIC, PAYLOAD_VERSION, PAYLOAD_VERSION)?;
        let host_id = r.str("host id", MAX_HOST_ID)?.to_owned();
        let pid = r.u32()?;
        let device = r.u32()?;
        let alloc_id = r.u64()?;
        let len = r.usize_at_most("length", MAX_ALLOCATION)? as u64;
        let handle = r.array::<CU_IPC_HANDLE_SIZE>()?;
        r.finish()?;
        if len == 0 {
            return Err(Error::malformed(WHAT, "zero length"));
        }
        if pid == 0 {
            return Err(Error::malformed(WHAT, "process id 0"));
        }
        Ok(IpcPayload {
            host_id,
            pid,
            device,
            alloc_id,
            len,
            handle,
        })
    }
}

type Registry = Mutex<HashMap<u64, Weak<dyn Allocation>>>;

/// Allocations this process exported, by allocation id.
fn exported() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Live mappings of other processes' memory: (exporter pid, allocation id, importing device).
type ImportKey = (String, u32, u64, usize);
fn imported() -> &'static Mutex<HashMap<ImportKey, Weak<dyn Allocation>>> {
    static R: OnceLock<Mutex<HashMap<ImportKey, Weak<dyn Allocation>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn this_pid() -> u32 {
    std::process::id()
}

/// Exports `buf` (a Device or Uncached allocation made by the device of `ctx`).
pub fn export(ctx: &Arc<Context>, buf: &DeviceBuffer) -> Result<IpcHandle> {
    let a = cuda_allocation(buf)?;
    if a.is_imported() {
        return Err(Error::invalid(
            "cannot export an imported mapping: export it from the process that allocated it",
        ));
    }
    if a.kind == MemoryKind::HostMapped {
        return Err(Error::invalid(
            "cannot export host-mapped memory over CUDA IPC: cuIpcGetMemHandle only exports device \
             memory (allocate MemoryKind::Device or Uncached)",
        ));
    }
    if a.ctx.ordinal() != ctx.ordinal() {
        return Err(Error::invalid(format!(
            "buffer of cuda device {} exported through device {}",
            a.ctx.ordinal(),
            ctx.ordinal()
        )));
    }
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
    {
        let mut reg = exported().lock().unwrap_or_else(|p| p.into_inner());
        reg.retain(|_, w| w.strong_count() > 0);
        reg.insert(a.id, Arc::downgrade(buf.allocation()));
    }
    let payload = IpcPayload {
        host_id: mscclpp_hal::env::host_id(),
        pid: this_pid(),
        device: ctx.ordinal() as u32,
        alloc_id: a.id,
        len: a.len as u64,
        handle,
    };
    Ok(IpcHandle {
        backend: BackendKind::Cuda,
        kind: IpcHandleKind::Memory,
        len: a.len as u64,
        payload: payload.encode(),
    })
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
    let p = IpcPayload::decode(&handle.payload)?;
    if p.len != handle.len {
        return Err(Error::malformed(
            "cuda IPC handle",
            format!(
                "outer length {} disagrees with the payload's {}",
                handle.len, p.len
            ),
        ));
    }
    let here = mscclpp_hal::env::host_id();
    if p.host_id != here {
        return Err(Error::invalid(format!(
            "IPC handle was made on host {:?}, this is host {here:?}: CUDA IPC works only within one host",
            p.host_id
        )));
    }
    if p.pid == this_pid() {
        // CUDA refuses cuIpcOpenMemHandle in the exporting process: alias the original.
        let original = exported()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p.alloc_id)
            .and_then(Weak::upgrade);
        return match original {
            Some(o) if o.len() as u64 == p.len => Ok(alias(ctx, o)),
            Some(o) => Err(Error::malformed(
                "cuda IPC handle",
                format!(
                    "handle claims {} bytes but the exported allocation has {}",
                    p.len,
                    o.len()
                ),
            )),
            None => Err(Error::invalid(format!(
                "stale IPC handle: allocation {} of this process (device {}) was freed or never exported",
                p.alloc_id, p.device
            ))),
        };
    }
    let key = (p.host_id.clone(), p.pid, p.alloc_id, ctx.ordinal());
    let mut reg = imported().lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|_, w| w.strong_count() > 0);
    if let Some(existing) = reg.get(&key).and_then(Weak::upgrade) {
        return Ok(alias(ctx, existing));
    }
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
    let a: Arc<dyn Allocation> = Arc::new(a);
    reg.insert(key, Arc::downgrade(&a));
    Ok(DeviceBuffer::new(a))
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
