//! The payload of a GPU memory IPC handle, shared by the CUDA and ROCm backends: who exported
//! the memory (host, process, device, allocation id), how large it is, and the vendor's opaque
//! IPC handle bytes.
//!
//! Both backends encode the same fields through [`wire`](crate::wire); a backend's
//! [`IpcFormat`] holds what differs between them (the handle's size, magic, names in messages,
//! the order of two fields on the wire), so that each backend's bytes stay exactly as they were. Decoding is bounded and never panics on
//! garbage: a handle comes from another process.

use crate::caps::BackendKind;
use crate::error::{Error, Result};
use crate::ipc::{IpcHandle, IpcHandleKind};
use crate::memory::{Allocation, MemoryKind};
use crate::wire::{Reader, Writer};

/// A backend's memory payload: the type of its vendor IPC handle and its [`PayloadFormat`].
pub trait IpcFormat {
    /// The vendor's IPC handle, as bytes.
    type Handle: HandleBytes;
    /// The magic, names and field order of the backend's payloads.
    const FORMAT: PayloadFormat;
}

/// A vendor IPC handle carried as raw bytes (a byte array of the handle's size).
pub trait HandleBytes: Copy + std::fmt::Debug + Eq + Send + Sync + 'static {
    /// The handle's bytes.
    fn bytes(&self) -> &[u8];
    /// Reads a handle from `r`.
    fn read(r: &mut Reader<'_>) -> Result<Self>;
}

impl<const N: usize> HandleBytes for [u8; N] {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn read(r: &mut Reader<'_>) -> Result<Self> {
        r.array::<N>()
    }
}

/// Payload version.
pub const PAYLOAD_VERSION: u16 = 1;
/// Largest allocation a handle may describe (1 TiB): a bound on what a hostile handle claims.
pub const MAX_ALLOCATION: usize = 1 << 40;
/// Longest host id accepted in a handle.
pub const MAX_HOST_ID: usize = 256;

/// Where the length and the allocation id stand on the wire (each backend keeps its own order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOrder {
    /// Allocation id, then length.
    AllocIdThenLen,
    /// Length, then allocation id.
    LenThenAllocId,
}

/// What distinguishes one backend's memory payload from another's.
#[derive(Debug, Clone, Copy)]
pub struct PayloadFormat {
    /// The backend whose handles these are.
    pub backend: BackendKind,
    /// Payload magic.
    pub magic: [u8; 4],
    /// What a malformed payload is called in errors (`"cuda IPC handle"`).
    pub what: &'static str,
    /// The vendor's IPC mechanism in messages (`"CUDA IPC"`).
    pub mechanism: &'static str,
    /// The vendor call that exports memory, in messages (`"cuIpcGetMemHandle"`).
    pub export_call: &'static str,
    /// The order of the length and the allocation id.
    pub order: FieldOrder,
}

impl PayloadFormat {
    /// Checks that `a` may be exported through the device with ordinal `device`: memory this
    /// process allocated, not host-mapped, of that device.
    pub fn check_exportable(&self, a: &dyn Allocation, device: usize) -> Result<()> {
        if a.is_imported() {
            return Err(Error::invalid(
                "cannot export an imported mapping: export it from the process that allocated it",
            ));
        }
        if a.kind() == MemoryKind::HostMapped {
            return Err(Error::invalid(format!(
                "cannot export host-mapped memory over {}: {} only exports device memory \
                 (allocate MemoryKind::Device or Uncached)",
                self.mechanism, self.export_call
            )));
        }
        if a.device_ordinal() != device {
            return Err(Error::invalid(format!(
                "buffer of {} device {} exported through device {device}",
                self.backend,
                a.device_ordinal()
            )));
        }
        Ok(())
    }
}

/// The decoded payload of a memory IPC handle of the backend whose format is `F`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryIpcPayload<F: IpcFormat> {
    /// [`crate::env::host_id`] of the exporter.
    pub host_id: String,
    /// Process id of the exporter.
    pub pid: u32,
    /// Device ordinal of the exporter (in the exporter's numbering).
    pub device: u32,
    /// The exporter's process-unique allocation id.
    pub alloc_id: u64,
    /// Bytes of the allocation.
    pub len: u64,
    /// The vendor's IPC handle.
    pub handle: F::Handle,
}

impl<F: IpcFormat> MemoryIpcPayload<F> {
    /// The payload of an allocation this process exports now (this host, this process).
    pub fn this_process(device: usize, alloc_id: u64, len: usize, handle: F::Handle) -> Self {
        MemoryIpcPayload {
            host_id: crate::env::host_id(),
            pid: std::process::id(),
            device: device as u32,
            alloc_id,
            len: len as u64,
            handle,
        }
    }

    /// Encodes the payload.
    pub fn encode(&self) -> Vec<u8> {
        let fmt = &F::FORMAT;
        let mut w = Writer::new(fmt.magic, PAYLOAD_VERSION);
        w.str(&self.host_id).u32(self.pid).u32(self.device);
        match fmt.order {
            FieldOrder::AllocIdThenLen => w.u64(self.alloc_id).u64(self.len),
            FieldOrder::LenThenAllocId => w.u64(self.len).u64(self.alloc_id),
        };
        w.raw(self.handle.bytes());
        w.finish()
    }

    /// Decodes and validates a payload; never panics on garbage.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let fmt = &F::FORMAT;
        let what = fmt.what;
        let mut r = Reader::open(what, bytes, fmt.magic, PAYLOAD_VERSION, PAYLOAD_VERSION)?;
        let host_id = r.str("host id", MAX_HOST_ID)?.to_owned();
        let pid = r.u32()?;
        let device = r.u32()?;
        let (alloc_id, len) = match fmt.order {
            FieldOrder::AllocIdThenLen => {
                let alloc_id = r.u64()?;
                (alloc_id, r.usize_at_most("length", MAX_ALLOCATION)? as u64)
            }
            FieldOrder::LenThenAllocId => {
                let len = r.usize_at_most("length", MAX_ALLOCATION)? as u64;
                (r.u64()?, len)
            }
        };
        let handle = F::Handle::read(&mut r)?;
        r.finish()?;
        if len == 0 {
            return Err(Error::malformed(what, "zero length"));
        }
        if pid == 0 {
            return Err(Error::malformed(what, "process id 0"));
        }
        Ok(MemoryIpcPayload {
            host_id,
            pid,
            device,
            alloc_id,
            len,
            handle,
        })
    }

    /// The outer handle that carries this payload.
    pub fn to_handle(&self) -> IpcHandle {
        IpcHandle {
            backend: F::FORMAT.backend,
            kind: IpcHandleKind::Memory,
            len: self.len,
            payload: self.encode(),
        }
    }

    /// Decodes the payload of `handle` and checks it against the outer handle and this host.
    pub fn from_handle(handle: &IpcHandle) -> Result<Self> {
        let fmt = &F::FORMAT;
        let p = Self::decode(&handle.payload)?;
        if p.len != handle.len {
            return Err(Error::malformed(
                fmt.what,
                format!(
                    "outer length {} disagrees with the payload's {}",
                    handle.len, p.len
                ),
            ));
        }
        let here = crate::env::host_id();
        if p.host_id != here {
            return Err(Error::invalid(format!(
                "IPC handle was made on host {:?}, this is host {here:?}: {} works only within one host",
                p.host_id, fmt.mechanism
            )));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct A;
    impl IpcFormat for A {
        type Handle = [u8; 4];
        const FORMAT: PayloadFormat = PayloadFormat {
            backend: BackendKind::Cuda,
            magic: *b"TSTA",
            what: "test IPC handle",
            mechanism: "TEST IPC",
            export_call: "testExport",
            order: FieldOrder::AllocIdThenLen,
        };
    }
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct B;
    impl IpcFormat for B {
        type Handle = [u8; 4];
        const FORMAT: PayloadFormat = PayloadFormat {
            order: FieldOrder::LenThenAllocId,
            ..A::FORMAT
        };
    }

    fn sample<F: IpcFormat<Handle = [u8; 4]>>() -> MemoryIpcPayload<F> {
        MemoryIpcPayload {
            host_id: "h".into(),
            pid: 9,
            device: 2,
            alloc_id: 0x0102,
            len: 0x0304,
            handle: [1, 2, 3, 4],
        }
    }

    #[test]
    fn field_order_decides_the_bytes_and_both_round_trip() {
        let (a, b) = (sample::<A>().encode(), sample::<B>().encode());
        assert_ne!(a, b);
        assert_eq!(a.len(), b.len());
        assert_eq!(MemoryIpcPayload::<A>::decode(&a).unwrap(), sample());
        assert_eq!(MemoryIpcPayload::<B>::decode(&b).unwrap(), sample());
    }

    #[test]
    fn outer_handle_must_agree_and_come_from_this_host() {
        let mut p = MemoryIpcPayload::<A>::this_process(0, 1, 64, [0u8; 4]);
        let mut h = p.to_handle();
        assert_eq!(h.kind, IpcHandleKind::Memory);
        assert_eq!(MemoryIpcPayload::from_handle(&h).unwrap(), p);
        h.len += 1;
        assert!(MemoryIpcPayload::<A>::from_handle(&h).is_err());
        p.host_id.push_str("-elsewhere");
        let e = MemoryIpcPayload::<A>::from_handle(&p.to_handle()).unwrap_err();
        assert!(e.to_string().contains("TEST IPC"), "{e}");
    }
}
