//! Device memory of the host backend: shared-memory files (memfd) mapped into the process.
//!
//! Because the memory is a file, another process of the same host can map the very same pages:
//! an IPC handle names the exporting process, its descriptor number and the file's identity
//! (device and inode), and the importer reopens it through `/proc/<pid>/fd/<n>`. The identity
//! check makes a stale handle (the exporter freed the memory and the descriptor number was
//! reused) fail instead of mapping the wrong file.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{
    Allocation, BackendKind, DeviceBuffer, DevicePtr, Error, IpcHandle, IpcHandleKind, MemoryKind,
    Result,
};
use rustix::fs::{MemfdFlags, Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};

const PAYLOAD_MAGIC: [u8; 4] = *b"MSHM";
const PAYLOAD_VERSION: u16 = 1;
/// The largest allocation the host backend will make or import (1 TiB): a bound on what a
/// hostile handle can make us map.
pub const MAX_ALLOCATION: usize = 1 << 40;

/// The live mappings of this process (address, length), ordered by address: for
/// [`install_exit_teardown`] and [`allocation_range`].
fn live_mappings() -> &'static std::sync::Mutex<std::collections::BTreeMap<usize, usize>> {
    static LIVE: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeMap<usize, usize>>> =
        std::sync::OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// The mapping of this process that holds `ptr` (made here or imported), as a GPU runtime
/// answers for its allocations; `None` for memory the backend did not map (which it still
/// accepts as caller memory).
pub fn allocation_range(ptr: DevicePtr) -> Option<(DevicePtr, usize)> {
    let addr = usize::try_from(ptr.0).ok()?;
    let live = live_mappings().lock().unwrap_or_else(|p| p.into_inner());
    let (&base, &len) = live.range(..=addr).next_back()?;
    (addr - base < len).then_some((DevicePtr(base as u64), len))
}

/// With `MSCCLPP_HOST_EXIT_TEARDOWN=1`, makes this process's host-backend memory inaccessible
/// when it exits, as a GPU runtime's teardown frees its allocations at exit (see
/// `mscclpp_hal::exit`): a background thread that touches it afterwards faults here as it would
/// on a GPU. The handler is registered when a device is opened, before any communicator exists,
/// as a vendor runtime's is. Tests of exit paths set it; by default memory stays mapped.
pub fn install_exit_teardown() -> Result<()> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if mscclpp_hal::env::flag("MSCCLPP_HOST_EXIT_TEARDOWN")? != Some(true) {
        return Ok(());
    }
    ONCE.call_once(|| {
        // SAFETY: a plain `extern "C" fn()` of static lifetime that never unwinds.
        if unsafe { atexit(teardown_at_exit) } != 0 {
            tracing::warn!("atexit refused the host backend's exit teardown");
        }
    });
    Ok(())
}

// SAFETY: C's `atexit`, with this signature.
unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn teardown_at_exit() {
    let live = live_mappings().lock().unwrap_or_else(|p| p.into_inner());
    for (&addr, &len) in live.iter() {
        // SAFETY: a mapping this process made and still holds (it is removed from the table
        // before its munmap); nothing may use it after exit has begun, which is the point.
        let _ = unsafe {
            rustix::mm::mprotect(
                addr as *mut std::ffi::c_void,
                len,
                rustix::mm::MprotectFlags::empty(),
            )
        };
    }
}

/// A new zero-filled shared-memory file of `len` bytes.
fn memory_file(len: usize) -> Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("mscclpp-device-memory", MemfdFlags::CLOEXEC)
        .map_err(|e| Error::io("memfd_create for host device memory", e.into()))?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(|e| {
        Error::io(
            format!("sizing host device memory to {len} bytes"),
            e.into(),
        )
    })?;
    Ok(fd)
}

/// Records a mapping made outside [`ShmAllocation`] (a part of a symmetric range), so that
/// [`allocation_range`] names it.
pub(crate) fn note_mapping(ptr: usize, len: usize) {
    live_mappings()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(ptr, len);
}

/// Forgets a mapping of [`note_mapping`].
pub(crate) fn forget_mapping(ptr: usize) {
    live_mappings()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&ptr);
}

/// One shared-memory mapping, made here or imported.
#[derive(Debug)]
pub struct ShmAllocation {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
    kind: MemoryKind,
    device: usize,
    imported: bool,
    file_id: (u64, u64),
}

// SAFETY: the mapping is plain shared memory owned by this value until drop; concurrent access
// through it has device-memory semantics (the users of raw pointers synchronise themselves).
unsafe impl Send for ShmAllocation {}
// SAFETY: as above; `&ShmAllocation` only hands out the address.
unsafe impl Sync for ShmAllocation {}

impl ShmAllocation {
    /// Allocates `len` bytes of zero-filled shared memory.
    pub fn new(len: usize, kind: MemoryKind, device: usize) -> Result<Self> {
        if len == 0 || len > MAX_ALLOCATION {
            return Err(Error::invalid(format!(
                "allocation of {len} bytes: the host backend allocates 1 byte to {MAX_ALLOCATION} bytes"
            )));
        }
        Self::map(memory_file(len)?, len, kind, device, false, None)
    }

    /// Allocates `len` bytes of zero-filled shared memory mapped over `at` (page aligned), which
    /// the caller reserved for it (a piece of a range of several mappings).
    ///
    /// # Safety
    /// `at..at + len` is address space the caller reserved and owns, used by nothing else:
    /// the mapping replaces whatever is there.
    pub(crate) unsafe fn new_at(len: usize, device: usize, at: *mut u8) -> Result<Self> {
        Self::map(
            memory_file(len)?,
            len,
            MemoryKind::Device,
            device,
            false,
            Some(at),
        )
    }

    fn map(
        fd: OwnedFd,
        len: usize,
        kind: MemoryKind,
        device: usize,
        imported: bool,
        at: Option<*mut u8>,
    ) -> Result<Self> {
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("fstat of host memory", e.into()))?;
        let (addr, flags) = match at {
            Some(p) => (p.cast(), MapFlags::SHARED | MapFlags::FIXED),
            None => (std::ptr::null_mut(), MapFlags::SHARED),
        };
        // SAFETY: a shared mapping of a file we hold open: a fresh one, or one over address
        // space the caller reserved for it (`new_at`'s contract); no other memory is affected.
        let ptr = unsafe {
            rustix::mm::mmap(addr, len, ProtFlags::READ | ProtFlags::WRITE, flags, &fd, 0)
        }
        .map_err(|e| {
            Error::io(
                format!("mapping {len} bytes of host device memory"),
                e.into(),
            )
        })?;
        live_mappings()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr as usize, len);
        Ok(ShmAllocation {
            fd,
            ptr: ptr.cast(),
            len,
            kind,
            device,
            imported,
            file_id: (st.st_dev, st.st_ino),
        })
    }

    /// Encodes the handle another process uses to map this allocation.
    pub fn export(&self) -> Result<IpcHandle> {
        if self.imported {
            return Err(Error::invalid(
                "cannot export an imported mapping: export it from the process that allocated it",
            ));
        }
        Ok(IpcHandle {
            backend: BackendKind::Host,
            kind: IpcHandleKind::Memory,
            len: self.len as u64,
            payload: self.payload(),
        })
    }

    pub(crate) fn payload(&self) -> Vec<u8> {
        let mut w = Writer::new(PAYLOAD_MAGIC, PAYLOAD_VERSION);
        w.str(&mscclpp_hal::env::host_id())
            .u32(rustix::process::getpid().as_raw_nonzero().get() as u32)
            .u32(self.fd.as_raw_fd() as u32)
            .u64(self.file_id.0)
            .u64(self.file_id.1)
            .u64(self.len as u64)
            .u8(match self.kind {
                MemoryKind::Device => 0,
                MemoryKind::HostMapped => 1,
                MemoryKind::Uncached => 2,
            });
        w.finish()
    }

    /// Maps memory exported by [`ShmAllocation::export`] (in this process or another).
    pub fn import(payload: &[u8], device: usize) -> Result<Self> {
        let mut r = Reader::open(
            "host IPC handle",
            payload,
            PAYLOAD_MAGIC,
            PAYLOAD_VERSION,
            PAYLOAD_VERSION,
        )?;
        let host = r.str("host id", 256)?.to_owned();
        let pid = r.u32()?;
        let fd_num = r.u32()?;
        let dev = r.u64()?;
        let ino = r.u64()?;
        let len = r.usize_at_most("length", MAX_ALLOCATION)?;
        let kind = match r.u8()? {
            0 => MemoryKind::Device,
            1 => MemoryKind::HostMapped,
            2 => MemoryKind::Uncached,
            k => {
                return Err(Error::malformed(
                    "host IPC handle",
                    format!("memory kind {k}"),
                ));
            }
        };
        r.finish()?;
        if len == 0 {
            return Err(Error::malformed("host IPC handle", "zero length"));
        }
        let here = mscclpp_hal::env::host_id();
        if host != here {
            return Err(Error::invalid(format!(
                "IPC handle was made on host {host:?}, this is host {here:?}: host-backend memory is shared only within one host"
            )));
        }
        let path = format!("/proc/{pid}/fd/{fd_num}");
        let fd = rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).map_err(
            |e| {
                Error::Remote {
                    rank: usize::MAX,
                    message: format!(
                        "cannot open exported memory at {path} (has process {pid} exited or freed it?): {e}"
                    ),
                }
            },
        )?;
        let st =
            rustix::fs::fstat(&fd).map_err(|e| Error::io(format!("fstat {path}"), e.into()))?;
        if (st.st_dev, st.st_ino) != (dev, ino) {
            return Err(Error::Remote {
                rank: usize::MAX,
                message: format!(
                    "stale IPC handle: {path} is no longer the exported memory (process {pid} freed it)"
                ),
            });
        }
        if (st.st_size as u64) < len as u64 {
            return Err(Error::Remote {
                rank: usize::MAX,
                message: format!(
                    "IPC handle claims {len} bytes but the exported memory has {} bytes",
                    st.st_size
                ),
            });
        }
        Self::map(fd, len, kind, device, true, None)
    }
}

impl ShmAllocation {
    /// The file of the memory (another process or range maps the same pages through it).
    pub(crate) fn file(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

impl Drop for ShmAllocation {
    fn drop(&mut self) {
        live_mappings()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(self.ptr as usize));
        // SAFETY: `ptr`/`len` are exactly the mapping made in `map`, and nothing uses it any more:
        // every user holds the `Arc` that is being dropped.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) } {
            tracing::warn!(len = self.len, "munmap of host device memory failed: {e}");
        }
    }
}

impl Allocation for ShmAllocation {
    fn backend(&self) -> BackendKind {
        BackendKind::Host
    }
    fn device_ordinal(&self) -> usize {
        self.device
    }
    fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr as u64)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        self.kind
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.ptr)
    }
    fn is_imported(&self) -> bool {
        self.imported
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The host allocation behind a buffer, or an error naming the buffer's backend.
pub fn host_allocation(buf: &DeviceBuffer) -> Result<&ShmAllocation> {
    buf.allocation()
        .as_any()
        .downcast_ref::<ShmAllocation>()
        .ok_or_else(|| {
            if buf
                .allocation()
                .as_any()
                .is::<crate::pieces::PiecesAllocation>()
            {
                Error::invalid(
                    "a range of several mappings cannot be shared with peers as one handle: \
                     each mapping is its own memory (allocate one buffer to share it)",
                )
            } else if buf.backend() == mscclpp_hal::BackendKind::Host {
                // The one other kind of host buffer: a caller's pointer wrapped by
                // `Device::wrap_external` (NumPy memory), which no other process can map.
                Error::invalid(
                    "a host buffer wrapped from a caller's pointer is not this library's \
                     allocation: only memory the library allocated (Device::alloc, ncclMemAlloc, \
                     Communicator.alloc in Python) can be shared with peers",
                )
            } else {
                Error::invalid(format!(
                    "buffer of the {} backend used with the host backend",
                    buf.backend()
                ))
            }
        })
}

/// Wraps an allocation in a buffer handle.
pub fn into_buffer(a: ShmAllocation) -> DeviceBuffer {
    DeviceBuffer::new(Arc::new(a))
}
