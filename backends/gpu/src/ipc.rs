//! Memory IPC of the GPU backends: the payload of a handle, the same-process alias registry,
//! export and import.
//!
//! **Payload.** Who exported the memory (host, process, device, allocation id), the bytes the
//! importer gets and where they start in the allocation, how large the allocation is, and the
//! vendor's opaque 64-byte handle, encoded through [`mscclpp_hal::wire`] under the vendor's
//! magic. One field order for every vendor (version 3; version 2 had no offset, version 1 two
//! drifted orders). Decoding is bounded and never panics on garbage: a handle comes from another
//! process.
//!
//! **Wrapped memory.** A caller's pointer wrapped by `Device::wrap_external` (a PyTorch tensor:
//! a piece of one of the caching allocator's `cudaMalloc` segments) is exported as the runtime
//! allocation that contains it — the vendor handle names only whole allocations — plus the
//! view's offset and length; the importer maps the whole allocation once and hands out the view.
//! The exporter gives each such allocation a stable id (kept with its handle in
//! [`ExternalBases`]), so that views of one segment share one mapping in every importer: a
//! vendor may refuse to open one handle twice in a process.
//!
//! **Same-process IPC.** A GPU runtime refuses (CUDA) or leaves undefined (HIP) opening an IPC
//! handle in the process that exported it, yet the HAL allows an import anywhere on the host.
//! The [`IpcRegistry`] maps every exported allocation (by a process-unique allocation id carried
//! in the handle) to a weak reference; an import in the exporting process gets a buffer that
//! *aliases* the original (and keeps it alive), and a handle of memory freed since fails
//! cleanly. A second map reuses live mappings when another process's handle is imported twice
//! into one device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{
    Allocation, BackendKind, DeviceBuffer, Error, ExternalAllocation, IpcHandle, IpcHandleKind,
    MemoryKind, Result,
};

use crate::context::Context;
pub use crate::memory::MAX_ALLOCATION;
use crate::memory::{Backing, GpuAllocation, gpu_allocation};
use crate::runtime::{IPC_HANDLE_SIZE, IpcBytes, Runtime, Vendor};

/// Payload version.
pub const PAYLOAD_VERSION: u16 = 3;
/// Longest host id accepted in a handle.
pub const MAX_HOST_ID: usize = 256;

/// The decoded payload of a memory IPC handle.
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
    /// Bytes the importer gets.
    pub len: u64,
    /// Where they start in the allocation.
    pub offset: u64,
    /// Bytes of the whole allocation (what the vendor handle maps).
    pub alloc_len: u64,
    /// The vendor's IPC handle.
    pub handle: IpcBytes,
}

impl IpcPayload {
    /// The payload of a whole allocation this process exports now (this host, this process).
    pub fn this_process(device: usize, alloc_id: u64, len: usize, handle: IpcBytes) -> Self {
        IpcPayload {
            host_id: mscclpp_hal::env::host_id(),
            pid: std::process::id(),
            device: device as u32,
            alloc_id,
            len: len as u64,
            offset: 0,
            alloc_len: len as u64,
            handle,
        }
    }

    /// The same payload for `len` bytes at `offset` of the allocation.
    pub fn view(mut self, offset: u64, len: u64) -> Self {
        self.offset = offset;
        self.len = len;
        self
    }

    /// Whether the payload names the whole allocation.
    pub fn is_whole(&self) -> bool {
        self.offset == 0 && self.len == self.alloc_len
    }

    /// Encodes the payload under `vendor`'s magic.
    pub fn encode(&self, vendor: &Vendor) -> Vec<u8> {
        let mut w = Writer::new(vendor.ipc_magic, PAYLOAD_VERSION);
        w.str(&self.host_id)
            .u32(self.pid)
            .u32(self.device)
            .u64(self.alloc_id)
            .u64(self.len)
            .u64(self.offset)
            .u64(self.alloc_len)
            .raw(&self.handle);
        w.finish()
    }

    /// Decodes and validates a payload of `vendor`; never panics on garbage.
    pub fn decode(vendor: &Vendor, bytes: &[u8]) -> Result<Self> {
        let what = vendor.ipc_what;
        let mut r = Reader::open(
            what,
            bytes,
            vendor.ipc_magic,
            PAYLOAD_VERSION,
            PAYLOAD_VERSION,
        )?;
        let host_id = r.str("host id", MAX_HOST_ID)?.to_owned();
        let pid = r.u32()?;
        let device = r.u32()?;
        let alloc_id = r.u64()?;
        let len = r.usize_at_most("length", MAX_ALLOCATION)? as u64;
        let offset = r.usize_at_most("offset", MAX_ALLOCATION)? as u64;
        let alloc_len = r.usize_at_most("allocation length", MAX_ALLOCATION)? as u64;
        let handle = r.array::<IPC_HANDLE_SIZE>()?;
        r.finish()?;
        if len == 0 {
            return Err(Error::malformed(what, "zero length"));
        }
        if offset + len > alloc_len {
            return Err(Error::malformed(
                what,
                format!("{len} bytes at offset {offset} run past the {alloc_len}-byte allocation"),
            ));
        }
        if pid == 0 {
            return Err(Error::malformed(what, "process id 0"));
        }
        Ok(IpcPayload {
            host_id,
            pid,
            device,
            alloc_id,
            len,
            offset,
            alloc_len,
            handle,
        })
    }

    /// The outer handle that carries this payload.
    pub fn to_handle(&self, vendor: &Vendor) -> IpcHandle {
        IpcHandle {
            backend: vendor.kind,
            kind: IpcHandleKind::Memory,
            len: self.len,
            payload: self.encode(vendor),
        }
    }

    /// Decodes the payload of `handle` and checks it against the outer handle and this host.
    pub fn from_handle(vendor: &Vendor, handle: &IpcHandle) -> Result<Self> {
        handle.expect(vendor.kind, IpcHandleKind::Memory)?;
        let p = Self::decode(vendor, &handle.payload)?;
        if p.len != handle.len {
            return Err(Error::malformed(
                vendor.ipc_what,
                format!(
                    "outer length {} disagrees with the payload's {}",
                    handle.len, p.len
                ),
            ));
        }
        let here = mscclpp_hal::env::host_id();
        if p.host_id != here {
            return Err(Error::invalid(format!(
                "IPC handle was made on host {:?}, this is host {here:?}: {} works only within one host",
                p.host_id, vendor.ipc_mechanism
            )));
        }
        Ok(p)
    }
}

/// Checks that `a` may be exported through the device with ordinal `device`: memory this
/// process allocated, not host-mapped, of that device.
pub fn check_exportable(vendor: &Vendor, a: &dyn Allocation, device: usize) -> Result<()> {
    if a.is_imported() {
        return Err(Error::invalid(
            "cannot export an imported mapping: export it from the process that allocated it",
        ));
    }
    if a.kind() == MemoryKind::HostMapped {
        return Err(Error::invalid(format!(
            "cannot export host-mapped memory over {}: {} only exports device memory \
             (allocate MemoryKind::Device or Uncached)",
            vendor.ipc_mechanism, vendor.ipc_export_call
        )));
    }
    if a.device_ordinal() != device {
        return Err(Error::invalid(format!(
            "buffer of {} device {} exported through device {device}",
            vendor.kind,
            a.device_ordinal()
        )));
    }
    Ok(())
}

/// Live mappings of other processes' memory: (backend, host, exporter pid, allocation id,
/// importing device).
type ImportKey = (BackendKind, String, u32, u64, usize);
type Map<K> = Mutex<HashMap<K, Weak<dyn Allocation>>>;

/// Exported allocations and imported mappings of every GPU backend of this process (allocation
/// ids come from one process-wide counter, so one registry serves them all).
#[derive(Debug, Default)]
pub struct IpcRegistry {
    exported: OnceLock<Map<u64>>,
    imported: OnceLock<Map<ImportKey>>,
}

fn lock<K>(m: &OnceLock<Map<K>>) -> MutexGuard<'_, HashMap<K, Weak<dyn Allocation>>> {
    m.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

impl IpcRegistry {
    /// An empty registry (for a `static`).
    pub const fn new() -> Self {
        IpcRegistry {
            exported: OnceLock::new(),
            imported: OnceLock::new(),
        }
    }

    /// Records that `allocation` was exported under `alloc_id` (dropping entries of freed ones).
    pub fn record_export(&self, alloc_id: u64, allocation: &Arc<dyn Allocation>) {
        let mut reg = lock(&self.exported);
        reg.retain(|_, w| w.strong_count() > 0);
        reg.insert(alloc_id, Arc::downgrade(allocation));
    }

    /// Maps the memory of payload `p` (already checked by [`IpcPayload::from_handle`]) into
    /// the device `device` of `backend`: in the exporting process, an alias of the original
    /// (`alias`); a mapping of this device already open, another alias of it; else a new
    /// mapping from `open` (the vendor call), remembered for later imports.
    pub fn import(
        &self,
        (backend, what): (BackendKind, &'static str),
        p: &IpcPayload,
        device: usize,
        alias: impl FnOnce(Arc<dyn Allocation>) -> DeviceBuffer,
        open: impl FnOnce() -> Result<Arc<dyn Allocation>>,
    ) -> Result<DeviceBuffer> {
        if p.pid == std::process::id() {
            let original = lock(&self.exported)
                .get(&p.alloc_id)
                .and_then(Weak::upgrade);
            return match original {
                Some(o) if o.len() as u64 == p.alloc_len => Ok(alias(o)),
                Some(o) => Err(Error::malformed(
                    what,
                    format!(
                        "handle claims an allocation of {} bytes but the exported one has {}",
                        p.alloc_len,
                        o.len()
                    ),
                )),
                None => Err(Error::invalid(format!(
                    "stale IPC handle: allocation {} of this process (device {}) was freed or never exported",
                    p.alloc_id, p.device
                ))),
            };
        }
        let key = (backend, p.host_id.clone(), p.pid, p.alloc_id, device);
        let mut reg = lock(&self.imported);
        reg.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = reg.get(&key).and_then(Weak::upgrade) {
            return Ok(alias(existing));
        }
        let a = open()?;
        reg.insert(key, Arc::downgrade(&a));
        Ok(DeviceBuffer::new(a))
    }
}

/// Allocations this process exported and mappings it imported.
static REGISTRY: IpcRegistry = IpcRegistry::new();

/// Exports `buf`: a Device or Uncached allocation made by the device of `ctx`, or memory of that
/// device wrapped from a caller's pointer (see the module's doc).
pub fn export<R: Runtime>(ctx: &Arc<Context<R>>, buf: &DeviceBuffer) -> Result<IpcHandle> {
    let vendor = &R::VENDOR;
    if buf.allocation().as_any().is::<ExternalAllocation>() && buf.backend() == vendor.kind {
        return export_wrapped(ctx, buf.allocation().as_ref());
    }
    let a = gpu_allocation::<R>(buf)?;
    if a.is_pieces() {
        return Err(Error::invalid(format!(
            "a range of several mappings cannot be exported as one {} handle: {} names one \
             allocation of the plain allocator",
            vendor.ipc_mechanism, vendor.ipc_export_call
        )));
    }
    check_exportable(vendor, a, ctx.ordinal())?;
    a.ctx.bind()?;
    // SAFETY: the context is current; `a.ptr` is the base of a live device allocation.
    let handle = unsafe { ctx.runtime().ipc_get_handle(a.ptr) }?;
    REGISTRY.record_export(a.id, buf.allocation());
    Ok(IpcPayload::this_process(ctx.ordinal(), a.id, a.len, handle).to_handle(vendor))
}

/// Exports the runtime allocation that holds the wrapped memory `w`, with `w`'s place in it.
fn export_wrapped<R: Runtime>(ctx: &Arc<Context<R>>, w: &dyn Allocation) -> Result<IpcHandle> {
    let vendor = &R::VENDOR;
    check_exportable(vendor, w, ctx.ordinal())?;
    let (ptr, len) = (w.device_ptr().0, w.len());
    ctx.bind()?;
    let rt = ctx.runtime();
    // SAFETY: the context is current; the runtime only looks the address up.
    let (base, size) = unsafe { rt.mem_address_range(ptr) }.map_err(|e| {
        e.with_context(|| format!("finding the allocation behind wrapped memory at {ptr:#x}"))
    })?;
    let offset = ptr.wrapping_sub(base);
    if ptr < base || (size as u64).saturating_sub(offset) < len as u64 {
        // Several mappings back to back (a virtual-memory allocator's range) are one buffer to
        // a kernel, but no single handle names them.
        let spans = mscclpp_hal::mapped::mapped_extent(ptr, len, |p| {
            // SAFETY: the context is current; the runtime only looks the address up.
            Ok(unsafe { rt.mem_address_range(p) }.ok())
        });
        return Err(Error::invalid(match spans {
            Ok(Some(e)) => format!(
                "wrapped memory of {len} bytes at {ptr:#x} spans {} mappings (a virtual-memory \
                 allocator's range, such as PyTorch's expandable segments): {} names one \
                 allocation, so it cannot be shared with peers as one handle",
                e.mappings, vendor.ipc_export_call
            ),
            _ => format!(
                "wrapped memory of {len} bytes at {ptr:#x} is no longer inside one allocation \
                 ({size} bytes at {base:#x}): was it freed?"
            ),
        }));
    }
    // SAFETY: the context is current; `base` is the base of a live allocation, as just asked.
    let handle = unsafe { rt.ipc_get_handle(base) }.map_err(|e| {
        e.with_context(|| {
            format!(
                "exporting the {size}-byte allocation at {base:#x} behind wrapped memory at \
                 {ptr:#x} ({} gives handles only to memory of its plain allocator: memory \
                 mapped by the virtual memory calls, such as PyTorch's expandable segments, \
                 has none)",
                vendor.ipc_export_call
            )
        })
    })?;
    let (whole, id) = EXTERNAL_BASES.base(ctx, base, size, handle);
    REGISTRY.record_export(id, &whole);
    Ok(IpcPayload::this_process(ctx.ordinal(), id, size, handle)
        .view(offset, len as u64)
        .to_handle(vendor))
}

/// Keyed by backend, device, base address and the vendor handle: memory freed and allocated
/// again at the same address gets another handle, hence another record and id.
type BaseKey = (BackendKind, usize, u64, IpcBytes);
/// An allocation's record and its id.
type BaseRecord = (Arc<dyn Allocation>, u64);

/// The runtime allocations behind exported wrapped memory: a record per allocation
/// ([`Backing::External`], which frees nothing), with the id its handles carry. Records are
/// kept for the life of the process (an importer may map the allocation at any time while the
/// caller keeps it); one of a base address whose handle changed (freed and allocated again) is
/// replaced.
#[derive(Debug, Default)]
pub struct ExternalBases {
    bases: OnceLock<Mutex<HashMap<BaseKey, BaseRecord>>>,
}

impl ExternalBases {
    /// An empty table (for a `static`).
    pub const fn new() -> Self {
        ExternalBases {
            bases: OnceLock::new(),
        }
    }

    /// The record of the `size`-byte allocation at `base` whose vendor handle is `handle`, and
    /// its id.
    fn base<R: Runtime>(
        &self,
        ctx: &Arc<Context<R>>,
        base: u64,
        size: usize,
        handle: IpcBytes,
    ) -> BaseRecord {
        let mut m = self
            .bases
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (R::VENDOR.kind, ctx.ordinal(), base, handle);
        if let Some(found) = m.get(&key).filter(|(a, _)| a.len() == size) {
            return found.clone();
        }
        m.retain(|k, _| !(k.0 == key.0 && k.1 == key.1 && k.2 == key.2));
        let record = GpuAllocation::from_raw(
            ctx.clone(),
            base,
            size,
            MemoryKind::Device,
            Backing::External,
        );
        let id = record.id;
        let found: BaseRecord = (Arc::new(record), id);
        m.insert(key, found.clone());
        found
    }
}

/// Allocations behind the wrapped memory this process exported.
static EXTERNAL_BASES: ExternalBases = ExternalBases::new();

/// Maps memory exported by [`export`] in this process or another of the same host.
pub fn import<R: Runtime>(ctx: &Arc<Context<R>>, handle: &IpcHandle) -> Result<DeviceBuffer> {
    let vendor = &R::VENDOR;
    let p = IpcPayload::from_handle(vendor, handle)?;
    let whole = REGISTRY.import(
        (vendor.kind, vendor.ipc_what),
        &p,
        ctx.ordinal(),
        |o| DeviceBuffer::new(Arc::new(GpuAllocation::alias(ctx, o))),
        || open(ctx, &p),
    )?;
    if p.is_whole() {
        return Ok(whole);
    }
    Ok(DeviceBuffer::new(Arc::new(GpuAllocation::view(
        ctx,
        whole.allocation().clone(),
        p.offset as usize,
        p.len as usize,
    ))))
}

/// Opens another process's memory and checks that the mapping holds the bytes the handle
/// claims.
fn open<R: Runtime>(ctx: &Arc<Context<R>>, p: &IpcPayload) -> Result<Arc<dyn Allocation>> {
    ctx.bind()?;
    let rt = ctx.runtime();
    // SAFETY: the context is current; the handle is plain bytes the runtime validates itself.
    let ptr = unsafe { rt.ipc_open_handle(&p.handle) }.map_err(|e| Error::Remote {
        rank: usize::MAX,
        message: format!(
            "cannot map the memory exported by process {} (device {}, {} bytes): has it exited or freed it? {e}",
            p.pid, p.device, p.len
        ),
    })?;
    // Built before the check so that an error drops it, which closes the mapping.
    let a = GpuAllocation::from_raw(
        ctx.clone(),
        ptr,
        p.alloc_len as usize,
        MemoryKind::Device,
        Backing::Imported,
    );
    // SAFETY: the context is current; `ptr` is a live mapping.
    let (base, size) = unsafe { rt.mem_address_range(ptr) }?;
    let offset = ptr.wrapping_sub(base);
    if ptr < base || (size as u64).saturating_sub(offset) < p.alloc_len {
        return Err(Error::Remote {
            rank: usize::MAX,
            message: format!(
                "IPC handle claims {} bytes but the mapped allocation has {size} bytes at offset {offset}",
                p.alloc_len
            ),
        });
    }
    Ok(Arc::new(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_hal::DevicePtr;
    use proptest::prelude::*;

    const VENDOR: Vendor = crate::runtime::tests::TEST_VENDOR;

    fn sample() -> IpcPayload {
        IpcPayload {
            host_id: "host-a".into(),
            pid: 4242,
            device: 1,
            alloc_id: 7,
            len: 1 << 19,
            offset: 4096,
            alloc_len: 1 << 20,
            handle: [0xAB; IPC_HANDLE_SIZE],
        }
    }

    #[test]
    fn payload_round_trips_and_starts_with_the_magic() {
        let p = sample();
        let bytes = p.encode(&VENDOR);
        assert_eq!(&bytes[..4], &VENDOR.ipc_magic);
        assert_eq!(IpcPayload::decode(&VENDOR, &bytes).unwrap(), p);
    }

    #[test]
    fn payload_bytes_are_the_wire_layout_of_version_3() {
        let p = sample();
        let mut w = Writer::new(VENDOR.ipc_magic, 3);
        w.str(&p.host_id)
            .u32(p.pid)
            .u32(p.device)
            .u64(p.alloc_id)
            .u64(p.len)
            .u64(p.offset)
            .u64(p.alloc_len)
            .raw(&p.handle);
        assert_eq!(p.encode(&VENDOR), w.finish());
    }

    #[test]
    fn a_view_must_lie_inside_its_allocation() {
        let whole = IpcPayload::this_process(0, 1, 1 << 20, [0u8; IPC_HANDLE_SIZE]);
        assert!(whole.is_whole());
        let v = whole.clone().view(4096, (1 << 20) - 4096);
        assert!(!v.is_whole());
        assert_eq!(IpcPayload::decode(&VENDOR, &v.encode(&VENDOR)).unwrap(), v);
        let past = whole.view(4096, 1 << 20).encode(&VENDOR);
        let e = IpcPayload::decode(&VENDOR, &past).unwrap_err().to_string();
        assert!(e.contains("run past the 1048576-byte allocation"), "{e}");
    }

    #[test]
    fn payload_rejects_zero_length_oversize_pid_zero_and_other_magics() {
        let mut p = sample();
        p.len = 0;
        assert!(IpcPayload::decode(&VENDOR, &p.encode(&VENDOR)).is_err());
        p.len = (MAX_ALLOCATION as u64) + 1;
        let e = IpcPayload::decode(&VENDOR, &p.encode(&VENDOR)).unwrap_err();
        assert!(e.to_string().contains("exceeds"), "{e}");
        let mut p = sample();
        p.pid = 0;
        assert!(IpcPayload::decode(&VENDOR, &p.encode(&VENDOR)).is_err());
        let mut other = sample().encode(&VENDOR);
        other[..4].copy_from_slice(b"MSXX");
        let e = IpcPayload::decode(&VENDOR, &other).unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
    }

    #[test]
    fn outer_handle_must_agree_and_come_from_this_host() {
        let mut p = IpcPayload::this_process(0, 1, 64, [0u8; IPC_HANDLE_SIZE]);
        let mut h = p.to_handle(&VENDOR);
        assert_eq!(h.kind, IpcHandleKind::Memory);
        assert_eq!(IpcPayload::from_handle(&VENDOR, &h).unwrap(), p);
        h.len += 1;
        assert!(IpcPayload::from_handle(&VENDOR, &h).is_err());
        p.host_id.push_str("-elsewhere");
        let e = IpcPayload::from_handle(&VENDOR, &p.to_handle(&VENDOR)).unwrap_err();
        assert!(e.to_string().contains(VENDOR.ipc_mechanism), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = IpcPayload::decode(&VENDOR, &buf);
        }

        #[test]
        fn every_truncation_is_an_error(cut in 0usize..140) {
            let buf = sample().encode(&VENDOR);
            prop_assume!(cut < buf.len());
            prop_assert!(IpcPayload::decode(&VENDOR, &buf[..cut]).is_err());
        }

        #[test]
        fn mutated_payloads_never_panic(pos in 0usize..140, byte in any::<u8>()) {
            let mut buf = sample().encode(&VENDOR);
            if pos < buf.len() {
                buf[pos] = byte;
            }
            if let Ok(p) = IpcPayload::decode(&VENDOR, &buf) {
                prop_assert!(p.len > 0 && p.len <= MAX_ALLOCATION as u64 && p.pid != 0);
                prop_assert!(p.offset + p.len <= p.alloc_len);
            }
        }

        #[test]
        fn outer_handles_of_arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(h) = IpcHandle::from_bytes(&buf) {
                let _ = IpcPayload::decode(&VENDOR, &h.payload);
            }
        }
    }

    #[derive(Debug)]
    struct Fake {
        len: usize,
        kind: MemoryKind,
        imported: bool,
    }

    impl Allocation for Fake {
        fn backend(&self) -> BackendKind {
            BackendKind::Host
        }
        fn device_ordinal(&self) -> usize {
            0
        }
        fn device_ptr(&self) -> DevicePtr {
            DevicePtr(0x1000)
        }
        fn len(&self) -> usize {
            self.len
        }
        fn kind(&self) -> MemoryKind {
            self.kind
        }
        fn host_ptr(&self) -> Option<*mut u8> {
            None
        }
        fn is_imported(&self) -> bool {
            self.imported
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn fake(len: usize) -> Arc<dyn Allocation> {
        Arc::new(Fake {
            len,
            kind: MemoryKind::Device,
            imported: false,
        })
    }

    const WHO: (BackendKind, &str) = (BackendKind::Host, "test IPC handle");

    #[test]
    fn same_process_imports_alias_the_original_until_it_is_freed() {
        let reg = IpcRegistry::new();
        let a = fake(64);
        check_exportable(&VENDOR, a.as_ref(), 0).unwrap();
        reg.record_export(7, &a);
        let p = IpcPayload::this_process(0, 7, 64, [0u8; IPC_HANDLE_SIZE]);
        let never = || -> Result<Arc<dyn Allocation>> { panic!("opened in the exporting process") };
        let b = reg.import(WHO, &p, 0, DeviceBuffer::new, never).unwrap();
        assert!(Arc::ptr_eq(b.allocation(), &a));
        let mut wrong = p.clone();
        wrong.alloc_len = 32;
        let e = reg.import(WHO, &wrong, 0, DeviceBuffer::new, never);
        let e = e.unwrap_err().to_string();
        assert!(e.contains("claims an allocation of 32 bytes"), "{e}");
        drop((a, b));
        let e = reg.import(WHO, &p, 0, DeviceBuffer::new, never);
        assert!(e.unwrap_err().to_string().contains("stale IPC handle"));
    }

    #[test]
    fn other_process_mappings_are_opened_once_per_device() {
        let reg = IpcRegistry::new();
        let mut p = IpcPayload::this_process(0, 7, 64, [0u8; IPC_HANDLE_SIZE]);
        p.pid = p.pid.wrapping_add(1).max(1);
        let first = reg.import(WHO, &p, 0, DeviceBuffer::new, || Ok(fake(64)));
        let first = first.unwrap();
        let again = reg.import(WHO, &p, 0, DeviceBuffer::new, || panic!("opened twice"));
        assert!(Arc::ptr_eq(again.unwrap().allocation(), first.allocation()));
        let other = reg.import(WHO, &p, 1, DeviceBuffer::new, || Ok(fake(64)));
        assert!(!Arc::ptr_eq(
            other.unwrap().allocation(),
            first.allocation()
        ));
    }

    #[test]
    fn only_own_device_memory_is_exportable() {
        let mapped = Fake {
            len: 8,
            kind: MemoryKind::HostMapped,
            imported: false,
        };
        let e = check_exportable(&VENDOR, &mapped, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("over TEST IPC: testExport only exports device memory"),
            "{e}"
        );
        let imported = Fake {
            len: 8,
            kind: MemoryKind::Device,
            imported: true,
        };
        assert!(check_exportable(&VENDOR, &imported, 0).is_err());
        let e = check_exportable(&VENDOR, fake(8).as_ref(), 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("buffer of host device 0 exported through device 1")
        );
    }
}
